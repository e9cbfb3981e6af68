"""3DGS training on arc_warp: datasets, losses, densification, trainer, demos.

`synthetic` and `datasets` make no torch calls; the rest trains with torch.
"""

from .datasets import Dataset, View, load_colmap, load_dataset, load_nerf_synthetic
from .densify import DensifyConfig
from .distributed import DistContext, init_distributed, launch
from .trainer import TrainConfig, Trainer, TrainResult, train

__all__ = ["Dataset", "DensifyConfig", "DistContext", "TrainConfig", "TrainResult", "Trainer",
           "View", "init_distributed", "launch", "load_colmap", "load_dataset",
           "load_nerf_synthetic", "train"]
