"""`diff_gaussian_rasterization` served by arc_warp: INRIA's 3DGS code runs unmodified.

Put this package's parent folder first on the module path, ahead of any installed CUDA
`diff_gaussian_rasterization`:

    PYTHONPATH=/path/to/arc_warp/plugins/inria_shim:$PYTHONPATH python train.py -s DATA ...

Every name INRIA's train.py, render.py and gaussian_renderer import resolves to
`arc_warp_torch.inria`. The package has no `_C`, so INRIA's optional fused-SSIM import
(`from diff_gaussian_rasterization._C import fusedssim`, inside try) falls back to its
torch SSIM. The package is not installed by `pip install` (it would shadow INRIA's own);
it is used only through this path.
"""

from arc_warp_torch.inria import (  # noqa: F401
    GaussianRasterizationSettings,
    GaussianRasterizer,
    SparseGaussianAdam,
)

__all__ = ["GaussianRasterizationSettings", "GaussianRasterizer", "SparseGaussianAdam"]
