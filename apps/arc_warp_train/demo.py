"""`arc-warp demo`: train a procedural scene end to end, offline, in a few CPU minutes.

A ground-truth scene (`synthetic.make_scene`) is rendered by the Warp renderer into a
NeRF-synthetic dataset inside the output folder, read back with the dataset reader, and
a model is trained from random points with densification. Fixed seed: reproducible.
"""

import os
import time
from dataclasses import dataclass

import warp as wp

from .datasets import load_nerf_synthetic
from .densify import DensifyConfig
from .trainer import TrainConfig, TrainResult, train


@dataclass
class DemoConfig:
    """Dataset and training sizes of the demo (see `demo_config`)."""

    width: int = 64
    height: int = 64
    num_train: int = 12
    num_test: int = 4
    gt_gaussians: int = 1500
    train: TrainConfig = None


def demo_config(steps: int = 2000, seed: int = 0, device=None, progress: bool = True) -> DemoConfig:
    """The demo's settings for `steps` training steps; the densification and evaluation
    schedule is stretched with `steps` (refinement in the first 60 %, opacity reset at
    30 %, growth capped at 4000 Gaussians)."""
    if not isinstance(steps, int) or steps < 10:
        raise ValueError(f"demo steps must be an int >= 10, got {steps!r}")
    dens = DensifyConfig(refine_start=min(100, steps // 10), refine_stop=int(0.6 * steps),
                         refine_every=max(steps // 20, 10), reset_every=max(int(0.3 * steps), 1),
                         max_gaussians=4000)
    cfg = TrainConfig(steps=steps, sh_degree=1, sh_degree_interval=max(steps // 4, 1),
                      init_points=1000, densify=dens, eval_every=max(steps // 8, 1),
                      seed=seed, device=device, progress=progress, cpu_threads=1)
    return DemoConfig(train=cfg)


def run_demo(out_dir="arc_warp_demo_out", config: DemoConfig = None, log=print,
             overwrite: bool = False) -> TrainResult:
    """Generate the dataset into out_dir/dataset, train, and write the outputs (PLY,
    ground truth | render PNGs, PSNR plot, metrics.json) into `out_dir`, which must not
    hold an earlier run's results unless `overwrite` (see trainer.train)."""
    from .synthetic import make_synthetic_dataset

    cfg = config or demo_config()
    wp.config.log_level = wp.LOG_WARNING
    start = time.perf_counter()
    data_dir = os.path.join(out_dir, "dataset")
    make_synthetic_dataset(data_dir, cfg.num_train, cfg.num_test, cfg.width, cfg.height,
                           cfg.gt_gaussians, seed=cfg.train.seed, device=cfg.train.device)
    dataset = load_nerf_synthetic(data_dir)
    log(f"dataset: {len(dataset.train)} train + {len(dataset.test)} test views of "
        f"{cfg.width}x{cfg.height} px in {data_dir}")
    result = train(dataset, cfg.train, out_dir, overwrite=overwrite)
    result.wall_s = time.perf_counter() - start
    log(f"final test-view PSNR {result.psnr:.2f} dB (SSIM {result.ssim:.4f}), "
        f"{result.num_gaussians} Gaussians, {result.wall_s:.0f} s")
    for kind, path in result.files.items():
        log(f"  {kind}: {path}")
    return result

