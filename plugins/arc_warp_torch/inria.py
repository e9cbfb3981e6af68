"""Drop-in for graphdeco-inria's `diff_gaussian_rasterization` (the 3DGS reference code):
`from arc_warp_torch.inria import GaussianRasterizationSettings, GaussianRasterizer`
replaces its import, and the rest of a 3DGS training script stays as it is. Differences
from the CUDA original are listed on `GaussianRasterizer`."""

from typing import NamedTuple, Optional

import torch
from torch import nn

from arc_warp import Camera, RenderSettings

from ._autograd import Means2dSink, cameras_of, check_tensor, default_context, render_batch, sh_colors
from .optim import SparseGaussianAdam  # noqa: F401  (INRIA's train.py imports it from here)

INRIA_NEAR = 0.2  # INRIA culls Gaussians whose view-space depth is <= 0.2 (in_frustum in its CUDA code)
INRIA_BLOCK = 16  # INRIA's tiles (BLOCK_X, BLOCK_Y): a Gaussian whose 3-sigma square touches none gets radius 0
INRIA_DILATION, INRIA_EIG_FLOOR = 0.3, 0.1  # INRIA's 2D dilation (computeCov2D), its radii's eigenvalue floor


class GaussianRasterizationSettings(NamedTuple):
    """INRIA's settings record, same field names and order.

    image_height, image_width: ints, pixels. tanfovx, tanfovy: tan(fov/2). bg: [3] RGB
    background tensor. scale_modifier: multiplies every scale. viewmatrix: [4, 4] TRANSPOSED
    world-to-view matrix (INRIA's column-major `world_view_transform`), OpenCV axes.
    projmatrix, campos, prefiltered, debug: not used. antialiasing: the Mip-Splatting 2D
    filter. reduce / threshold (arc_warp extras, optional): arc_warp.RenderSettings'.
    """

    image_height: int
    image_width: int
    tanfovx: float
    tanfovy: float
    bg: torch.Tensor
    scale_modifier: float
    viewmatrix: torch.Tensor
    projmatrix: torch.Tensor
    sh_degree: int
    campos: torch.Tensor
    prefiltered: bool
    debug: bool = False
    antialiasing: bool = False
    reduce: str = "arc"
    threshold: Optional[int] = None


def _intrinsics(s: GaussianRasterizationSettings) -> tuple[float, float, float, float]:
    """INRIA's (fx, fy, cx, cy) in pixels: f = size / (2 tan(fov / 2)), the principal point at
    the image centre."""
    w, h = s.image_width, s.image_height
    return w / (2.0 * float(s.tanfovx)), h / (2.0 * float(s.tanfovy)), 0.5 * w, 0.5 * h


def _w2c(s: GaussianRasterizationSettings, device: torch.device) -> torch.Tensor:
    """The checked settings' [4, 4] float32 world-to-camera matrix (row-major) on ``device``
    (a GPU viewmatrix is not copied to the host)."""
    for name in ("image_width", "image_height"):
        v = getattr(s, name)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"raster_settings.{name}: expected a positive int, got {v!r}")
    tx, ty = float(s.tanfovx), float(s.tanfovy)
    if not (tx > 0.0 and ty > 0.0):
        raise ValueError(f"raster_settings.tanfovx/tanfovy: expected > 0, got {tx}, {ty}")
    vm = s.viewmatrix
    if not isinstance(vm, torch.Tensor) or tuple(vm.shape) != (4, 4):
        got = list(vm.shape) if isinstance(vm, torch.Tensor) else type(vm).__name__
        raise ValueError(f"raster_settings.viewmatrix: expected a [4, 4] tensor, got {got}")
    return vm.detach().to(device, torch.float32).t()


@torch.no_grad()
def inria_radii(means3D: torch.Tensor, scales: torch.Tensor, rotations: torch.Tensor,
                s: GaussianRasterizationSettings, w2c: torch.Tensor) -> torch.Tensor:
    """[N] int32 radii as INRIA's preprocess defines them: ceil(3 sqrt(lambda_max)) of the
    2D covariance after its +0.3 dilation (lambda = mid +- sqrt(max(0.1, mid^2 - det))),
    0 where INRIA culls: view depth <= 0.2, a singular 2D covariance, or a 3-sigma square
    that touches no 16x16 tile of the image (in INRIA's pixel coordinates, centres at
    integers). means3D [N,3], scales [N,3] linear (scale_modifier applied), rotations
    [N,4] wxyz, ``w2c`` [4, 4] the settings' world-to-camera matrix, row-major."""
    fx, fy, cx, cy = _intrinsics(s)
    rot = w2c[:3, :3]
    t = means3D.float() @ rot.T + w2c[:3, 3]
    z = t[:, 2]
    safe_z = torch.where(z > INRIA_NEAR, z, torch.ones_like(z))
    limx, limy = 1.3 * float(s.tanfovx), 1.3 * float(s.tanfovy)
    tx = torch.clamp(t[:, 0] / safe_z, -limx, limx) * safe_z
    ty = torch.clamp(t[:, 1] / safe_z, -limy, limy) * safe_z
    zero = torch.zeros_like(z)
    jac = torch.stack([
        torch.stack([fx / safe_z, zero, -fx * tx / safe_z ** 2], -1),
        torch.stack([zero, fy / safe_z, -fy * ty / safe_z ** 2], -1)], -2)
    q = torch.nn.functional.normalize(rotations.float(), dim=-1)
    w, x, y, zq = q.unbind(-1)
    r3 = torch.stack([
        1 - 2 * (y * y + zq * zq), 2 * (x * y - w * zq), 2 * (x * zq + w * y),
        2 * (x * y + w * zq), 1 - 2 * (x * x + zq * zq), 2 * (y * zq - w * x),
        2 * (x * zq - w * y), 2 * (y * zq + w * x), 1 - 2 * (x * x + y * y)], -1).reshape(-1, 3, 3)
    m = rot @ (r3 * scales.float()[:, None, :])
    cov2d = jac @ (m @ m.transpose(1, 2)) @ jac.transpose(1, 2)
    a, b, c = cov2d[:, 0, 0] + INRIA_DILATION, cov2d[:, 0, 1], cov2d[:, 1, 1] + INRIA_DILATION
    det, mid = a * c - b * b, 0.5 * (a + c)
    spread = torch.sqrt(torch.clamp(mid * mid - det, min=INRIA_EIG_FLOOR))
    radius = torch.ceil(3.0 * torch.sqrt(torch.maximum(mid + spread, mid - spread)))
    # INRIA's ndc2Pix puts pixel centres at integers: half a pixel left of ours.
    px, py = fx * t[:, 0] / safe_z + cx - 0.5, fy * t[:, 1] / safe_z + cy - 0.5
    grid_x, grid_y = (s.image_width + INRIA_BLOCK - 1) // INRIA_BLOCK, (s.image_height + INRIA_BLOCK - 1) // INRIA_BLOCK

    def tiles(lo, hi, grid):  # getRect: C casts truncate toward zero, then clamp
        first = torch.clamp(torch.trunc(lo / INRIA_BLOCK), 0, grid)
        last = torch.clamp(torch.trunc((hi + INRIA_BLOCK - 1) / INRIA_BLOCK), 0, grid)
        return last - first

    touched = tiles(px - radius, px + radius, grid_x) * tiles(py - radius, py + radius, grid_y)
    visible = (z > INRIA_NEAR) & (det != 0) & (touched > 0) & torch.isfinite(radius)
    return torch.where(visible, radius, torch.zeros_like(radius)).to(torch.int32)


class GaussianRasterizer(nn.Module):
    """INRIA-compatible rasterizer module on arc_warp (CPU or CUDA tensors). Differences from
    diff_gaussian_rasterization: no cov3D_precomp (NotImplementedError); culling by arc_warp's
    opacity-aware extent, though the radii returned (and their visibility, radii > 0) are
    INRIA's (inria_radii), so its densification behaves as with INRIA's; the inverse depth is
    alpha / expected_depth (= alpha^2 / sum_i w_i z_i), INRIA's sum_i w_i / z_i wherever one
    depth dominates a pixel (harmonic vs arithmetic mean across overlapping layers); no
    gradients to viewmatrix/projmatrix/campos."""

    def __init__(self, raster_settings: GaussianRasterizationSettings):
        super().__init__()
        self.raster_settings = raster_settings

    def markVisible(self, positions: torch.Tensor) -> torch.Tensor:  # noqa: N802 (INRIA name)
        """[N, 3] world positions -> [N] bool, True where the view-space depth exceeds 0.2."""
        positions = check_tensor("positions", positions, (None, 3))
        vm = self.raster_settings.viewmatrix.to(positions.device, torch.float32)
        with torch.no_grad():
            z = positions @ vm[:3, 2] + vm[3, 2]
        return z > INRIA_NEAR

    def forward(self,
                means3D: torch.Tensor,  # [N, 3]
                means2D: torch.Tensor,  # [N, 2 or 3] zeros; .grad gets the screen-space gradient
                opacities: torch.Tensor,  # [N, 1] or [N] in [0, 1]
                shs: Optional[torch.Tensor] = None,  # [N, K, 3] SH coefficients
                colors_precomp: Optional[torch.Tensor] = None,  # [N, 3] RGB
                scales: Optional[torch.Tensor] = None,  # [N, 3] linear
                rotations: Optional[torch.Tensor] = None,  # [N, 4] wxyz
                cov3D_precomp: Optional[torch.Tensor] = None,  # unsupported
                dc: Optional[torch.Tensor] = None):  # [N, 1, 3] or [N, 3] degree-0 SH
        """Render one camera. Returns (color [3, H, W] with the background bg, radii [N]
        int32 (inria_radii), invdepth [1, H, W]). dc with shs (as INRIA's current train.py
        passes features_dc and features_rest): the SH coefficients are dc then shs; dc
        alone is degree 0. In backward, means2D.grad[:, :2] receives dL/d(projected mean)
        in INRIA's NDC-scaled units (pixel gradient times W/2, H/2; further columns get 0)."""
        s = self.raster_settings
        means3D = check_tensor("means3D", means3D, (None, 3))
        n, device = means3D.shape[0], means3D.device
        if dc is not None:
            if colors_precomp is not None:
                raise ValueError("dc (SH degree 0) and colors_precomp exclude each other")
            dc = check_tensor("dc", dc, (n, 1, 3) if getattr(dc, "ndim", 0) == 3 else (n, 3), device).reshape(n, 1, 3)
            shs = dc if shs is None else torch.cat([dc, check_tensor("shs", shs, (n, None, 3), device)], dim=1)
        if (shs is None) == (colors_precomp is None):
            raise ValueError("Please provide exactly one of either shs or colors_precomp")
        if cov3D_precomp is not None:
            raise NotImplementedError(
                "arc_warp_torch.inria: cov3D_precomp is not supported; pass scales (linear, [N, 3]) and rotations "
                "(wxyz quaternions, [N, 4]) instead (in the 3DGS code: pipe.compute_cov3D_python = False)")
        if scales is None or rotations is None:
            raise ValueError("Please provide both scales and rotations (cov3D_precomp is not supported)")
        w2c = _w2c(s, device)
        if isinstance(opacities, torch.Tensor) and opacities.shape == (n, 1):
            opacities = opacities.reshape(n)
        opacities = check_tensor("opacities", opacities, (n,), device)
        scales = check_tensor("scales", scales, (n, 3), device) * float(s.scale_modifier)
        rotations = check_tensor("rotations", rotations, (n, 4), device)
        if shs is not None:
            sh_degree, colors = sh_colors("shs", shs, n, s.sh_degree, device)
        else:
            sh_degree, colors = None, check_tensor("colors_precomp", colors_precomp, (n, 3), device)
        bg = check_tensor("raster_settings.bg", s.bg, (3,), device)

        sink = None
        if isinstance(means2D, torch.Tensor) and means2D.requires_grad and torch.is_grad_enabled():
            if means2D.dim() != 2 or means2D.shape[0] != n or means2D.shape[1] < 2:
                raise ValueError(f"means2D: expected shape [N={n}, 2 or 3], got {list(means2D.shape)}")
            if means2D.device != device:
                raise ValueError(f"means2D: expected device {device}, got {means2D.device}")
            sink = Means2dSink(means2D, scale=(0.5 * s.image_width, 0.5 * s.image_height))
        settings = RenderSettings(sh_degree=sh_degree, reduce=s.reduce, threshold=s.threshold,
                                  antialiased=bool(s.antialiasing))
        fx, fy, cx, cy = _intrinsics(s)
        k = torch.tensor([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]])
        if device.type == "cuda":  # copied from pinned memory without a wait
            k = k.pin_memory().to(device, non_blocking=True)
        cameras, held = cameras_of(w2c[None], k[None], s.image_width, s.image_height, INRIA_NEAR, Camera.far, device)
        batch = render_batch(means3D, rotations, scales, opacities, colors, cameras, settings, sink,
                             default_context(device))
        del held  # read by the queued projection: torch frees them in stream order
        rgb, alpha, depth = batch.color[0], batch.alpha[0, ..., 0], batch.depth[0]
        color = (rgb + (1.0 - alpha)[..., None] * bg).permute(2, 0, 1)
        has_depth = depth > 0.0
        invdepth = torch.where(has_depth, alpha * alpha / torch.where(has_depth, depth, 1.0), torch.zeros_like(depth))
        radii = inria_radii(means3D, scales, rotations, s, w2c)
        return color, radii, invdepth[None]
