"""One forward + backward per reduce mode of the splat scene, to run under compute-sanitizer.

    compute-sanitizer --tool memcheck python -m benchmarks sanitize --n 1000000
    compute-sanitizer --tool racecheck python -m benchmarks sanitize --n 100000

The splat benchmark's scene (``--regime``, default ``shrink``) at 1920x1080 through
``arc_warp.render_gaussians`` (a GaussianRenderer forward, its checks read) and its
backward under a random colour cotangent, in each of ``--modes`` (default ``arc`` and
``deterministic``), then the images and gradients read back and checked finite. The figures are
the intersection count and the gradients' norms, which the sanitizer's run should leave
as an ordinary run gives them.
"""

from __future__ import annotations

import numpy as np

from benchmarks import results
from benchmarks.scene import REGIMES, make_scene


def add_arguments(parser) -> None:
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--regime", choices=REGIMES, default="shrink")
    parser.add_argument("--modes", nargs="+", default=["arc", "deterministic"])
    parser.add_argument("--width", type=int, default=1920)
    parser.add_argument("--height", type=int, default=1080)


def run(args) -> dict:
    import warp as wp

    from arc_warp import RenderSettings, render_gaussians, render_gaussians_backward

    if args.smoke:
        args.n, args.width, args.height = 300, 64, 48
    device = wp.get_device("cpu" if args.smoke or not wp.is_cuda_available() else "cuda")
    scene = make_scene(args.n, args.regime, args.width, args.height)
    gaussians = scene.warp_gaussians(device)
    cotangent = wp.array(np.random.default_rng(1).standard_normal((args.height, args.width, 3)).astype(np.float32),
                         dtype=wp.vec3, device=device)
    rows = []
    for mode in args.modes:
        out = render_gaussians(*gaussians.arrays, scene.cameras()[0], RenderSettings(reduce=mode))
        grads = render_gaussians_backward(out, cotangent)
        wp.synchronize_device(device)
        arrays = {"color": out.color.numpy(), **{k: g.numpy() for k, g in zip(scene.ACTIVATED, grads.arrays)}}
        bad = [k for k, a in arrays.items() if not np.isfinite(a).all()]
        if bad:
            raise RuntimeError(f"sanitize: {mode} gave non-finite {bad}")
        rows.append({"mode": mode, "intersections": int(out.status.totals[0]),
                     **{f"{k}_grad_norm": float(np.linalg.norm(arrays[k])) for k in scene.ACTIVATED}})
        print(f"# {mode}: {rows[-1]}", flush=True)
    return {"device": device.name if device.is_cuda else "cpu", "n": args.n, "rows": rows}


def table(result: dict) -> str:
    keys = [k for k in result["rows"][0] if k.endswith("_grad_norm")] if result["rows"] else []
    return results.markdown(["mode", "intersections", *(k.replace("_grad_norm", " gradient norm") for k in keys)],
                            [[r["mode"], str(r["intersections"]), *(f"{r[k]:.6g}" for k in keys)]
                             for r in result["rows"]])
