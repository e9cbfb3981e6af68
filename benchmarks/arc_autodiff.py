"""ARC in Warp's generated backward (arc_warp.arc_adjoint) against Warp's own adjoint, on three examples.

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

CUDA events on Warp's stream around each forward and each backward, the variants
interleaved in every repetition, medians after warm-up; the table gives ms and each
variant's time over Warp's. On the CPU (``--smoke``: sizes / 16 per axis) the host clock.
"""

from __future__ import annotations

import numpy as np

from benchmarks import results, timing

VARIANTS = ("warp_adjoint", "atomic", "warp", "arc", "deterministic", "floor")
SCENARIOS = ("p2g_sorted", "p2g_shuffled", "cloth", "splat")


def add_arguments(parser) -> None:
    parser.add_argument("--only", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--particles", type=int, default=1 << 20)
    parser.add_argument("--grid", type=int, default=256)
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--gaussians", type=int, default=1 << 16)
    parser.add_argument("--image", type=int, default=1024)
    parser.add_argument("--radius", type=int, default=4)
    parser.add_argument("--block-dim", type=int, default=256)
    parser.add_argument("--threshold", type=int, default=None, help="ARC T (default: calibrated for the GPU)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=20)


def scenarios(args) -> dict:
    """name -> (example module, make_problem keyword arguments)."""
    from arc_warp.examples import arc_adjoint_cloth, arc_adjoint_p2g, arc_adjoint_splat

    s = 16 if args.smoke else 1
    return {
        "p2g_sorted": (arc_adjoint_p2g, dict(particles=args.particles // s**2, grid=args.grid // s, sort=True)),
        "p2g_shuffled": (arc_adjoint_p2g, dict(particles=args.particles // s**2, grid=args.grid // s, sort=False)),
        "cloth": (arc_adjoint_cloth, dict(rows=args.rows // s)),
        "splat": (arc_adjoint_splat, dict(gaussians=args.gaussians // s**2, height=args.image // s,
                                          width=args.image // s, radius=args.radius)),
    }


def run_scenario(example, problem_args: dict, device, threshold: int, args) -> dict:
    """Forward and backward medians per variant; each variant has its own copy of the problem
    (same seed), so the others' launches leave its arrays as its own forward made them."""
    import warp as wp

    import arc_warp

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
            if args.smoke:
                raise
            errors[variant] = f"{type(e).__name__}: {e}"
            continue
        forwards[variant] = lambda pb=pb, k=kernels: example.forward(pb, k, args.block_dim)
        backwards[variant] = lambda pb=pb, t=tape: t.backward(grads=example.cotangents(pb))
    clock = timing.Clock(device, "warp")
    out = {"problem": problem_args,
           **{f"{what}_ms": {k: t["device_ms"] for k, t in timing.medians(clock, fns, args.warmup, args.reps).items()}
              for what, fns in (("forward", forwards), ("backward", backwards))}}
    if errors:
        out["errors"] = errors
    return out


def run(args) -> dict:
    import warp as wp

    import arc_warp

    if args.smoke:
        args.warmup, args.reps = 1, 2
    device = wp.get_device("cpu" if args.smoke or not wp.is_cuda_available() else "cuda")
    threshold = arc_warp.resolve_threshold(device, args.threshold)
    rows = []
    all_scenarios = scenarios(args)
    with wp.ScopedDevice(device):
        for name in args.only:
            example, problem_args = all_scenarios[name]
            rows.append(dict(run_scenario(example, problem_args, device, threshold, args), scenario=name))
            print(f"# {name}: " + ", ".join(f"{v} {t:.3f}" for v, t in rows[-1]["backward_ms"].items())
                  + " ms backward", flush=True)
    return {"device": device.name if device.is_cuda else "cpu", "threshold": threshold, "block_dim": args.block_dim,
            "rows": rows, "notes": [] if device.is_cuda else ["no CUDA device: times are the host clock's"]}


def table(result: dict) -> str:
    out = []
    for r in result["rows"]:
        for phase in ("forward_ms", "backward_ms"):
            times = r[phase]
            base = times.get("warp_adjoint")
            out.append([r["scenario"], phase[:-3]] + [
                "-" if v not in times else results.num(times[v]) if v == "warp_adjoint"
                else f"{results.num(times[v])} ({results.ratio(times[v], base)})" for v in VARIANTS])
        for v, e in r.get("errors", {}).items():
            out.append([r["scenario"], f"{v} failed: {e[:120]}"] + [""] * len(VARIANTS))
    text = results.markdown(["scenario", "pass", *VARIANTS], out)
    return text + (f"\n\nms (÷ Warp's own adjoint); ARC threshold T = {result['threshold']}, "
                   f"block_dim {result['block_dim']}.")
