"""ARC in Warp's generated backward (``arc_warp.arc_adjoint``) against Warp's own adjoint.

The three examples of ``arc_warp.examples`` at realistic sizes and contention, each timed
as a user runs it: the forward launches recorded on a ``wp.Tape``, then
``tape.backward(grads=...)``. Variants: ``warp_adjoint`` (the kernels as written: Warp's
generated adjoint, one atomic per thread) and ``arc_adjoint`` in ``atomic``, ``warp``,
``arc`` (the calibrated threshold), ``deterministic`` (Warp's deterministic execution)
and ``floor`` (the rewritten adds add nothing: the cost of free accumulation).

Scenarios (change the sizes with the flags):

- ``p2g_sorted``: MPM transfers p2g -> grid_update -> g2p, 2^20 particles in a 256^2 grid
  (16 per cell), sorted by cell as MPM codes keep them: the lanes of a warp share nodes,
  in p2g's forward scatter and in g2p's backward;
- ``p2g_shuffled``: the same particles in random order (little sharing within a warp);
- ``cloth``: stretch energy of a 1024^2-vertex sheet (2M triangles; each vertex's gradient
  gets the adds of up to six triangles, the total one add per triangle);
- ``splat``: 2^16 Gaussians, 9 x 9 footprints, into a 1024^2 image (81 lanes per
  Gaussian add into its gradients).

CUDA events around each forward and each backward, the variants interleaved in every
repetition, medians after warm-up. Prints a table (ms, and Warp's time over each
variant's) and writes JSON. Needs a CUDA GPU; ``--smoke`` runs tiny sizes on the CPU to
check the script (its times mean nothing).

Usage::

    python benchmarks/bench_arc_autodiff.py [--only splat cloth] [--reps 20] [--json out.json]
"""

import argparse
import json
import statistics
import time

import numpy as np
import warp as wp

import arc_warp
from arc_warp.examples import arc_adjoint_cloth, arc_adjoint_p2g, arc_adjoint_splat

VARIANTS = ("warp_adjoint", "atomic", "warp", "arc", "deterministic", "floor")


def scenarios(args) -> dict:
    """name -> (example module, make_problem keyword arguments)."""
    s = 16 if args.smoke else 1
    return {
        "p2g_sorted": (arc_adjoint_p2g, dict(particles=args.particles // s**2, grid=args.grid // s, sort=True)),
        "p2g_shuffled": (arc_adjoint_p2g, dict(particles=args.particles // s**2, grid=args.grid // s, sort=False)),
        "cloth": (arc_adjoint_cloth, dict(rows=args.rows // s)),
        "splat": (arc_adjoint_splat, dict(gaussians=args.gaussians // s**2, height=args.image // s,
                                          width=args.image // s, radius=args.radius)),
    }


def median_ms(fns: dict, device, warmup: int, reps: int) -> dict:
    """Median time of each ``fns[name]()`` in ms, the variants interleaved (rotated order)."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    wp.synchronize_device(device)
    times = {name: [] for name in names}
    for rep in range(reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            if device.is_cuda:
                start, end = wp.Event(device, enable_timing=True), wp.Event(device, enable_timing=True)
                wp.record_event(start)
                fns[name]()
                wp.record_event(end)
                wp.synchronize_event(end)
                times[name].append(wp.get_event_elapsed_time(start, end))
            else:
                t0 = time.perf_counter()
                fns[name]()
                wp.synchronize_device(device)
                times[name].append((time.perf_counter() - t0) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def run_scenario(example, problem_args: dict, device, threshold: int, args) -> dict:
    """Forward and backward medians per variant; each variant has its own copy of the problem
    (same seed), so the others' launches leave its arrays as its own forward made them."""
    forwards, backwards, errors = {}, {}, {}
    for variant in (v for v in VARIANTS if v in args.variants):
        pb = example.make_problem(np.random.default_rng(0), device=device, **problem_args)
        try:
            if variant == "warp_adjoint":
                kernels = dict(example.KERNELS)
            else:
                kernels = {k: arc_warp.arc_adjoint(v, mode=variant, threshold=threshold)
                           for k, v in example.KERNELS.items()}
            tape = wp.Tape()
            with tape:
                example.forward(pb, kernels, args.block_dim)  # compiles; the tape records the launches once
            tape.backward(grads=example.cotangents(pb))
            wp.synchronize_device(device)
        except Exception as e:  # noqa: BLE001 (one variant failing must not hide the others)
            errors[variant] = f"{type(e).__name__}: {e}"
            continue
        forwards[variant] = lambda pb=pb, k=kernels: example.forward(pb, k, args.block_dim)
        backwards[variant] = lambda pb=pb, t=tape: t.backward(grads=example.cotangents(pb))
    out = {"problem": problem_args, "forward_ms": median_ms(forwards, device, args.warmup, args.reps),
           "backward_ms": median_ms(backwards, device, args.warmup, args.reps)}
    if errors:
        out["errors"] = errors
    return out


def print_table(results: dict) -> None:
    print("| scenario | pass | " + " | ".join(VARIANTS) + " |")
    print("|---|---|" + "---:|" * len(VARIANTS))
    for name, r in results["scenarios"].items():
        for phase in ("forward_ms", "backward_ms"):
            times = r[phase]
            base = times.get("warp_adjoint")
            cells = []
            for v in VARIANTS:
                if v not in times:
                    cells.append("-")
                elif base is None or v == "warp_adjoint":
                    cells.append(f"{times[v]:.3f}")
                else:
                    cells.append(f"{times[v]:.3f} ({base / times[v]:.2f}x)")
            print(f"| {name} | {phase[:-3]} | " + " | ".join(cells) + " |")
        for v, e in r.get("errors", {}).items():
            print(f"  {name} {v} failed: {e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", default=["p2g_sorted", "p2g_shuffled", "cloth", "splat"])
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS))
    ap.add_argument("--particles", type=int, default=1 << 20)
    ap.add_argument("--grid", type=int, default=256)
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--gaussians", type=int, default=1 << 16)
    ap.add_argument("--image", type=int, default=1024)
    ap.add_argument("--radius", type=int, default=4)
    ap.add_argument("--block-dim", type=int, default=256)
    ap.add_argument("--threshold", type=int, default=None, help="ARC T (default: calibrated for the GPU)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default="bench_arc_autodiff.json")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU: checks the script, times nothing")
    args = ap.parse_args()
    wp.config.log_level = wp.LOG_ERROR
    wp.init()
    if args.smoke:
        device = wp.get_device("cpu")
        args.warmup, args.reps = 1, 2
    elif not wp.is_cuda_available():
        raise SystemExit("needs a CUDA GPU (or --smoke for a CPU check of the script)")
    else:
        device = wp.get_device("cuda")
    threshold = arc_warp.resolve_threshold(device, args.threshold)
    results = {"device": device.name, "warp": wp.config.version, "arc_warp": arc_warp.__version__,
               "threshold": threshold, "block_dim": args.block_dim, "reps": args.reps, "scenarios": {}}
    all_scenarios = scenarios(args)
    with wp.ScopedDevice(device):
        for name in args.only:
            if name not in all_scenarios:
                raise SystemExit(f"unknown scenario {name!r}; pick from {sorted(all_scenarios)}")
            example, problem_args = all_scenarios[name]
            results["scenarios"][name] = run_scenario(example, problem_args, device, threshold, args)
    print(f"{results['device']}, Warp {results['warp']}, arc_warp {results['arc_warp']}, T = {threshold}, "
          f"block_dim {args.block_dim}; ms (Warp's adjoint time / variant's)")
    print_table(results)
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
