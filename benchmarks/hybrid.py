"""A render composited over a surface (surface_colors / surface_depths) against the plain render.

Per N and size regime (:mod:`benchmarks.scene`), one camera at 1920x1080, SH degree 3,
forward and backward (one random colour cotangent) through
``arc_warp_torch.rasterization``, plain and with a surface: a plane tilted away from the
camera, at depth 4 at the image's top quarter line down to 12 at its bottom (the scene's
Gaussians lie at depths 2-12, so it hides about half of those behind it), no surface
(+inf) above that line, its colours a gradient that requires grad (a mesh's colours
would). The ratio is the compositing's cost: the surface test per Gaussian and pixel, the
surface colour's gradient. Medians after warm-up of CUDA events on torch's stream; the
host clock on the CPU (``--smoke``).
"""

from __future__ import annotations

import numpy as np

from benchmarks import results, timing
from benchmarks.scene import REGIMES, SH_DEGREE, make_scene


def add_arguments(parser) -> None:
    parser.add_argument("--n", type=int, nargs="+", default=[300_000, 1_000_000])
    parser.add_argument("--regimes", nargs="+", choices=REGIMES, default=["small", "large"])
    parser.add_argument("--width", type=int, default=1920)
    parser.add_argument("--height", type=int, default=1080)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)


def surface(width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """``(colors [1, H, W, 3], depths [1, H, W])`` float32 of the module notes' plane."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    depths = np.where(y >= height / 4, 4.0 + 8.0 * (y - height / 4) / (0.75 * height), np.inf)
    colors = np.stack([x / width, y / height, 0.5 + 0 * x], -1)
    return colors[None].astype(np.float32), depths[None].astype(np.float32)


def run(args) -> dict:
    import torch

    from arc_warp_torch import RenderContext, rasterization

    if args.smoke:
        args.n, args.regimes, args.width, args.height, args.reps, args.warmup = [300], ["small"], 64, 48, 2, 1
    cuda = not args.smoke and torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    clock = timing.Clock(device, "torch")
    context = RenderContext(device)
    colors, depths = surface(args.width, args.height)
    surface_colors = torch.tensor(colors, device=device).requires_grad_(True)
    surface_depths = torch.tensor(depths, device=device)
    rows = []
    for n in args.n:
        for regime in args.regimes:
            scene = make_scene(n, regime, args.width, args.height)
            leaves = {k: torch.tensor(v, device=device).requires_grad_(True) for k, v in scene.activated().items()}
            viewmats, ks = (torch.tensor(a, device=device) for a in (scene.viewmats, scene.Ks))
            cot = torch.tensor(np.random.default_rng(1).standard_normal((1, args.height, args.width, 3)),
                               dtype=torch.float32, device=device)
            for case, extra, grads in (("plain", {}, ()), ("hybrid", {"surface_colors": surface_colors,
                                                                      "surface_depths": surface_depths},
                                                           (surface_colors,))):
                def render(extra=extra):
                    return rasterization(*leaves.values(), viewmats, ks, args.width, args.height,
                                         sh_degree=SH_DEGREE, context=context, **extra)[0]

                row = timing.forward_backward(render, [*leaves.values(), *grads], cot, clock, args.reps, args.warmup)
                rows.append(dict(row, n=n, regime=regime, case=case))
            print(f"# N={n} {regime}: plain / hybrid backward {rows[-2]['backward_ms']:.3f} / "
                  f"{rows[-1]['backward_ms']:.3f} ms")
    return {"device": torch.cuda.get_device_name() if cuda else "cpu", "width": args.width, "height": args.height,
            "notes": [] if cuda else ["no CUDA device: times are the host clock's"], "rows": rows}


def table(result: dict) -> str:
    rows, num, ratio, out = result["rows"], results.num, results.ratio, []
    for r in rows:
        if r["case"] != "hybrid":
            continue
        plain = next((p for p in rows if (p["n"], p["regime"], p["case"]) == (r["n"], r["regime"], "plain")), {})
        out.append([results.count(r["n"]), r["regime"], num(plain.get("forward_ms")), num(plain.get("backward_ms")),
                    num(r["forward_ms"]), num(r["backward_ms"]), ratio(r["forward_ms"], plain.get("forward_ms")),
                    ratio(r["backward_ms"], plain.get("backward_ms"))])
    return results.markdown(["N", "regime", "plain fwd ms", "plain bwd ms", "hybrid fwd ms", "hybrid bwd ms",
                             "fwd ÷ plain", "bwd ÷ plain"], out)
