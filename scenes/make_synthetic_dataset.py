"""Render a multi-view NeRF-synthetic dataset from a ground-truth Gaussian scene.

The scene is procedural (`--scene torus|blobs`) or a 3DGS PLY (`--ply`, e.g. one shipped
in this folder). Views are rendered by the Warp renderer and written as
transforms_train.json / transforms_test.json with RGBA PNGs plus gt.ply, so
`arc-warp train OUT` can train on them offline:

    python scenes/make_synthetic_dataset.py /tmp/torus_ds --width 128 --height 128
    arc-warp train /tmp/torus_ds --steps 3000 --sh-degree 0 --white-background
"""

import argparse
import sys

import warp as wp

from arc_warp.ply import read_ply
from arc_warp_train.synthetic import SCENES, GaussianScene, make_scene, make_synthetic_dataset


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("output", help="dataset folder to write")
    p.add_argument("--scene", choices=SCENES, default="torus", help="procedural scene")
    p.add_argument("--ply", default=None, help="ground-truth 3DGS PLY instead of --scene")
    p.add_argument("--gaussians", type=int, default=1500, help="procedural scene size")
    p.add_argument("--train", type=int, default=12, help="training views")
    p.add_argument("--test", type=int, default=4, help="held-out views")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--height", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="warp device (default: warp's default)")
    args = p.parse_args(argv)
    wp.config.log_level = wp.LOG_WARNING
    scene = (GaussianScene.from_ply(read_ply(args.ply)) if args.ply
             else make_scene(args.gaussians, args.seed, args.scene))
    make_synthetic_dataset(args.output, args.train, args.test, args.width, args.height,
                           seed=args.seed, device=args.device, scene=scene)
    print(f"wrote {args.train} train + {args.test} test views of {args.width}x{args.height} "
          f"({scene.means.shape[0]} Gaussians) to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
