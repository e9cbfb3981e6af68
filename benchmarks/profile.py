"""Where a step's time goes, host against device: torch.profiler over a torch step or the mesh chain.

``--what step``: train_step's scene and one library (``--lib``), render + L1 +
``loss.backward()``; ``--what mesh``: the mesh benchmark's chain (100k-triangle sphere at
1024², the four ops) forward and backward in one reduce mode (``--mode``). After
``--warmup`` steps, ``--reps`` steps run under ``torch.profiler`` (CPU and CUDA
activities) and the rows list the ``--top`` device kernels by device µs per step (Warp's,
CUB's sorts, torch's) and the top host operations by CPU µs per step. A kernel that is
fast on the GPU does not help a user whose GPU waits for Python: compare the two lists.
On the CPU (``--smoke``) torch.profiler sees torch's operations only (Warp's CPU kernels
are not in its trace), so the kernel list is empty.
"""

from __future__ import annotations

from benchmarks import peers, results
from benchmarks.scene import REGIMES, make_scene


def add_arguments(parser) -> None:
    parser.add_argument("--what", choices=("step", "mesh"), default="step")
    parser.add_argument("--lib", choices=peers.LIBRARIES, default="arc_fused")
    parser.add_argument("--mode", choices=("atomic", "warp", "arc", "floor"), default="arc", help="mesh: reduce mode")
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--regime", choices=REGIMES, default="small")
    parser.add_argument("--width", type=int, default=1920)
    parser.add_argument("--height", type=int, default=1080)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--top", type=int, default=15)


def step_body(args, device):
    """``() -> None``: one forward + backward of ``args.lib`` on train_step's scene."""
    import torch

    libs, notes = peers.libraries([args.lib], args.width, args.height)
    if not libs:
        raise SystemExit(f"profile: {args.lib} is not available ({'; '.join(notes)})")
    lib = next(iter(libs.values()))
    scene = make_scene(args.n, args.regime, args.width, args.height)
    params = lib.params(scene.raw, device)
    viewmats, ks = (torch.tensor(a, device=device) for a in (scene.viewmats, scene.Ks))
    target = torch.rand(1, args.height, args.width, 3, device=device)

    def body():
        (lib.render(params, viewmats, ks) - target).abs().mean().backward()
        for p in params.values():
            p.grad = None

    return body


def mesh_body(args, device):
    """``() -> None``: the mesh chain's forward and backward in ``args.mode``."""
    import torch

    import arc_warp_torch.mesh as ours
    from benchmarks import mesh

    size, tex_size, tris = (48, 64, 500) if args.smoke else (1024, 2048, 100_000)
    pos, tri, uv = mesh.sphere(tris, device)
    pos.requires_grad_(True)
    tex = torch.rand(1, tex_size, tex_size, 3, device=device).requires_grad_(True)
    ctx, topo = ours.RasterizeCudaContext(), ours.antialias_construct_topology_hash(tri)

    def body():
        kw = {"reduce": args.mode}
        rast, db = ours.rasterize(ctx, pos, tri, (size, size), **kw)
        texc, texd = ours.interpolate(uv[None], rast, tri, rast_db=db, diff_attrs="all", **kw)
        color = ours.antialias(ours.texture(tex, texc, texd, filter_mode="linear-mipmap-linear", **kw), rast, pos, tri,
                               topology_hash=topo, **kw)
        color.sum().backward()
        pos.grad = tex.grad = None

    return body


def run(args) -> dict:
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    if args.smoke:
        args.n, args.width, args.height, args.warmup, args.reps = 300, 64, 48, 1, 2
    cuda = not args.smoke and torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    body = step_body(args, device) if args.what == "step" else mesh_body(args, device)
    for _ in range(args.warmup):
        body()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(args.reps):
            body()
        if cuda:
            torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        device_us = getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0))
        on_device = getattr(e, "device_type", None) == DeviceType.CUDA or (device_us > 0 and e.cpu_time_total == 0)
        kind = "kernel" if on_device else "host"
        us = device_us if on_device else e.cpu_time_total
        rows.append({"kind": kind, "name": e.key, "us_per_step": us / args.reps, "calls_per_step": e.count / args.reps})
    rows = [r for kind in ("kernel", "host") for r in sorted((r for r in rows if r["kind"] == kind),
                                                             key=lambda r: -r["us_per_step"])[:args.top]]
    what = f"{args.lib} step, N={args.n} {args.regime}" if args.what == "step" else f"mesh chain, {args.mode}"
    notes = [] if cuda else ["no CUDA device: torch.profiler sees torch's host operations only"]
    return {"device": torch.cuda.get_device_name() if cuda else "cpu", "what": what, "notes": notes, "rows": rows}


def table(result: dict) -> str:
    out = [[r["kind"], r["name"][:80].replace("|", "/"), results.num(r["us_per_step"], 1),
            results.num(r["calls_per_step"], 1)] for r in result["rows"]]
    return f"{result['what']}:\n\n" + results.markdown(["kind", "name", "µs per step", "calls per step"], out)
