"""Native fisheye training against undistort-then-train, on a synthetic wide-angle capture.

`make_fisheye_capture` (synthetic.py) writes a COLMAP model of OPENCV_FISHEYE views from
inside the "room" scene. The capture is loaded twice: natively (each view keeps its
fisheye lens, full frame) and with `undistort=True` (pycolmap resamples every image to
a pinhole, cropping the corners of the field of view). One model is trained on each,
with the same settings and seed, and both are evaluated on the held-out views through
their native fisheye cameras over the full frame: the undistorted run's own test images
are a cropped resampling, so they cannot be the measure.

    python -m arc_warp_train.fisheye_study OUT [--steps 600]

prints both PSNRs and writes OUT/capture (the dataset), OUT/native and OUT/undistorted
(checkpoints) and OUT/comparison.png (ground truth | native | undistorted, test views).
"""

import argparse
import os
import time

import numpy as np
import warp as wp

from .datasets import load_colmap
from .densify import DensifyConfig
from .outputs import ensure_dir
from .trainer import TrainConfig, Trainer


def study_config(steps: int = 600, seed: int = 0, device="cpu", progress: bool = True) -> TrainConfig:
    """Training settings of both runs: the demo's schedule (refinement in the first 60 % of
    `steps`, an opacity reset at 30 %, growth capped at 6000 Gaussians), SH degree 1."""
    dens = DensifyConfig(refine_start=min(100, steps // 10), refine_stop=int(0.6 * steps),
                         refine_every=max(steps // 20, 10), reset_every=max(int(0.3 * steps), 1),
                         max_gaussians=6000)
    return TrainConfig(steps=steps, sh_degree=1, sh_degree_interval=max(steps // 4, 1), densify=dens,
                       eval_every=steps, seed=seed, device=device, progress=progress, cpu_threads=1)


def run_study(data_dir, out_dir, cfg: TrainConfig, log=print) -> dict:
    """Train natively and after undistortion on the COLMAP capture in `data_dir`; returns
    {"native": PSNR, "undistorted": PSNR} (dB, mean over the held-out views, each over its
    full fisheye frame), with "undistorted_own" (the undistorted run on its own cropped
    test images), "seconds" per run and the renders; checkpoints go to `out_dir`/<run>."""
    native = load_colmap(data_dir)
    loads = {"native": native, "undistorted": load_colmap(data_dir, undistort=True)}
    result = {"seconds": {}, "renders": {}}
    for name, dataset in loads.items():
        start = time.perf_counter()
        trainer = Trainer(dataset, cfg, os.path.join(out_dir, name))
        trainer.train()
        full = trainer.evaluate(native.test)  # the native fisheye cameras, full frame
        result[name], result["renders"][name] = full["psnr"], full["renders"]
        result["seconds"][name] = time.perf_counter() - start
        if name == "undistorted":
            result["undistorted_own"] = trainer.evaluate()["psnr"]
        trainer.save_checkpoint(os.path.join(ensure_dir(trainer.out_dir), "checkpoint.pt"))
        log(f"{name}: {len(dataset.train)} training views of {dataset.train[0].width}x"
            f"{dataset.train[0].height} ({dataset.train[0].lens}), held-out PSNR over the full "
            f"fisheye frame {full['psnr']:.2f} dB, {result['seconds'][name]:.0f} s")
    result["ground_truth"] = [v.image for v in native.test]
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("output", help="folder for the capture, the runs and comparison.png")
    parser.add_argument("--steps", type=int, default=600, help="training steps of each run")
    parser.add_argument("--views", type=int, default=24, help="views in the capture (every 8th held out)")
    parser.add_argument("--size", type=int, nargs=2, default=(64, 48), metavar=("W", "H"), help="image size")
    parser.add_argument("--fov", type=float, default=180.0, help="diagonal field of view, degrees")
    parser.add_argument("--gaussians", type=int, default=3000, help="Gaussians of the ground-truth scene")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the scene and the runs")
    args = parser.parse_args(argv)
    from .outputs import labelled_row, write_image
    from .synthetic import make_fisheye_capture

    wp.config.log_level = wp.LOG_WARNING
    data_dir = os.path.join(args.output, "capture")
    make_fisheye_capture(data_dir, args.views, *args.size, args.gaussians, args.fov, seed=args.seed,
                         device="cpu")
    result = run_study(data_dir, args.output, study_config(args.steps, args.seed))
    rows = [labelled_row([gt, result["renders"]["native"][i], result["renders"]["undistorted"][i]],
                         ["ground truth", "native", "undistorted"])
            for i, gt in enumerate(result["ground_truth"])]
    write_image(os.path.join(args.output, "comparison.png"), np.concatenate(rows, axis=0))
    print(f"held-out PSNR over the full fisheye frame: native {result['native']:.2f} dB, undistort-then-train "
          f"{result['undistorted']:.2f} dB (on its own cropped test images {result['undistorted_own']:.2f} dB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
