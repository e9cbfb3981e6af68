"""Gaussian model parameters (raw, optimised values), their optimisers and rendering.

Parameters live in a dict of leaf tensors (the gsplat layout):
  means (N,3) world units; quats (N,4) wxyz, unnormalised; scales (N,3) log std-devs;
  opacities (N,) logits; sh0 (N,1,3) DC SH coefficients; shN (N,K-1,3) higher SH.
One Adam holds them all, one param group per parameter named by its "name" key (INRIA's
layout), so densification can find each parameter's group and edit the rows of its moments.
"""

import math

import numpy as np
import torch

from arc_warp.ply import GaussianPly
from arc_warp.splat import SH_C0  # rgb = SH_C0 * sh0 + 0.5
PARAM_NAMES = ("means", "quats", "scales", "opacities", "sh0", "shN")


def knn_mean_sq_dist(points: torch.Tensor, k: int = 3, chunk: int = 2048) -> torch.Tensor:
    """(M,3) -> (M,) mean squared distance to the k nearest other points (chunked, O(M^2))."""
    m = points.shape[0]
    if m <= 1:
        return torch.ones(m, dtype=points.dtype, device=points.device)
    k = min(k, m - 1)
    out = []
    for start in range(0, m, chunk):
        d2 = torch.cdist(points[start:start + chunk], points).square()
        out.append(d2.topk(k + 1, dim=1, largest=False).values[:, 1:].mean(dim=1))
    return torch.cat(out)


def init_params(points, colors, sh_degree: int, init_opacity: float = 0.1,
                init_scale: float = 1.0, device="cpu") -> dict:
    """Gaussians at `points` (M,3) with RGB `colors` (M,3) in [0,1]: isotropic log-scales from
    the 3-nearest-neighbour distance times `init_scale`, identity rotations, opacity
    `init_opacity`, DC SH from the colours and zero higher SH of degree `sh_degree`."""
    pts = torch.as_tensor(np.asarray(points, np.float32), device=device)
    rgb = torch.as_tensor(np.asarray(colors, np.float32), device=device)
    if pts.ndim != 2 or pts.shape[1] != 3 or rgb.shape != pts.shape or pts.shape[0] == 0:
        raise ValueError(f"init_params: expected points and colors of one shape (M>0,3), got "
                         f"{tuple(pts.shape)} and {tuple(rgb.shape)}")
    n = pts.shape[0]
    dist = torch.sqrt(knn_mean_sq_dist(pts).clamp_min(1e-7)) * init_scale
    quats = torch.zeros(n, 4, device=device)
    quats[:, 0] = 1.0
    k = (sh_degree + 1) ** 2
    raw = {
        "means": pts.clone(),
        "quats": quats,
        "scales": torch.log(dist)[:, None].repeat(1, 3),
        "opacities": torch.full((n,), math.log(init_opacity / (1.0 - init_opacity)), device=device),
        "sh0": ((rgb - 0.5) / SH_C0)[:, None, :],
        "shN": torch.zeros(n, k - 1, 3, device=device),
    }
    return {name: torch.nn.Parameter(raw[name].contiguous()) for name in PARAM_NAMES}


def random_points(count: int, half_extent: float, generator: torch.Generator):
    """`count` points uniform in the cube [-half_extent, half_extent]^3 with uniform random
    colours (the NeRF-synthetic initialisation of 3DGS) -> (points, colors) numpy float32."""
    pts = (torch.rand(count, 3, generator=generator) * 2.0 - 1.0) * half_extent
    return pts.numpy(), torch.rand(count, 3, generator=generator).numpy()


OPTIMIZERS = ("sparse_adam", "fused_adam", "adam")


def make_optimizer(params: dict, lrs: dict, kind: str = "adam",
                   capturable: bool = False) -> torch.optim.Optimizer:
    """One Adam over all parameters (eps 1e-15 as in 3DGS): one param group per parameter, in
    PARAM_NAMES order, each with key "name" (the parameter's) and learning rate `lrs[name]`
    (a float, or with `capturable` a 0-d float32 tensor on the parameters' device).

    Adam updates each parameter from its own moments, step count and group settings, so
    this makes the same updates as one Adam per parameter (the trainer's layout before);
    the fused kinds then update all six parameters in one Warp launch per step.

    kind: "adam" = torch.optim.Adam; "fused_adam" = arc_warp_torch.SparseGaussianAdam
    stepped densely, with torch's bias correction (the same updates); "sparse_adam" = the
    same class stepped over visible Gaussians only (`step(visible, N)`: invisible rows keep
    their values and moments).

    capturable: the captured trainer's optimizer (captured.py): SparseGaussianAdam with
    its step counts and learning rates read on the device, for every kind, "adam"
    included, since only its kernel skips a step whose render overflowed on the device
    (for "adam" it steps densely with torch's bias correction, as "fused_adam")."""
    if kind not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {kind!r}")
    groups = [{"params": [params[name]], "lr": lrs[name], "name": name} for name in PARAM_NAMES]
    if kind == "adam" and not capturable:
        return torch.optim.Adam(groups, eps=1e-15)
    from arc_warp_torch import SparseGaussianAdam

    return SparseGaussianAdam(groups, lr=0.0, eps=1e-15, bias_correction=True,  # lr: per group
                              capturable=capturable)


def render_views(params: dict, viewmats: torch.Tensor, Ks: torch.Tensor, width: int,
                 height: int, sh_degree: int, background, reduce: str = "arc",
                 absgrad: bool = False, camera_model: str = "pinhole", distortion=None):
    """Render C cameras (viewmats (C,4,4), Ks (C,3,3); keep them on the host to spare a
    device round trip) with the active SH degree -> (colors (C,H,W,3), alphas (C,H,W,1),
    meta) from `arc_warp_torch.rasterization`. `background`: RGB, a tuple or a tensor
    (pass a tensor on the parameters' device to avoid a copy per call). The cameras are
    of one `camera_model` ("pinhole" or "fisheye", arc_warp's / gsplat's names) with
    `distortion` (C,K) float32 coefficients in OpenCV's order for it (pinhole k1, k2, p1,
    p2, k3, k4, k5, k6; fisheye k1..k4; `arc_warp.Distortion.coefficients`) or None."""
    from arc_warp_torch.rasterization import rasterization

    k = (sh_degree + 1) ** 2
    sh = torch.cat([params["sh0"], params["shN"]], dim=1)[:, :k, :]
    c = viewmats.shape[0]
    bg = torch.as_tensor(background, dtype=torch.float32, device=params["means"].device)
    lens = {}
    if distortion is not None and camera_model == "fisheye":
        lens["radial_coeffs"] = distortion
    elif distortion is not None:  # gsplat's keywords split OpenCV's vector (slices: no host index)
        lens["radial_coeffs"] = torch.cat([distortion[:, :2], distortion[:, 4:8]], dim=1)
        lens["tangential_coeffs"] = distortion[:, 2:4]
    # raw log-scales and logits: exp and sigmoid run inside the projection (no torch ops)
    return rasterization(
        params["means"], params["quats"], params["scales"], params["opacities"], sh, viewmats, Ks,
        width, height, sh_degree=sh_degree, backgrounds=bg.expand(c, 3).contiguous(), reduce=reduce,
        absgrad=absgrad, scales_activation="exp", opacities_activation="sigmoid",
        camera_model=camera_model, **lens)


def to_ply(params: dict) -> GaussianPly:
    """Parameters -> 3DGS PLY record (raw values, so a written file round-trips exactly)."""
    def np32(name):
        return params[name].detach().cpu().numpy().astype(np.float32)

    means = np32("means")
    return GaussianPly(means, np.zeros_like(means), np32("sh0")[:, 0, :], np32("shN"),
                       np32("opacities"), np32("scales"), np32("quats"))
