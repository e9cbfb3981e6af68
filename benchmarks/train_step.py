"""Forward, backward and training step through the torch API: arc_warp against gsplat and Faster-GS.

Every library renders the same scene (:mod:`benchmarks.scene`, SH degree 3) through its
public torch function, with parameters stored as 3DGS training stores them (see
:mod:`benchmarks.peers` for each library's layout). Per N, size regime, camera count C
and library, medians after ``--warmup`` untimed steps:

- forward / backward / step: device time (CUDA events) of the render, of
  ``loss.backward()`` (L1 loss), and of render + loss + backward + optimizer step, each
  synchronised on its own; the step with ``torch.optim.Adam`` and with the library's own
  optimizer (arc_warp: ``SparseGaussianAdam``, dense and sparse over the rows in front of
  the camera; Faster-GS: its ``FusedAdam``);
- loop: ms per torch-Adam step over ``--reps`` steps back to back with one sync at the end,
  as a training loop that syncs only to log runs them;
- host ms: ``perf_counter`` around the forward and backward calls, read before any sync;
  for arc_warp also the part in arc_warp's code (its ``rasterization`` call and autograd
  backward) less its waits for the device, per synchronised step and per step of the loop;
- forward / backward with the host hidden (CUDA only): the calls queued behind a 5 ms spin
  kernel and timed from its end: the device time when the host has queued ahead (Faster-GS
  waits for the device inside its forward, so its figure holds host work after the waits);
- peak MiB: the step's peak device memory by phase (:mod:`benchmarks.memory`), CUDA only.

An optimizer table times one ``SparseGaussianAdam`` step (dense, and sparse with half the
rows visible) against ``torch.optim.Adam``, device and host ms. ``--check-peers`` renders a
small scene with every library and prints, against arc, the largest image difference and
each parameter gradient's cosine under one random cotangent: run it first after building a
peer. On the CPU (``--smoke``) the device columns are the host clock and the CUDA-only
columns are absent.
"""

from __future__ import annotations

import statistics

from benchmarks import memory, peers, results, timing
from benchmarks.scene import REGIMES, make_scene


def add_arguments(parser) -> None:
    parser.add_argument("--n", type=int, nargs="+", default=[300_000, 1_000_000])
    parser.add_argument("--regimes", nargs="+", choices=REGIMES, default=["small", "large"])
    parser.add_argument("--cameras", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--libs", nargs="+", choices=peers.LIBRARIES, default=["arc_fused", "gsplat", "fastergs"])
    parser.add_argument("--width", type=int, default=1920)
    parser.add_argument("--height", type=int, default=1080)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=16,
                        help="untimed steps first: compilation, calibration, first allocations")
    parser.add_argument("--no-optim", action="store_true", help="skip the optimizer table")
    parser.add_argument("--check-peers", action="store_true",
                        help="only compare every library with arc on a small scene (image, gradients)")


def _visible(params):
    """Rows in front of the camera: the benchmark's stand-in for radii > 0."""
    return params["means"].detach()[:, 2] > 0.01


def bench_library(lib, scene, viewmats, ks, target, device, reps: int, warmup: int) -> dict:
    """One library's row (module notes), less its memory."""
    import torch

    cuda = device.type == "cuda"
    clock = timing.Clock(device, "torch")
    params = lib.params(scene.raw, device)
    fwd, bwd, host, wait, arc_host = [], [], [], [], []
    for i in range(reps + warmup):
        peers.WAITS[0] = peers.ARC_HOST[0] = 0.0
        clock.sync()
        f = clock.time(lambda: lib.render(params, viewmats, ks))
        loss = (f.result - target).abs().mean()
        b = clock.time(loss.backward)
        for p in params.values():
            p.grad = None
        if i >= warmup:
            fwd.append(f.device_ms)
            bwd.append(b.device_ms)
            host.append(f.host_ms + b.host_ms)
            wait.append(peers.WAITS[0])
            arc_host.append(peers.ARC_HOST[0] - peers.WAITS[0])
    del f, loss
    med = statistics.median
    row = {"forward_ms": med(fwd), "backward_ms": med(bwd), "host_ms": med(host), "wait_ms": med(wait),
           "arc_host_ms": med(arc_host)}
    if cuda:
        hidden_fwd, hidden_bwd = [], []
        for i in range(reps + 3):
            f = timing.behind_spin(lambda: lib.render(params, viewmats, ks))
            b = timing.behind_spin((f.result - target).abs().mean().backward)
            for p in params.values():
                p.grad = None
            if i >= 3:
                hidden_fwd.append(f.device_ms)
                hidden_bwd.append(b.device_ms)
        del f
        row.update(forward_hidden_ms=med(hidden_fwd), backward_hidden_ms=med(hidden_bwd))
    for kind in lib.optimizers:
        opt = peers.optimizer(kind, params, device)

        def forward_backward():
            (lib.render(params, viewmats, ks) - target).abs().mean().backward()

        def optimizer_step(opt=opt, kind=kind):
            opt.step(_visible(params), scene.n) if kind == "sparse_adam" else opt.step()
            opt.zero_grad(set_to_none=True)

        def step():
            forward_backward()
            optimizer_step()

        for _ in range(2):
            step()
        times = []
        for _ in range(reps):
            clock.sync()
            times.append(clock.time(step).device_ms)
        row[f"step_{kind}_ms"] = med(times)
        if kind == "torch_adam":
            peers.WAITS[0] = peers.ARC_HOST[0] = 0.0
            clock.sync()
            loop = clock.time(lambda: [step() for _ in range(reps)])
            row["loop_ms"] = loop.device_ms / reps
            row["arc_host_loop_ms"] = (peers.ARC_HOST[0] - peers.WAITS[0]) / reps
            if cuda:
                row.update(memory.phase_peaks((forward_backward, optimizer_step), device, BEFORE[0]))
    return row


BEFORE = [(0, None)]  # what earlier runs left allocated: see memory.phase_peaks


def bench_optimizer(n: int, device, reps: int) -> dict:
    """``{kind: {device_ms, host_ms}}`` of one optimizer step over n Gaussians' parameters."""
    import torch

    clock = timing.Clock(device, "torch")
    raw = {"means": (n, 3), "quats": (n, 4), "log_scales": (n, 3), "logit_opacities": (n,), "sh": (n, 16, 3)}
    visible = torch.rand(n, device=device) < 0.5
    out = {}
    for kind in ("torch_adam", "fused_adam", "sparse_adam"):
        params = {k: torch.randn(s, device=device).requires_grad_(True) for k, s in raw.items()}
        opt = peers.optimizer(kind, params, device)
        samples = []
        for i in range(reps + 2):
            for p in params.values():
                p.grad = torch.ones_like(p)
            clock.sync()
            s = clock.time(lambda: opt.step(visible, n) if kind == "sparse_adam" else opt.step())
            if i >= 2:
                samples.append(s)
        out[kind] = {"device_ms": statistics.median(s.device_ms for s in samples),
                     "host_ms": statistics.median(s.host_ms for s in samples)}
    return out


def check_peers(libs: dict, scene, device) -> dict:
    """Each library against arc (module notes): ``{label: {max_abs_image_diff, cos_PARAM}}``."""
    import torch

    if not any(k.startswith("arc") for k in libs) or len(libs) < 2:
        print("# --check-peers needs arc and at least one peer available")
        return {}
    viewmats, ks = (torch.tensor(a, device=device) for a in (scene.viewmats, scene.Ks))
    cotangent = torch.rand(len(scene.viewmats), scene.height, scene.width, 3, device=device,
                           generator=torch.Generator(device).manual_seed(1))
    got = {}
    for name, lib in libs.items():
        params = lib.params(scene.raw, device)
        image = lib.render(params, viewmats, ks)
        (image * cotangent).sum().backward()
        grads = {k: v.grad for k, v in params.items()}
        if "sh_rest" in grads:  # Faster-GS's split layout back to the scene's
            grads["sh"] = torch.cat([grads["sh"], grads.pop("sh_rest")], 1)
        got[name] = image.detach(), {k: g.reshape(-1).double() for k, g in grads.items()}
    ref_name = next(k for k in got if k.startswith("arc"))
    ref_image, ref_grads = got.pop(ref_name)
    out = {}
    for name, (image, grads) in got.items():
        res = {"max_abs_image_diff": float((image - ref_image).abs().max())}
        for k, g in ref_grads.items():
            res[f"cos_{k}"] = float(torch.nn.functional.cosine_similarity(grads[k], g, dim=0))
        out[name] = res
        print(f"# {name} vs {ref_name}: " + ", ".join(f"{k} {v:.3g}" for k, v in res.items()))
    return out


def run(args) -> dict:
    import torch

    if args.smoke:
        args.n, args.cameras, args.width, args.height = [300], [1, 2], 64, 48
        args.regimes, args.reps, args.warmup = ["small"], 2, 1
    if args.check_peers:
        args.width, args.height = (64, 48) if args.smoke else (320, 240)
    cuda = not args.smoke and torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    libs, notes = peers.libraries(args.libs, args.width, args.height)
    peers.count_waits()
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    print(f"# torch API, {args.width}x{args.height}, SH 3, {name}; " + "; ".join(notes))
    if not cuda:
        notes.append("no CUDA device: device times are the host clock; host hidden and peak memory absent")
    result = {"device": name, "width": args.width, "height": args.height, "notes": notes, "rows": []}
    if args.check_peers:
        scene = make_scene(200 if args.smoke else 2000, "small", args.width, args.height, 2, seed=1)
        result["check"] = check_peers(libs, scene, device)
        return result
    for n in args.n:
        for regime in args.regimes:
            for c in args.cameras:
                scene = make_scene(n, regime, args.width, args.height, c)
                viewmats, ks = (torch.tensor(a, device=device) for a in (scene.viewmats, scene.Ks))
                target = torch.rand(c, args.height, args.width, 3, device=device,
                                    generator=torch.Generator(device).manual_seed(0))
                for label, lib in libs.items():
                    BEFORE[0] = (memory.torch_before(device, target),
                                 memory.warp_in_use(device) if cuda and label.startswith("arc") else None)
                    try:
                        row = bench_library(lib, scene, viewmats, ks, target, device, args.reps, args.warmup)
                    except Exception as e:  # noqa: BLE001 - a failing peer must not hide the others
                        if args.smoke or label.startswith("arc"):
                            raise
                        print(f"# {label} failed at N={n} {regime} C={c}: {type(e).__name__}: {e}")
                        continue
                    row.update(n=n, regime=regime, cameras=c, library=label)
                    result["rows"].append(row)
                    print(f"# {label} N={n} {regime} C={c}: fwd {row['forward_ms']:.3f} bwd {row['backward_ms']:.3f} "
                          f"step {row['step_torch_adam_ms']:.3f} ms", flush=True)
    if not args.no_optim:
        result["optimizer"] = {str(n): bench_optimizer(n, device, args.reps) for n in args.n}
    return result


def _peer(rows, r, prefix):
    """The row of the peer named ``prefix`` (unpacked gsplat first) in ``r``'s group."""
    group = [p for p in rows if (p["n"], p["regime"], p["cameras"]) == (r["n"], r["regime"], r["cameras"])
             and p["library"].startswith(prefix)]
    return min(group, key=lambda p: p["library"].endswith("packed"), default={})


def _own_step(r):
    return next((r[k] for k in ("step_sparse_adam_ms", "step_fused_adam_ms", "step_fastergs_adam_ms") if k in r),
                r.get("step_torch_adam_ms"))


def table(result: dict) -> str:
    if result.get("check"):
        keys = list(next(iter(result["check"].values())))
        return results.markdown(["library vs arc", *keys], [[name, *(f"{c[k]:.3g}" for k in keys)]
                                                            for name, c in result["check"].items()])
    rows, num, ratio, out = result["rows"], results.num, results.ratio, []
    for r in rows:
        g, f = _peer(rows, r, "gsplat"), _peer(rows, r, "fastergs")
        ours = r["library"].startswith("arc")
        out.append([results.count(r["n"]), r["regime"], str(r["cameras"]), r["library"], num(r["forward_ms"]),
                    num(r["backward_ms"]), num(r.get("step_torch_adam_ms")), num(_own_step(r)), num(r.get("loop_ms")),
                    num(r.get("host_ms")), num(r.get("arc_host_ms")) if ours else "-", num(r.get("peak_mib"), 0)]
                   + ([ratio(r["forward_ms"], g.get("forward_ms")), ratio(r["backward_ms"], g.get("backward_ms")),
                       ratio(r.get("step_torch_adam_ms"), g.get("step_torch_adam_ms")),
                       ratio(r.get("peak_mib"), g.get("peak_mib")),
                       ratio(r["forward_ms"], f.get("forward_ms")), ratio(r["backward_ms"], f.get("backward_ms")),
                       ratio(_own_step(r), _own_step(f) if f else None)] if ours else ["-"] * 7)
                   + [f"{num(r.get('forward_hidden_ms'))} / {num(r.get('backward_hidden_ms'))}"
                      if r.get("forward_hidden_ms") is not None else "-"])
    text = results.markdown(
        ["N", "regime", "C", "library", "fwd ms", "bwd ms", "step ms (torch Adam)", "step ms (own optimizer)",
         "loop ms/step", "host ms", "in arc_warp, less waits, ms", "peak MiB", "fwd ÷ gsplat", "bwd ÷ gsplat",
         "step ÷ gsplat", "peak ÷ gsplat", "fwd ÷ Faster-GS", "bwd ÷ Faster-GS", "own step ÷ Faster-GS",
         "fwd / bwd ms, host hidden"], out)
    if result.get("optimizer"):
        text += "\n\nOne optimizer step, device ms (host ms):\n\n" + results.markdown(
            ["N", "torch Adam", "SparseGaussianAdam dense", "sparse, 50% visible", "dense ÷ torch Adam"],
            [[results.count(int(n)), *(f"{num(o[k]['device_ms'])} ({num(o[k]['host_ms'])})"
                                       for k in ("torch_adam", "fused_adam", "sparse_adam")),
              ratio(o["fused_adam"]["device_ms"], o["torch_adam"]["device_ms"])]
             for n, o in result["optimizer"].items()])
    return text
