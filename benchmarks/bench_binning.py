"""Tile binning benchmark: intersections and forward/backward times (needs a CUDA GPU).

Scenes are ``bench_splat.make_scene`` (1920x1080, SH 3, Gaussians filling the frustum),
in two size regimes: ``small`` (bench_splat's scales) and ``large`` (scales times
``--large-factor``). For each it reports

  * ``isects``: the intersections this checkout bins (``out._bins.n_isects``);
  * ``box_isects``: those the opacity-aware boxes alone give (the binning before the
    tile-exact footprint test), computed on the host from ``radii`` and ``means2d``;
  * forward, backward and rasteriser-backward medians (``reduce="arc"``, CUDA events),
    and ``bin_ms``: counting, the one readback, key writing and sorting alone.

"Before" times come from running this same script against the base commit (it uses only
the public API plus ``out._bins``, present there too)::

    python benchmarks/bench_binning.py --n 1000000 --n 300000 --json tight.json
    PYTHONPATH=<checkout of 0c61e3a> python benchmarks/bench_binning.py --n 1000000 --n 300000 --json box.json
"""

import argparse
import json

import numpy as np
import warp as wp

import arc_warp
from arc_warp._src.arc.timing import median_times_ms
from arc_warp._src.splat.bin_ops import count_intersections, sort_intersections
from arc_warp._src.splat.validate_kernels import BAD_SLOTS
from arc_warp._src.splat.raster_ops import raster_backward
from bench_splat import HEIGHT, WIDTH, make_scene, scene_arrays

TILE = 16


def box_isects(out) -> int:
    """Intersections of the opacity-aware tile boxes (``tile_bbox`` of every visible Gaussian)."""
    xy = out.means2d.numpy().reshape(-1, 2).astype(np.float64)
    r = out.radii.numpy().reshape(-1, 2).astype(np.float64)
    grid = [(WIDTH + TILE - 1) // TILE, (HEIGHT + TILE - 1) // TILE]
    lo = np.clip(np.floor((xy - r) / TILE), 0, grid)
    hi = np.clip(np.ceil((xy + r) / TILE), 0, grid)
    return int(np.prod(np.maximum(hi - lo, 0), axis=1)[r[:, 0] > 0].sum())


def run(n: int, regime: str, large_factor: float, reps: int, device) -> dict:
    scene = make_scene(n)
    if regime == "large":
        scene["scales"] = np.ascontiguousarray(scene["scales"] * np.float32(large_factor))
    cam = scene["camera"]
    arrays = scene_arrays(scene, device)
    rng = np.random.default_rng(1)
    grad_color = wp.array(rng.normal(size=(HEIGHT, WIDTH, 3)).astype(np.float32), dtype=wp.vec3, device=device)
    zeros = wp.zeros((HEIGHT, WIDTH), dtype=float, device=device)
    settings = arc_warp.RenderSettings(reduce="arc")
    threshold = arc_warp.resolve_threshold(device)
    out = arc_warp.render_gaussians(**arrays, camera=cam, settings=settings)
    grads = arc_warp.render_gaussians_backward(out, grad_color)
    flags = wp.zeros(1 + len(BAD_SLOTS), dtype=wp.int32, device=device)

    def bin_once():
        scan = count_intersections(out._project, flags, out._frame)
        sort_intersections(out._project, scan, int(flags.numpy()[0]), out._bins.tiles_x, out._bins.tiles_y, out._frame)
    times = median_times_ms(
        {
            "forward_ms": lambda: arc_warp.render_gaussians(**arrays, camera=cam, settings=settings),
            "backward_ms": lambda: arc_warp.render_gaussians_backward(out, grad_color, grads=grads),
            "bin_ms": bin_once,
            "raster_backward_ms": lambda: raster_backward(
                out._project, out._bins, out._images, settings.background, grad_color, zeros, zeros, zeros,
                "arc", False, threshold, out._frame,
            ),
        },
        device,
        warmup=3,
        reps=reps,
    )
    boxed = box_isects(out)
    return {"n": n, "regime": regime, "isects": int(out._bins.n_isects), "box_isects": boxed,
            "isects_vs_box": out._bins.n_isects / max(boxed, 1), **times}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, action="append", help="Gaussian counts (default 1M and 300k)")
    parser.add_argument("--regime", choices=("small", "large"), action="append", help="default both")
    parser.add_argument("--large-factor", type=float, default=4.0, help="scale multiplier of the large regime")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    device = wp.get_device("cuda:0")
    rows = []
    print(f"{'N':>8} {'regime':>6} {'isects':>11} {'box':>11} {'ratio':>6} {'fwd ms':>7} {'bin ms':>7} "
          f"{'bwd ms':>7} {'rbwd ms':>7}")
    for n in args.n or [1_000_000, 300_000]:
        for regime in args.regime or ["small", "large"]:
            r = run(n, regime, args.large_factor, args.reps, device)
            rows.append(r)
            times = " ".join(f"{r[k]:>7.3f}" for k in ("forward_ms", "bin_ms", "backward_ms", "raster_backward_ms"))
            print(f"{n:>8} {regime:>6} {r['isects']:>11} {r['box_isects']:>11} {r['isects_vs_box']:>6.3f} {times}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "arc_warp": arc_warp.__file__}, f, indent=1)


if __name__ == "__main__":
    main()
