"""Photometric losses and metrics for (B, H, W, 3) float images in [0, 1]."""

import functools
import math

import torch
import torch.nn.functional as F

SSIM_WINDOW = 11
SSIM_SIGMA = 1.5
SSIM_C1 = 0.01 ** 2
SSIM_C2 = 0.03 ** 2


@functools.lru_cache(maxsize=8)
def _gauss_taps(size: int, sigma: float, device: str, dtype: torch.dtype) -> torch.Tensor:
    """(1,1,1,size) normalised 1D Gaussian; the 2D window is separable."""
    x = torch.arange(size, dtype=torch.float64) - (size - 1) / 2.0
    g = torch.exp(-x * x / (2.0 * sigma * sigma))
    return (g / g.sum()).to(device=device, dtype=dtype).reshape(1, 1, 1, size)


def _check_pair(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.shape != b.shape or a.dim() != 4 or a.shape[-1] != 3:
        raise ValueError(f"expected two (B,H,W,3) images of one shape, got {tuple(a.shape)} "
                         f"and {tuple(b.shape)}")


def ssim(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Mean SSIM of (B,H,W,3) images: 11x11 Gaussian window (sigma 1.5), zero padding,
    C1 = 0.01^2, C2 = 0.03^2 (the 3DGS definition). Differentiable."""
    _check_pair(a, b)
    x, y = a.permute(0, 3, 1, 2), b.permute(0, 3, 1, 2)
    taps = _gauss_taps(SSIM_WINDOW, SSIM_SIGMA, str(x.device), x.dtype).expand(3, 1, 1, -1)
    pad = SSIM_WINDOW // 2

    def blur(t):  # separable: rows then columns, zero padding
        t = F.conv2d(t, taps, padding=(0, pad), groups=3)
        return F.conv2d(t, taps.transpose(2, 3), padding=(pad, 0), groups=3)

    mu_x, mu_y = blur(x), blur(y)
    var_x = blur(x * x) - mu_x * mu_x
    var_y = blur(y * y) - mu_y * mu_y
    cov = blur(x * y) - mu_x * mu_y
    num = (2 * mu_x * mu_y + SSIM_C1) * (2 * cov + SSIM_C2)
    den = (mu_x * mu_x + mu_y * mu_y + SSIM_C1) * (var_x + var_y + SSIM_C2)
    return (num / den).mean()


def photometric_loss(render: torch.Tensor, target: torch.Tensor, ssim_lambda: float = 0.2):
    """(1 - lambda) * L1 + lambda * (1 - SSIM) on (B,H,W,3) images -> (loss, l1, ssim)."""
    _check_pair(render, target)
    l1 = (render - target).abs().mean()
    s = ssim(render, target)
    return (1.0 - ssim_lambda) * l1 + ssim_lambda * (1.0 - s), l1, s


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    """PSNR in dB of images in [0,1] (`a` clamped to [0,1] first), over all elements."""
    return mse_to_psnr(float(((a.detach().clamp(0.0, 1.0) - b.detach()) ** 2).mean()))


def mse_to_psnr(mse: float) -> float:
    """PSNR in dB of a mean squared error of images in [0,1]."""
    return float("inf") if mse == 0.0 else -10.0 * math.log10(mse)
