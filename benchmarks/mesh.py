"""The mesh ops (rasterize, interpolate, texture, antialias) per reduce mode, against nvdiffrast 0.4.

Workloads, each through the torch drop-in ``arc_warp_torch.mesh`` so that
``nvdiffrast.torch`` runs on the very same tensors:

- ``tex_mag`` / ``tex_min``: texture, 2048² output, 1024² RGBA texture,
  linear-mipmap-linear, magnified 4x (4 pixels per texel) / minified 4.5x;
- ``interp``: interpolate, a 1M-triangle screen-filling grid at 2048², 8 attributes;
- ``raster``: rasterize, the same 1M triangles at 2048² (backward into positions);
- ``chain``: a 100k-triangle sphere at 1024²: rasterize, interpolate with derivatives,
  texture (2048², mipmapped), antialias.

Backward modes ``atomic``, ``warp``, ``arc`` and ``floor`` (no gradient accumulation),
and nvdiffrast when ``import nvdiffrast.torch`` works. Each forward and backward is timed
twice, every variant interleaved in each repetition: as a user's call on an idle device
(CUDA events around it, its host work included), and as device time (queued behind a spin
kernel and timed from the spin's end, :func:`benchmarks.timing.behind_spin`, CUDA only).
Agreement with nvdiffrast: the largest image difference and each gradient's cosine; for
``raster`` and ``chain`` also the cosine with the upstream gradient zero where our
rasterize clamps u, v (:func:`clamp_mask`: nvdiffrast's backward ignores that clamp, ours
differentiates it). On the CPU (``--smoke``) the sizes are tiny and the host clock times
the calls.
"""

from __future__ import annotations

import math

from benchmarks import peers, results, timing

MODES = ("atomic", "warp", "arc", "floor")
WORKLOADS = ("tex_mag", "tex_min", "interp", "raster", "chain")


def add_arguments(parser) -> None:
    parser.add_argument("--only", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)


def cosine(a, b) -> float:
    """Cosine similarity of two gradients; 1 where both are zero (they agree)."""
    a, b = a.reshape(-1).double(), b.reshape(-1).double()
    if not (a.any() or b.any()):
        return 1.0
    return float(a @ b / (a.norm() * b.norm() + 1e-30))


def clamp_mask(rast, spread: bool = False):
    """(mask, covered) [B, H, W] bool of our ``rast``: ``mask`` is where rasterize's clamp of
    (u, v) to the triangle acts (snapped coverage put the pixel centre outside the exact
    triangle), so its backward differs from nvdiffrast's. The clamp leaves (u, v) on the
    triangle's border (u = 0, v = 0, or u + v = 1 to float32 rounding), so a border 1e-6
    wide takes them, and the rare unclamped centres that close to an edge (the same
    derivative in both libraries). ``spread``: also the pixels' 4-neighbours, whose
    upstream gradient antialias passes to a pixel's colour."""
    import torch

    u, v = rast[..., 0].double(), rast[..., 1].double()
    covered = rast[..., 3] > 0
    mask = covered & ((u <= 1e-6) | (v <= 1e-6) | (u + v >= 1 - 1e-6))
    if spread:
        p = torch.nn.functional.pad(mask, (1, 1, 1, 1))
        mask = mask | p[:, :-2, 1:-1] | p[:, 2:, 1:-1] | p[:, 1:-1, :-2] | p[:, 1:-1, 2:]
    return mask, covered


def grid_mesh(n_tri: int, device):
    """A screen-filling, gently perspective grid of about ``n_tri`` triangles: pos [1, V, 4], tri [F, 3]."""
    import torch

    n = max(2, int(math.sqrt(n_tri / 2)))
    xs = torch.linspace(-1.05, 1.05, n + 1, device=device)
    y, x = torch.meshgrid(xs, xs, indexing="ij")
    w = 1.0 + 0.2 * (x + 1.05)
    pos = torch.stack([x * w, y * w, 0.3 * w * torch.sin(3 * x) * torch.cos(2 * y), w], -1).reshape(1, -1, 4)
    idx = torch.arange((n + 1) * (n + 1), device=device, dtype=torch.int32).reshape(n + 1, n + 1)
    a, b, c, d = idx[:-1, :-1], idx[:-1, 1:], idx[1:, 1:], idx[1:, :-1]
    tri = torch.cat([torch.stack([a, b, c], -1).reshape(-1, 3), torch.stack([a, c, d], -1).reshape(-1, 3)])
    return pos.contiguous(), tri.contiguous()


def sphere(n_tri: int, device):
    """A UV sphere of about ``n_tri`` triangles in clip space: pos [1, V, 4], tri [F, 3], uv [V, 2]."""
    import torch

    import arc_warp.mesh

    rings = max(3, int(math.sqrt(n_tri / 4)))
    v, uv, f = arc_warp.mesh.uv_sphere(rings, 2 * rings)
    v = torch.from_numpy(v).to(device)
    pos = torch.cat([v[:, :2] * 2.2, 0.5 * v[:, 2:3], 2.6 + v[:, 2:3]], 1)[None].contiguous()
    return pos, torch.from_numpy(f).to(device), torch.from_numpy(uv).to(device)


class Runner:
    """Times and compares the variants of one workload (module notes)."""

    def __init__(self, device, nvdr, reps: int, warmup: int):
        import arc_warp_torch.mesh

        self.ours, self.nvdr, self.device = arc_warp_torch.mesh, nvdr, device
        self.reps, self.warmup = reps, warmup
        self.clock = timing.Clock(device, "torch")

    def libs(self):
        return [(f"arc_warp {m}", self.ours, m) for m in MODES] + ([("nvdiffrast", self.nvdr, None)]
                                                                   if self.nvdr is not None else [])

    def run(self, name: str, make, inputs, mask=None) -> list[dict]:
        """Rows for ``make(lib, reduce) -> output`` of each variant; ``inputs``: the tensors
        whose gradients are compared; ``mask``: None, or ``() -> (mask, covered)``
        (:func:`clamp_mask`) for the cosine off the clamp's pixels."""
        import torch

        fwds, bwds, rows, upstream, ref = {}, {}, {}, None, None
        for label, lib, mode in self.libs():
            fwds[label] = fwd = (lambda lib=lib, mode=mode: make(lib, mode))
            out = fwd()
            if upstream is None:
                g = torch.randn_like(out)
                upstream = {"grad_cosine": g}
                if mask is not None:
                    with torch.no_grad():
                        m, covered = mask()
                    upstream["grad_cosine_unclamped"] = g * ~m[..., None]
            grads = {k: torch.autograd.grad(out, inputs, gk, retain_graph=True, allow_unused=True)
                     for k, gk in upstream.items()}
            bwds[label] = lambda out=out, g=upstream["grad_cosine"]: torch.autograd.grad(
                out, inputs, g, retain_graph=True, allow_unused=True)
            rows[label] = {"workload": name, "variant": label}
            if mode == "arc":
                ref = (out.detach(), grads)
            if label == "nvdiffrast" and ref is not None:
                rows[label]["max_abs_image_diff"] = float((out.detach() - ref[0]).abs().max())
                for k in grads:
                    rows[label][k] = min(cosine(a, b) for a, b in zip(ref[1][k], grads[k])
                                         if a is not None and b is not None)
        timed = {}
        with torch.no_grad():
            timed["forward"] = timing.medians(self.clock, fwds, self.warmup, self.reps)
            if self.clock.has_events:
                timed["forward_device"] = timing.medians(self.clock, fwds, self.warmup, self.reps, hidden=True)
        timed["backward"] = timing.medians(self.clock, bwds, self.warmup, self.reps)
        if self.clock.has_events:
            timed["backward_device"] = timing.medians(self.clock, bwds, self.warmup, self.reps, hidden=True)
        for label, row in rows.items():
            for what, t in timed.items():
                row[f"{what}_ms"] = t[label]["device_ms"]
            print(f"# {name} {label}: fwd {row['forward_ms']:.3f} bwd {row['backward_ms']:.3f} ms", flush=True)
        return list(rows.values())


def texture_case(runner, name, minify, size, tex_size):
    import torch

    dev = runner.device
    scale = (minify if minify else 0.25) * size / tex_size  # uv span of the image, in texture widths
    y, x = torch.meshgrid(torch.arange(size, device=dev), torch.arange(size, device=dev), indexing="ij")
    angle = 0.3  # rotated, so neighbouring pixels do not share texel rows exactly
    u = ((x + 0.5) * math.cos(angle) - (y + 0.5) * math.sin(angle)) / size * scale
    v = ((x + 0.5) * math.sin(angle) + (y + 0.5) * math.cos(angle)) / size * scale
    uv = torch.stack([u, v], -1)[None].float().contiguous().requires_grad_(True)
    d = scale / size
    uv_da = torch.tensor([d * math.cos(angle), -d * math.sin(angle), d * math.sin(angle), d * math.cos(angle)],
                         device=dev).expand(1, size, size, 4).contiguous().requires_grad_(True)
    tex = torch.rand(1, tex_size, tex_size, 4, device=dev).requires_grad_(True)
    return runner.run(name, lambda lib, mode: lib.texture(tex, uv, uv_da, filter_mode="linear-mipmap-linear",
                                                          **({"reduce": mode} if mode else {})), (tex, uv, uv_da))


def grid_cases(runner, size, n_tri, which):
    import torch

    pos, tri = grid_mesh(n_tri, runner.device)
    pos.requires_grad_(True)
    ctx = {id(lib): lib.RasterizeCudaContext() for _, lib, _ in runner.libs()}
    rows = []

    def rasterize(lib, mode):
        return lib.rasterize(ctx[id(lib)], pos, tri, (size, size), grad_db=False,
                             **({"reduce": mode} if mode else {}))[0]

    if "raster" in which:
        rows += runner.run("raster", rasterize, (pos,), mask=lambda: clamp_mask(rasterize(runner.ours, None)))
    if "interp" in which:
        with torch.no_grad():
            rast = rasterize(runner.ours, None).requires_grad_(True)
        attr = torch.rand(1, pos.shape[1], 8, device=runner.device).requires_grad_(True)
        rows += runner.run("interp", lambda lib, mode: lib.interpolate(attr, rast, tri, **(
            {"reduce": mode} if mode else {}))[0], (attr, rast))
    return rows


def chain_case(runner, size, n_tri, tex_size):
    """The fit demo's four ops: rasterize, interpolate uv with derivatives, mipmapped texture, antialias."""
    import torch

    pos, tri, uv = sphere(n_tri, runner.device)
    pos.requires_grad_(True)
    tex = torch.rand(1, tex_size, tex_size, 3, device=runner.device).requires_grad_(True)
    state = {id(lib): (lib.RasterizeCudaContext(), lib.antialias_construct_topology_hash(tri))
             for _, lib, _ in runner.libs()}

    def chain(lib, mode):
        kw = {"reduce": mode} if mode else {}
        ctx, topo = state[id(lib)]
        rast, db = lib.rasterize(ctx, pos, tri, (size, size), **kw)
        texc, texd = lib.interpolate(uv[None], rast, tri, rast_db=db, diff_attrs="all", **kw)
        color = lib.texture(tex, texc, texd, filter_mode="linear-mipmap-linear", **kw)
        return lib.antialias(color, rast, pos, tri, topology_hash=topo, **kw)

    # spread: antialias passes the gradient of a pixel's 4-neighbours to its colour
    return runner.run("chain", chain, (pos, tex), mask=lambda: clamp_mask(
        runner.ours.rasterize(state[id(runner.ours)][0], pos, tri, (size, size))[0], spread=True))


def run(args) -> dict:
    import torch

    cuda = not args.smoke and torch.cuda.is_available()
    if args.smoke:
        out, tex, tris, chain_out, chain_tris, chain_tex, args.reps, args.warmup = 64, 32, 2000, 48, 500, 64, 2, 1
    else:
        out, tex, tris, chain_out, chain_tris, chain_tex = 2048, 1024, 1_000_000, 1024, 100_000, 2048
    nvdr, note = peers.optional("nvdiffrast.torch")
    runner = Runner("cuda" if cuda else "cpu", nvdr, args.reps, args.warmup)
    rows = []
    if "tex_mag" in args.only:
        rows += texture_case(runner, "tex_mag", 0, out, tex)
    if "tex_min" in args.only:
        rows += texture_case(runner, "tex_min", 4.5, out, tex)
    if {"interp", "raster"} & set(args.only):
        rows += grid_cases(runner, out, tris, args.only)
    if "chain" in args.only:
        rows += chain_case(runner, chain_out, chain_tris, chain_tex)
    notes = [note] + ([] if cuda else ["no CUDA device: times are the host clock's; no device-time columns"])
    return {"device": torch.cuda.get_device_name() if cuda else "cpu", "notes": notes, "rows": rows}


def table(result: dict) -> str:
    rows, num, ratio, out = result["rows"], results.num, results.ratio, []
    for r in rows:
        peer = next((p for p in rows if p["workload"] == r["workload"] and p["variant"] == "nvdiffrast"), {})
        ours = r["variant"] != "nvdiffrast"
        cos = " / ".join(num(r[k], 5) for k in ("grad_cosine", "grad_cosine_unclamped") if r.get(k) is not None)
        out.append([r["workload"], r["variant"], *(num(r.get(f"{k}_ms")) for k in ("forward", "backward",
                                                                                 "forward_device", "backward_device")),
                    *(ratio(r.get(f"{k}_ms"), peer.get(f"{k}_ms")) if ours else "-"
                      for k in ("forward_device", "backward_device", "backward")), cos or "-"])
    return results.markdown(["workload", "variant", "fwd ms (call)", "bwd ms (call)", "fwd ms (device)",
                             "bwd ms (device)", "fwd device ÷ nvdiffrast", "bwd device ÷ nvdiffrast",
                             "bwd call ÷ nvdiffrast", "gradient cosine to arc (off the clamp)"], out)
