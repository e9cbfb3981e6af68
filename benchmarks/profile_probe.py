"""Launch the ARC probe kernel once per mode, for Nsight Compute (needs CUDA).

Usage::

    ncu --clock-control none --section SpeedOfLight --section WarpStateStats \\
        python benchmarks/profile_probe.py --p 0.03125 --modes atomic arc
"""

import argparse

import warp as wp

import arc_warp
from arc_warp._src.arc.probe import VecK, launch_probe, make_params


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--p", type=float, default=1.0, help="active-lane fraction")
    ap.add_argument("--modes", nargs="+", default=["atomic", "arc"])
    ap.add_argument("--threshold", type=int, help="ARC threshold (default: the calibrated one)")
    ap.add_argument("--general", action="store_true", help="the general path (no uniform-index promise)")
    args = ap.parse_args()
    wp.config.log_level = wp.LOG_WARNING
    threshold = args.threshold if args.threshold is not None else arc_warp.resolve_threshold("cuda")
    dest = wp.zeros(100_000, dtype=VecK, device="cuda")
    params = make_params(100_000, "cuda")
    for mode in args.modes:
        launch_probe(
            mode, params, dest, 8192, 64, p_active=args.p, threshold=threshold, uniform_index=not args.general
        )
    wp.synchronize()


if __name__ == "__main__":
    main()
