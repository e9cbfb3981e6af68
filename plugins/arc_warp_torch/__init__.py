"""PyTorch adapter for arc_warp: differentiable Gaussian splatting on torch tensors.

- `rasterization(...)`: gsplat-like functional API over batched cameras (gsplat 1.5.3's keywords).
- `arc_warp_torch.inria.GaussianRasterizer` / `GaussianRasterizationSettings` /
  `SparseGaussianAdam`: drop-in for graphdeco-inria's diff_gaussian_rasterization.
- `SparseGaussianAdam`: fused (Warp) Adam over visible Gaussians, or dense.
- `RenderContext`: the renderers (one per image size and settings) a thread reuses across calls.
- `capture_step`: a training step captured whole in `torch.cuda.graph` (one graph
  launch per step), its renders checked after replays.
- `surface_from_mesh`: the surface of a mesh render (`arc_warp_torch.mesh`) for
  `rasterization(surface_colors=, surface_depths=)`.

Tensors are shared with Warp without copies, on torch's current CUDA stream; gradients
come from arc_warp's hand-written (ARC-reduced) backward through torch.autograd.
"""

from ._autograd import RenderContext, default_context
from .capture import CapturedStep, capture_step
from .inria import GaussianRasterizationSettings, GaussianRasterizer
from .optim import SparseGaussianAdam
from .rasterization import RENDER_MODES, rasterization
from .surface import surface_from_mesh

__all__ = ["RENDER_MODES", "CapturedStep", "GaussianRasterizationSettings", "GaussianRasterizer", "RenderContext",
           "SparseGaussianAdam", "capture_step", "default_context", "rasterization", "surface_from_mesh"]
