"""`diff_gaussian_rasterization` with the API of INRIA's 2023 rasterizer, served by arc_warp.

INRIA's gaussian-splatting before its August 2024 release (rasterizer 59f5f77) unpacks
two outputs, `rendered_image, radii = rasterizer(...)`, and knows no SparseGaussianAdam;
the current release (plugins/inria_shim) takes three. Put this package's parent folder
first on the module path to run such a train.py unmodified:

    PYTHONPATH=/path/to/arc_warp/plugins/inria_shim_2023:$PYTHONPATH python train.py ...

Rendering, radii and gradients are those of `arc_warp_torch.inria`. Not installed by pip.
"""

from arc_warp_torch.inria import GaussianRasterizationSettings  # noqa: F401
from arc_warp_torch.inria import GaussianRasterizer as _CurrentRasterizer

__all__ = ["GaussianRasterizationSettings", "GaussianRasterizer"]


class GaussianRasterizer(_CurrentRasterizer):
    """arc_warp_torch.inria.GaussianRasterizer returning (color [3, H, W], radii [N] int32),
    without the inverse-depth image, as INRIA's 2023 rasterizer."""

    def forward(self, *args, **kwargs):
        color, radii, _ = super().forward(*args, **kwargs)
        return color, radii
