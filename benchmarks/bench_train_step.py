"""Forward, backward and training step through the torch API: arc_warp against its peers.

Every library renders the same random scene (Gaussians filling the frustum, SH degree 3)
through its public torch function, with parameters stored as in 3DGS training (raw
quaternions, log-scales, logit-opacities) and activations in torch. Per library, N, size
regime and camera count C it reports, as medians after warm-up:

- forward / backward / step: GPU time (CUDA events) of the render, of ``loss.backward()``
  and of render + L1 + backward + ``torch.optim.Adam`` (arc_warp also with its fused
  ``SparseGaussianAdam``, dense and sparse);
- host ms: ``time.perf_counter`` around the Python calls of the forward + backward,
  read BEFORE synchronising, i.e. what the CPU spends issuing the work;
- peak MiB: ``torch.cuda.max_memory_allocated`` plus Warp's stream-ordered pool
  high-water mark (``wp.get_mempool_used_mem_high``) over the library's runs.

Libraries are imported if available and skipped otherwise: ``arc`` (arc_warp_torch),
``gsplat`` and ``gsplat_packed`` (gsplat's ``rasterization``; its version is printed, so
1.5.3 and 1.6.0 are told apart by running the script in each environment) and
``fastergs`` (Faster-GS: add its adapter to ``_peer_renderers`` once its module is
built; until then it is reported as unavailable). An optimizer table times one fused
``SparseGaussianAdam`` step against ``torch.optim.Adam`` over the same parameters.

Regimes: ``small`` splats of 0.3-1.5 pixels (few pixels each) and ``large`` ones of 4-16
pixels at their depth.

Usage (GPU)::

    python benchmarks/bench_train_step.py --n 100000 300000 --regimes small large --cameras 1 4
    python benchmarks/bench_train_step.py --n 1000000 --libs arc gsplat --reps 10 --json out.json

Smoke test on the CPU (tiny scene, arc only, host-time table)::

    python benchmarks/bench_train_step.py --device cpu --tiny
"""

import argparse
import json
import sys
import time

import numpy as np
import torch

SH_DEGREE = 3
REGIMES = {"small": (0.3, 1.5), "large": (4.0, 16.0)}  # std-dev range in pixels at the depth
LRS = {"means": 1.6e-4, "quats": 1e-3, "log_scales": 5e-3, "logit_opacities": 5e-2, "sh": 2.5e-3}


def _logit(p):
    return np.log(p / (1.0 - p))


def make_scene(n, regime, width, height, cameras, seed=0):
    """float32 tensors of n Gaussians filling the frustum of camera 0, and C cameras (the
    first one at the origin looking down +z, the others turned by a few degrees)."""
    rng = np.random.default_rng(seed)
    f = 0.5 * width / np.tan(np.radians(30.0))
    z = rng.uniform(2.0, 12.0, n)
    u, v = rng.uniform(0, width, n), rng.uniform(0, height, n)
    means = np.stack([(u - width / 2) / f * z, (v - height / 2) / f * z, z], 1)
    lo, hi = REGIMES[regime]
    scales = np.exp(rng.uniform(np.log(lo), np.log(hi), (n, 3))) * z[:, None] / f
    sh = np.zeros((n, (SH_DEGREE + 1) ** 2, 3))
    sh[:, 0] = rng.uniform(-1.5, 1.5, (n, 3))
    sh[:, 1:] = rng.standard_normal((n, (SH_DEGREE + 1) ** 2 - 1, 3)) * 0.15
    raw = {"means": means, "quats": rng.standard_normal((n, 4)), "log_scales": np.log(scales),
           "logit_opacities": _logit(rng.uniform(0.05, 0.95, n)), "sh": sh}
    viewmats = np.repeat(np.eye(4)[None], cameras, 0)
    for c in range(1, cameras):
        a = np.radians(2.0 * c)
        viewmats[c, :3, :3] = [[np.cos(a), 0, np.sin(a)], [0, 1, 0], [-np.sin(a), 0, np.cos(a)]]
    ks = np.repeat(np.array([[f, 0, width / 2], [0, f, height / 2], [0, 0, 1]])[None], cameras, 0)
    f32 = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    return {k: f32(v) for k, v in raw.items()}, f32(viewmats), f32(ks)


def _renderers(libs, width, height):
    """{name: render(means, quats, scales, opacities, sh, viewmats, Ks) -> [C, H, W, 3]}."""
    out, notes = {}, []
    if "arc" in libs:
        from arc_warp_torch import RenderContext, rasterization

        contexts = {}

        def arc(means, *rest):
            dev = means.device
            if dev not in contexts:  # made once, outside the timed steps (calibrates here)
                contexts[dev] = RenderContext(dev)
            return rasterization(means, *rest[:-2], rest[-2], rest[-1], width, height,
                                 sh_degree=SH_DEGREE, context=contexts[dev])[0]

        out["arc"] = arc
    if {"gsplat", "gsplat_packed"} & set(libs):
        try:
            import gsplat

            for name, packed in (("gsplat", False), ("gsplat_packed", True)):
                if name in libs:
                    out[name] = lambda *a, packed=packed: gsplat.rasterization(
                        *a, width, height, sh_degree=SH_DEGREE, packed=packed,
                        rasterize_mode="classic")[0]
            notes.append(f"gsplat {gsplat.__version__}")
        except Exception as e:  # noqa: BLE001 - optional peer
            notes.append(f"gsplat unavailable ({type(e).__name__}: {e})")
    if "fastergs" in libs:
        peer, note = _peer_renderers(width, height)
        out.update(peer)
        notes.append(note)
    return out, notes


def _peer_renderers(width, height):
    """Faster-GS through its torch module, if it is importable and has an adapter here."""
    try:
        import FasterGSCudaBackend  # noqa: F401
    except Exception as e:  # noqa: BLE001 - optional peer
        return {}, f"Faster-GS unavailable ({type(e).__name__})"
    return {}, "Faster-GS importable but no adapter written yet: add one in _peer_renderers"


def _params(raw, device):
    return {k: v.to(device).clone().requires_grad_(True) for k, v in raw.items()}


def _activated(p):
    return (p["means"], torch.nn.functional.normalize(p["quats"], dim=-1), torch.exp(p["log_scales"]),
            torch.sigmoid(p["logit_opacities"]), p["sh"])


class Timer:
    """CUDA events on a GPU; on the CPU the wall time (which is then also the busy time)."""

    def __init__(self, cuda):
        self.cuda = cuda

    def __enter__(self):
        if self.cuda:
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.start.record()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.host_ms = (time.perf_counter() - self.t0) * 1e3  # before any sync
        if self.cuda:
            self.end.record()

    def device_ms(self):
        if not self.cuda:
            return self.host_ms
        self.end.synchronize()
        return self.start.elapsed_time(self.end)


def _optimizer(kind, params):
    groups = [{"params": [v], "lr": LRS[k]} for k, v in params.items()]
    if kind == "torch_adam":
        return torch.optim.Adam(groups, eps=1e-15)
    from arc_warp_torch import SparseGaussianAdam

    return SparseGaussianAdam(groups, lr=0.0, eps=1e-15, bias_correction=True)


def bench_library(render, raw, viewmats, ks, target, device, reps, optimizers):
    """Median forward / backward / step times, host time per forward + backward, peak MiB."""
    cuda = device.type == "cuda"
    params = _params(raw, device)
    fwd, bwd, host = [], [], []
    for i in range(reps + 2):
        with Timer(cuda) as tf:
            img = render(*_activated(params), viewmats, ks)
        loss = (img - target).abs().mean()
        with Timer(cuda) as tb:
            loss.backward()
        for p in params.values():
            p.grad = None
        if i >= 2:  # warm-up: compilation, calibration, first allocations
            fwd.append(tf.device_ms())
            bwd.append(tb.device_ms())
            host.append(tf.host_ms + tb.host_ms)
    row = {"forward_ms": float(np.median(fwd)), "backward_ms": float(np.median(bwd)),
           "host_ms": float(np.median(host))}
    for kind in optimizers:
        opt = _optimizer(kind, params)
        steps = []
        for i in range(reps + 2):
            with Timer(cuda) as ts:
                img = render(*_activated(params), viewmats, ks)
                loss = (img - target).abs().mean()
                loss.backward()
                if kind == "sparse_adam":
                    opt.step(_visible_guess(params), params["means"].shape[0])
                else:
                    opt.step()
                opt.zero_grad(set_to_none=True)
            if i >= 2:
                steps.append(ts.device_ms())
        row[f"step_{kind}_ms"] = float(np.median(steps))
    return row


def _visible_guess(params):
    """Rows in front of the camera (the benchmark's stand-in for radii > 0)."""
    return params["means"].detach()[:, 2] > 0.01


def bench_optimizer(n, device, reps):
    """One fused SparseGaussianAdam step (dense and sparse, half the rows visible) against
    torch.optim.Adam over the 3DGS parameters of n Gaussians, ms."""
    cuda = device.type == "cuda"
    raw = {"means": torch.randn(n, 3), "quats": torch.randn(n, 4), "log_scales": torch.randn(n, 3),
           "logit_opacities": torch.randn(n), "sh": torch.randn(n, 16, 3)}
    visible = torch.rand(n, device=device) < 0.5
    out = {}
    for kind in ("torch_adam", "fused_adam", "sparse_adam"):
        params = _params(raw, device)
        opt = _optimizer(kind, params)
        times = []
        for i in range(reps + 2):
            for p in params.values():
                p.grad = torch.ones_like(p)
            with Timer(cuda) as t:
                opt.step(visible, n) if kind == "sparse_adam" else opt.step()
            if i >= 2:
                times.append(t.device_ms())
        out[kind] = float(np.median(times))
    return out


def _peak_reset(device):
    if device.type != "cuda":
        return
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)


def _peak_mib(device, warp_before):
    if device.type != "cuda":
        return float("nan")
    import warp as wp

    torch_peak = torch.cuda.max_memory_allocated(device)
    warp_peak = wp.get_mempool_used_mem_high(wp.device_from_torch(device)) - warp_before
    return (torch_peak + max(warp_peak, 0)) / 2**20


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny scene and image (smoke test, any device)")
    ap.add_argument("--n", type=int, nargs="+", default=[100_000, 300_000, 1_000_000, 3_000_000])
    ap.add_argument("--regimes", nargs="+", choices=sorted(REGIMES), default=["small", "large"])
    ap.add_argument("--cameras", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--libs", nargs="+", default=["arc", "gsplat", "gsplat_packed", "fastergs"],
                    choices=["arc", "gsplat", "gsplat_packed", "fastergs"])
    ap.add_argument("--width", type=int, default=1920)
    ap.add_argument("--height", type=int, default=1080)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--no-optim", action="store_true", help="skip the optimizer table")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    import warp as wp

    wp.init()
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: use --device cpu --tiny for a smoke test", file=sys.stderr)
        return 2
    if args.tiny:
        args.n, args.width, args.height, args.reps = [min(args.n[0], 300)], 64, 48, min(args.reps, 5)
    import warp as wp

    wp.config.log_level = wp.LOG_WARNING if hasattr(wp, "LOG_WARNING") else wp.config.log_level
    renders, notes = _renderers(args.libs, args.width, args.height)
    print(f"# torch API, {args.width}x{args.height}, SH {SH_DEGREE}, device "
          f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}; " + "; ".join(notes))
    rows = []
    header = ("| N | regime | C | library | forward ms | backward ms | step (torch Adam) ms | "
              "step (fused) ms | step (sparse) ms | host ms fwd+bwd | peak MiB |")
    print(header + "\n|" + "---|" * 11)
    for n in args.n:
        for regime in args.regimes:
            for c in args.cameras:
                raw, viewmats, ks = make_scene(n, regime, args.width, args.height, c)
                viewmats, ks = viewmats.to(device), ks.to(device)
                target = torch.rand(c, args.height, args.width, 3, device=device,
                                    generator=torch.Generator(device).manual_seed(0))
                for name, render in renders.items():
                    opts = ["torch_adam"] + (["fused_adam", "sparse_adam"] if name == "arc" else [])
                    _peak_reset(device)
                    warp_before = wp.get_mempool_used_mem_current(wp.device_from_torch(device)) \
                        if device.type == "cuda" else 0
                    try:
                        row = bench_library(render, raw, viewmats, ks, target, device, args.reps, opts)
                    except Exception as e:  # noqa: BLE001 - report, go on with the others
                        print(f"| {n} | {regime} | {c} | {name} | failed: {type(e).__name__}: {e} |")
                        continue
                    row.update(n=n, regime=regime, cameras=c, library=name,
                               peak_mib=_peak_mib(device, warp_before))
                    rows.append(row)
                    cell = lambda k: f"{row[k]:.3f}" if k in row else "-"  # noqa: E731
                    print(f"| {n} | {regime} | {c} | {name} | {cell('forward_ms')} | {cell('backward_ms')} | "
                          f"{cell('step_torch_adam_ms')} | {cell('step_fused_adam_ms')} | "
                          f"{cell('step_sparse_adam_ms')} | {cell('host_ms')} | {row['peak_mib']:.0f} |",
                          flush=True)
    optim = {}
    if not args.no_optim and "arc" in args.libs:
        print("\n| N | torch Adam ms | fused Adam ms | sparse Adam (50 % visible) ms |\n|---|---|---|---|")
        for n in args.n:
            optim[n] = bench_optimizer(n, device, args.reps)
            o = optim[n]
            print(f"| {n} | {o['torch_adam']:.3f} | {o['fused_adam']:.3f} | {o['sparse_adam']:.3f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "optimizer": optim, "notes": notes, "args": vars(args)}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
