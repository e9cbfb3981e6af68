"""The ARC primitive alone: parity of every mode, the calibrated thresholds, and a synthetic gradient kernel.

1. Parity: ``arc_warp.scatter_add`` in every mode against ``atomic`` and a float64 numpy
   sum, on five index patterns, and the probe kernel's modes against ``atomic``.
2. Calibration (CUDA only): ``arc_warp.calibrate``'s thresholds for this GPU (the uniform
   one and the keyed one) and the worst ratio of each candidate.
3. Timing: the probe, a synthetic gradient-accumulation kernel written here on the public
   accumulator API: blocks of 256 threads each walk a list of targets (consecutive blocks
   overlapping), and each active lane computes K=9 3DGS-like gradients of its target and
   adds them in the chosen mode, planning first (``arc_warp.warp_plan``: an atomic warp
   computes inside the branch that adds; a reducing warp computes in every lane).
   ``floor`` adds nothing. Lanes are active with probability p. Once with the
   uniform-index promise the rasteriser makes, once on the general path. The modes are
   interleaved in every repetition; CUDA events on Warp's stream, medians.

On the CPU (``--smoke``) the sizes are tiny, calibration is skipped (it measures a GPU),
and the host clock times the probe.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import warp as wp

from benchmarks import results, timing

MODES = ("atomic", "warp", "serial", "arc", "floor")
K = 9
VecK = wp.types.vector(K, wp.float32)
BLOCK = 256
DENSITIES = (1.0, 0.6, 0.25, 0.08, 1 / 32)


def add_arguments(parser) -> None:
    parser.add_argument("--blocks", type=int, default=8192, help="blocks of 256 threads")
    parser.add_argument("--targets-per-block", type=int, default=64)
    parser.add_argument("--targets", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--warmup", type=int, default=3)


@wp.func
def probe_gradient(q: VecK, px: float, py: float) -> VecK:
    """The K=9 gradients of one (pixel, splat) pair; ``q`` = mean2d (2), conic (3), opacity, rgb."""
    dx = q[0] - px
    dy = q[1] - py
    power = 0.5 * (q[2] * dx * dx + q[4] * dy * dy) + q[3] * dx * dy
    g = wp.exp(-power)
    alpha = wp.min(0.99, q[5] * g)
    t = 1.0 - alpha
    v_alpha = (q[6] + q[7] + q[8]) * t - 0.5
    v_power = -q[5] * g * v_alpha
    return VecK(v_power * (q[2] * dx + q[3] * dy), v_power * (q[3] * dx + q[4] * dy), 0.5 * v_power * dx * dx,
                v_power * dx * dy, 0.5 * v_power * dy * dy, g * v_alpha, alpha * t * q[6], alpha * t * q[7],
                alpha * t * q[8])


@functools.cache
def probe_kernel(mode: str, uniform_index: bool):
    """The probe of the module notes for one mode (cached)."""
    import arc_warp

    plan = arc_warp.warp_plan(mode)
    reduce = arc_warp.warp_reducer(VecK, mode, uniform_index)
    lane_add = arc_warp.accumulator(VecK, "floor" if mode == "floor" else "atomic")

    def probe(params: wp.array(dtype=VecK), dest: wp.array(dtype=VecK), targets_per_block: int, p_active: float,
              seed: int, threshold: int):
        tid = wp.tid()
        rng = wp.rand_init(seed, tid)
        n = dest.shape[0]
        first = ((tid // BLOCK) * (targets_per_block // 2)) % n
        for j in range(targets_per_block):
            target = first + j
            if target >= n:  # a compare, not a division: cheaper than a sparse warp's work
                target -= n
            u = wp.randf(rng)
            px = 16.0 * wp.randf(rng)
            active = u < p_active
            if plan(active, threshold):
                reduce(dest, target, probe_gradient(params[target], px, 16.0 * u), active, threshold)
            elif active:
                lane_add(dest, target, probe_gradient(params[target], px, 16.0 * u), True, threshold)

    return wp.kernel(probe, enable_backward=False, module="unique")


def probe_params(n: int, device) -> wp.array:
    """Per-target parameters: means in a 16x16 tile, valid conics, opacities, colours."""
    rng = np.random.default_rng(0)
    q = np.empty((n, K), np.float32)
    q[:, 0:2] = rng.uniform(0.0, 16.0, (n, 2))
    q[:, 2] = rng.uniform(0.05, 0.5, n)
    q[:, 3] = rng.uniform(-0.02, 0.02, n)
    q[:, 4] = rng.uniform(0.05, 0.5, n)
    q[:, 5] = rng.uniform(0.1, 0.99, n)
    q[:, 6:9] = rng.uniform(0.0, 1.0, (n, 3))
    return wp.array(q, dtype=VecK, device=device)


def launch_probe(mode, params, dest, blocks, targets_per_block, p, threshold, uniform_index, seed=1):
    wp.launch(probe_kernel(mode, uniform_index), dim=blocks * BLOCK,
              inputs=[params, dest, targets_per_block, p, seed, threshold], device=dest.device, block_dim=BLOCK)


def parity(device, threshold: int, n: int, m: int) -> list[dict]:
    """Largest relative difference of each mode to ``atomic`` and to float64 numpy."""
    import arc_warp

    rng = np.random.default_rng(0)
    patterns = {"all_same": np.full(n, 17), "all_distinct": np.arange(n) % m,
                "mixed_groups": rng.integers(0, 4, n) * 3 + (np.arange(n) // 32) % 7,
                "sorted_runs": np.sort(rng.integers(0, m, n)), "random": rng.integers(0, m, n)}
    rows = []
    for name, idx in patterns.items():
        vals = rng.standard_normal((n, 3)).astype(np.float32)
        ref = np.zeros((m, 3))
        np.add.at(ref, idx, vals.astype(np.float64))
        idx_w, vals_w = wp.array(idx.astype(np.int32), device=device), wp.array(vals, dtype=wp.vec3, device=device)
        outs = {}
        for mode in MODES[:-1] + ("deterministic",):
            dest = wp.zeros(m, dtype=wp.vec3, device=device)
            arc_warp.scatter_add(dest, idx_w, vals_w, mode=mode)
            outs[mode] = dest.numpy().astype(np.float64)
        scale = np.abs(ref).max()
        rows += [{"case": f"scatter/{name}", "mode": mode,
                  "vs_atomic": float(np.abs(out - outs["atomic"]).max() / scale),
                  "vs_float64": float(np.abs(out - ref).max() / scale)} for mode, out in outs.items()]
    params = probe_params(1000, device)
    for p, uniform in itertools.product((1.0, 0.25, 1 / 32), (True, False)):
        outs = {}
        for mode in MODES[:-1]:
            dest = wp.zeros(1000, dtype=VecK, device=device)
            launch_probe(mode, params, dest, 64, 32, p, threshold, uniform, seed=3)
            outs[mode] = dest.numpy().astype(np.float64)
        scale = np.abs(outs["atomic"]).max()
        rows += [{"case": f"probe/p={p:.3g}{'/uniform' if uniform else ''}", "mode": mode,
                  "vs_atomic": float(np.abs(out - outs["atomic"]).max() / scale)} for mode, out in outs.items()]
    return rows


def run(args) -> dict:
    import arc_warp

    device = wp.get_device("cpu" if args.smoke or not wp.is_cuda_available() else "cuda")
    if args.smoke:
        args.blocks, args.targets_per_block, args.targets, args.reps, args.warmup = 4, 8, [1000], 2, 1
    notes, calibration = [], None
    if device.is_cuda:
        cal = arc_warp.calibrate(device)
        calibration = {"threshold": cal.threshold, "keyed_threshold": cal.keyed_threshold,
                       "worst_ratio": {str(t): cal.worst_ratio(t) for t in cal.candidates},
                       "keyed_worst_ratio": {str(t): cal.keyed_worst_ratio(t) for t in cal.keyed_candidates}}
    else:
        notes.append("no CUDA device: calibration skipped (it measures a GPU), the host clock times the probe")
        print(f"# {notes[-1]}")
    threshold = arc_warp.resolve_threshold(device)
    checks = parity(device, threshold, 1 << (12 if args.smoke else 18), 500 if args.smoke else 5000)
    worst = max(c["vs_atomic"] for c in checks)
    print(f"# parity: worst relative difference to atomic over {len(checks)} checks {worst:.2e}")
    # float32 round-off of up to 2^18 terms per target stays well inside 1e-4 relative
    if worst >= 1e-4 or any(c.get("vs_float64", 0.0) >= 1e-4 for c in checks):
        raise RuntimeError("arc_micro: a mode disagrees with atomic or float64 beyond round-off: "
                           + str([c for c in checks if c["vs_atomic"] >= 1e-4 or c.get("vs_float64", 0) >= 1e-4]))
    clock, rows = timing.Clock(device, "warp"), []
    for uniform, n, p in itertools.product((True, False), args.targets, DENSITIES):
        dest, params = wp.zeros(n, dtype=VecK, device=device), probe_params(n, device)
        fns = {mode: functools.partial(launch_probe, mode, params, dest, args.blocks, args.targets_per_block, p,
                                       threshold, uniform) for mode in MODES}
        times = timing.medians(clock, fns, args.warmup, args.reps)
        rows.append({"path": "uniform" if uniform else "general", "targets": n, "p": p,
                     **{mode: t["device_ms"] for mode, t in times.items()}})
    return {"device": device.name if device.is_cuda else "cpu", "threshold": threshold, "calibration": calibration,
            "parity": checks, "blocks": args.blocks, "targets_per_block": args.targets_per_block, "notes": notes,
            "rows": rows}


def table(result: dict) -> str:
    num, ratio = results.num, results.ratio
    out = [[r["path"], results.count(r["targets"]), f"{r['p']:.3g}", *(num(r[m], 4) for m in MODES),
            ratio(r["arc"], r["atomic"]), ratio(r["arc"], min(r["atomic"], r["warp"])), ratio(r["arc"], r["floor"])]
           for r in result["rows"]]
    text = results.markdown(["path", "targets", "p", *(f"{m} ms" for m in MODES), "arc ÷ atomic",
                             "arc ÷ best(atomic, warp)", "arc ÷ floor"], out)
    cal = result.get("calibration")
    if cal:
        keyed = f"; keyed T = {cal['keyed_threshold']}" if cal.get("keyed_threshold") else ""
        text += (f"\n\nCalibrated T = {cal['threshold']} (worst best(atomic, warp) ÷ arc over the densities: "
                 f"{cal['worst_ratio'][str(cal['threshold'])]:.3f}){keyed}.")
    checks = result.get("parity")
    if checks:
        worst = max(c["vs_atomic"] for c in checks)
        text += f"\n\nParity: every mode within {worst:.1e} (relative) of `atomic` over {len(checks)} checks."
    return text
