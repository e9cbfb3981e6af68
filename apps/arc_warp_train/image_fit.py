"""2D image fitting: optimise Gaussians seen by one camera to reproduce a photograph.

The photograph is matplotlib's bundled sample 'grace_hopper.jpg' (offline, part of the
app extras). Gaussians start at random positions inside the camera frustum with random
colours; Adam fits positions, shapes, opacities and RGB colours to an MSE loss.
"""

import math
import os
import time
from dataclasses import dataclass

import numpy as np
import torch

from .losses import psnr

_DEPTH = (2.5, 3.5)  # world depth range of the initial Gaussians (camera at the origin)


def load_photo(width: int = 64) -> np.ndarray:
    """matplotlib's 'grace_hopper.jpg' resized (box filter) to `width` pixels wide, aspect
    kept -> (H, W, 3) float32 in [0, 1]."""
    import matplotlib.cbook
    from PIL import Image

    path = matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
    with Image.open(path) as im:
        height = max(1, round(im.height * width / im.width))
        im = im.convert("RGB").resize((width, height), Image.BOX)
        return np.asarray(im, np.float32) / 255.0


@dataclass
class ImageFitResult:
    """Final PSNR (dB), the fitted render and the target ((H,W,3) float32), the PSNR history
    [(step, psnr)], the Gaussian count and wall seconds."""

    psnr: float
    render: np.ndarray
    target: np.ndarray
    history: list
    num_gaussians: int
    wall_s: float


def _init(target: torch.Tensor, n: int, gen: torch.Generator, focal: float):
    h, w = target.shape[:2]
    z = _DEPTH[0] + (_DEPTH[1] - _DEPTH[0]) * torch.rand(n, generator=gen)
    u, v = torch.rand(n, generator=gen) * w, torch.rand(n, generator=gen) * h
    means = torch.stack([(u - 0.5 * w) * z / focal, (v - 0.5 * h) * z / focal, z], -1)
    spacing_px = math.sqrt(h * w / n)
    raw = {
        "means": means,
        "quats": torch.randn(n, 4, generator=gen),
        "scales": torch.log(spacing_px * z / focal)[:, None].repeat(1, 3),
        "opacities": torch.zeros(n),  # sigmoid 0.5
        "colors": torch.randn(n, 3, generator=gen),  # logits of RGB
    }
    return {k: torch.nn.Parameter(v.to(target.device).contiguous()) for k, v in raw.items()}


def fit_image(target: np.ndarray, num_gaussians: int = 1500, steps: int = 500, lr: float = 0.01,
              seed: int = 0, device=None, reduce: str = "arc", progress: bool = True,
              eval_every: int = 50) -> ImageFitResult:
    """Fit `num_gaussians` Gaussians to `target` (H,W,3) in [0,1] for `steps` Adam steps."""
    from tqdm.auto import tqdm

    from arc_warp_torch.rasterization import rasterization

    target_np = np.asarray(target, np.float32)
    if target_np.ndim != 3 or target_np.shape[2] != 3:
        raise ValueError(f"fit_image: expected an (H, W, 3) image, got shape {target_np.shape}")
    start = time.perf_counter()
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    gt = torch.as_tensor(target_np, device=dev)
    h, w = gt.shape[:2]
    focal = float(w)
    K = torch.tensor([[focal, 0.0, 0.5 * w], [0.0, focal, 0.5 * h], [0.0, 0.0, 1.0]], device=dev)
    viewmat = torch.eye(4, device=dev)
    params = _init(gt, num_gaussians, torch.Generator().manual_seed(seed), focal)
    opt = torch.optim.Adam(params.values(), lr=lr)

    def render():
        out, _, _ = rasterization(params["means"], params["quats"], params["scales"], params["opacities"],
                                  torch.sigmoid(params["colors"]), viewmat[None], K[None], w, h,
                                  reduce=reduce, scales_activation="exp", opacities_activation="sigmoid")
        return out[0]

    history = []
    bar = tqdm(range(steps), disable=not progress, dynamic_ncols=True, desc="fit image")
    for step in bar:
        image = render()
        loss = ((image - gt) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            history.append((step + 1, psnr(image, gt)))
            bar.set_postfix(loss=f"{loss.item():.5f}", psnr=f"{history[-1][1]:.2f}")
    with torch.no_grad():
        final = render().clamp(0.0, 1.0)
    return ImageFitResult(psnr(final, gt), final.cpu().numpy(), target_np, history,
                          num_gaussians, time.perf_counter() - start)


def run_image_demo(out_dir="arc_warp_demo_out", width: int = 64, steps: int = 500,
                   num_gaussians: int = 1500, seed: int = 0, device=None, progress: bool = True,
                   log=print) -> ImageFitResult:
    """Fit the sample photograph and write image_fit.png (target | fit | error, labelled) and
    image_fit_psnr.png into `out_dir`."""
    from .outputs import comparison, ensure_dir, plot_psnr, write_image

    result = fit_image(load_photo(width), num_gaussians, steps, seed=seed, device=device,
                       progress=progress)
    ensure_dir(out_dir)
    write_image(os.path.join(out_dir, "image_fit.png"),
                comparison(result.target, result.render, result.psnr))
    plot_psnr(os.path.join(out_dir, "image_fit_psnr.png"), {"fit": result.history},
              title="image fit PSNR")
    log(f"image fit: {result.num_gaussians} Gaussians, {steps} steps, PSNR {result.psnr:.2f} dB, "
        f"{result.wall_s:.0f} s -> {os.path.join(out_dir, 'image_fit.png')}")
    return result
