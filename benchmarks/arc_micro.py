"""ARC micro-benchmark and GPU parity check (needs a CUDA GPU).

1. Parity: every reduce mode against ``atomic`` and a float64 numpy reference, on
   scatter_add index patterns and on the probe kernel.
2. Calibration: prints the thresholds measured for this GPU (the uniform one and the
   keyed one) and their timing tables.
3. Timing: the synthetic gradient-accumulation kernel (blocks of 256 threads walking
   a list of targets, K=9 values per (lane, target)) for every mode and the floor
   (no atomics), over active-lane fractions p and target counts, once with the
   uniform-index promise the rasteriser makes and once on the general path. CUDA
   events, median of repetitions after warm-up, the modes interleaved within each
   repetition.

Usage::

    python benchmarks/arc_micro.py [--json results.json]
"""

import argparse
import itertools
import json
import sys

import numpy as np
import warp as wp

import arc_warp
from arc_warp._src.arc.probe import VecK, launch_probe, make_params
from arc_warp._src.arc.timing import median_times_ms

MODES = ("atomic", "warp", "serial", "arc", "floor")


def parity(device) -> list[dict]:
    """Largest relative error of each mode against atomic and against float64 numpy."""
    rng = np.random.default_rng(0)
    rows = []
    m = 5000
    n = 1 << 18
    patterns = {
        "all_same": np.full(n, 17),
        "all_distinct": np.arange(n) % m,
        "mixed_groups": rng.integers(0, 4, n) * 3 + (np.arange(n) // 32) % 7,
        "sorted_runs": np.sort(rng.integers(0, m, n)),
        "random": rng.integers(0, m, n),
    }
    for name, idx in patterns.items():
        vals = rng.standard_normal((n, 3)).astype(np.float32)
        ref = np.zeros((m, 3))
        np.add.at(ref, idx, vals.astype(np.float64))
        idx_w = wp.array(idx.astype(np.int32), device=device)
        vals_w = wp.array(vals, dtype=wp.vec3, device=device)
        results = {}
        for mode in ("atomic", "warp", "serial", "arc"):
            dest = wp.zeros(m, dtype=wp.vec3, device=device)
            arc_warp.scatter_add(dest, idx_w, vals_w, mode=mode)
            results[mode] = dest.numpy().astype(np.float64)
        scale = np.abs(ref).max()
        for mode, out in results.items():
            rows.append(
                {
                    "case": f"scatter/{name}",
                    "mode": mode,
                    "vs_atomic": float(np.abs(out - results["atomic"]).max() / scale),
                    "vs_float64": float(np.abs(out - ref).max() / scale),
                }
            )
    for p, uniform_index in itertools.product((1.0, 0.25, 1 / 32), (True, False)):
        outs = {}
        for mode in ("atomic", "warp", "serial", "arc"):
            dest = wp.zeros(1000, dtype=VecK, device=device)
            launch_probe(
                mode, make_params(1000, device), dest, 512, 32, p_active=p, seed=3,
                threshold=arc_warp.resolve_threshold(device), uniform_index=uniform_index,
            )
            outs[mode] = dest.numpy().astype(np.float64)
        scale = np.abs(outs["atomic"]).max()
        for mode, out in outs.items():
            rows.append(
                {
                    "case": f"probe/p={p:.3g}{'/uniform' if uniform_index else ''}",
                    "mode": mode,
                    "vs_atomic": float(np.abs(out - outs["atomic"]).max() / scale),
                    "vs_float64": float("nan"),
                }
            )
    return rows


def timings(device, n_blocks: int, targets_per_block: int, reps: int, threshold: int, uniform_index: bool) -> list[dict]:
    rows = []
    for n_targets in (100_000, 1_000_000):
        dest = wp.zeros(n_targets, dtype=VecK, device=device)
        params = make_params(n_targets, device)
        for p in (1.0, 0.6, 0.25, 0.08, 1 / 32):
            launches = {
                mode: lambda mode=mode, p=p: launch_probe(
                    mode, params, dest, n_blocks, targets_per_block, p_active=p, seed=1, threshold=threshold,
                    uniform_index=uniform_index,
                )
                for mode in MODES
            }
            row = {"targets": n_targets, "p": p, **median_times_ms(launches, device, warmup=3, reps=reps)}
            rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    print(
        f"{'targets':>9} {'p':>6} "
        + " ".join(f"{m:>8}" for m in MODES)
        + "  arc/atomic arc/best(atomic,warp) arc/floor"
    )
    for r in rows:
        best = min(r["atomic"], r["warp"])
        print(
            f"{r['targets']:>9} {r['p']:>6.3f} "
            + " ".join(f"{r[m]:8.4f}" for m in MODES)
            + f"  {r['atomic'] / r['arc']:9.2f}x {best / r['arc']:20.3f}x {r['arc'] / r['floor']:9.3f}"
        )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=8192, help="blocks of 256 threads (default 8192)")
    ap.add_argument("--targets-per-block", type=int, default=64)
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--json", help="write all results to this file")
    args = ap.parse_args(argv)
    wp.config.log_level = wp.LOG_WARNING
    device = wp.get_device("cuda")
    if not device.is_cuda:
        print("arc_micro needs a CUDA GPU", file=sys.stderr)
        return 2

    print(f"# device: {device.name}, warp {wp.config.version}")
    cal = arc_warp.calibrate(device)
    print(f"# calibrated ARC threshold T = {cal.threshold}")
    print("# calibration: median probe ms per active-lane density; worst = min over densities of best/arc")
    print(f"  {'':>10} " + " ".join(f"p={p:<7.3g}" for p in cal.densities) + "   worst")
    print(f"  {'atomic':>10} " + " ".join(f"{t:9.4f}" for t in cal.atomic_ms))
    print(f"  {'warp':>10} " + " ".join(f"{t:9.4f}" for t in cal.warp_ms))
    for t, times in zip(cal.candidates, cal.arc_ms):
        print(f"  {'arc T=%d' % t:>10} " + " ".join(f"{x:9.4f}" for x in times) + f"   {cal.worst_ratio(t):.3f}")
    print(f"# keyed threshold T = {cal.keyed_threshold}: keyed probe ms (four float4 adds per pixel, one plan) "
          "per lanes per key; T = 33 is compiled as atomic")
    print(f"  {'':>10} " + " ".join(f"g={g:<7d}" for g in cal.keyed_groups) + "   worst")
    print(f"  {'atomic':>10} " + " ".join(f"{t:9.4f}" for t in cal.keyed_atomic_ms))
    print(f"  {'warp':>10} " + " ".join(f"{t:9.4f}" for t in cal.keyed_warp_ms))
    for t, times in zip(cal.keyed_candidates, cal.keyed_arc_ms):
        print(f"  {'arc T=%d' % t:>10} " + " ".join(f"{x:9.4f}" for x in times) + f"   {cal.keyed_worst_ratio(t):.3f}")

    par = parity(device)
    worst = max(r["vs_atomic"] for r in par)
    print(f"# parity: worst relative difference to atomic over {len(par)} checks = {worst:.2e}")
    for r in par:
        print(f"  {r['case']:24s} {r['mode']:7s} vs_atomic={r['vs_atomic']:.2e} vs_float64={r['vs_float64']:.2e}")

    tables = {}
    for uniform_index, title in ((True, "uniform index (the rasteriser's path)"), (False, "general path (index checked)")):
        tables["uniform" if uniform_index else "general"] = rows = timings(
            device, args.blocks, args.targets_per_block, args.reps, cal.threshold, uniform_index
        )
        print(
            f"# timings, {title}: {args.blocks} blocks x 256 threads, {args.targets_per_block} targets per block, "
            f"K=9, median of {args.reps} (ms)"
        )
        print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device.name, "calibration": cal.__dict__, "parity": par, "timings": tables}, f, indent=1)
    # float32 round-off of up to 2^18 terms per target stays well inside 1e-4 relative.
    ok = worst < 1e-4 and all(not r["vs_float64"] > 1e-4 for r in par)
    print("# parity", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
