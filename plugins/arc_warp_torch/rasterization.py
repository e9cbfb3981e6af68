"""gsplat-like functional API: `rasterization(...)` over a batch of cameras, with gsplat
1.5.3's keywords."""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from arc_warp import RenderSettings

from ._autograd import RenderContext, cameras_of, check_tensor, default_context, render_batch, sh_colors

RENDER_MODES = ("RGB", "D", "ED", "RGB+D", "RGB+ED")
# scales_activation / opacities_activation -> RenderSettings.scale_activation / opacity_activation
SCALES_ACTIVATIONS = {None: "none", "exp": "exp"}
OPACITIES_ACTIVATIONS = {None: "none", "sigmoid": "sigmoid"}
# gsplat 1.5.3 keywords arc_warp accepts only at these values (gsplat's defaults: the feature off)
UNSUPPORTED = {"radius_clip": 0.0, "tile_size": 16, "sparse_grad": False, "distributed": False, "segmented": False,
               "covars": None, "with_eval3d": False, "thin_prism_coeffs": None, "ftheta_coeffs": None,
               "viewmats_rs": None}
CAMERA_MODELS = ("pinhole", "ortho", "fisheye")


def _option(name: str, value, allowed: dict) -> str:
    """``allowed[value]``, or a ValueError naming the keyword and its allowed values."""
    if isinstance(value, (str, type(None))) and value in allowed:
        return allowed[value]
    raise ValueError(f"{name}: expected one of {tuple(allowed)}, got {value!r}")


def _distortion(camera_model: str, radial, tangential, viewmats) -> Optional[torch.Tensor]:
    """gsplat's distortion keywords as [C, K] coefficients in OpenCV's order for the model
    (pinhole: k1, k2, p1, p2, k3, k4, k5, k6; fisheye: k1..k4), or None."""
    if radial is None and tangential is None:
        return None
    c = viewmats.shape[0] if isinstance(viewmats, torch.Tensor) and viewmats.dim() == 3 else None
    if camera_model == "fisheye":
        if tangential is not None:
            raise ValueError("tangential_coeffs: a fisheye camera has no tangential distortion (OpenCV's fisheye "
                             "model reads k1..k4 only); pass radial_coeffs [C, 4]")
        return check_tensor("radial_coeffs", radial, (c, 4))
    if camera_model != "pinhole":
        raise ValueError(f"radial_coeffs / tangential_coeffs: a {camera_model!r} camera has no lens distortion")
    radial = None if radial is None else check_tensor("radial_coeffs", radial, (c, 6))
    tangential = None if tangential is None else check_tensor("tangential_coeffs", tangential, (c, 2))
    # on the device of the coefficients given: CUDA ones stay there (a CUDA graph can hold the render)
    device = (radial if radial is not None else tangential).device
    radial = torch.zeros(c, 6, device=device) if radial is None else radial
    tangential = torch.zeros(c, 2, device=device) if tangential is None else tangential.to(device)
    return torch.cat([radial[:, :2], tangential, radial[:, 2:]], dim=1)


def rasterization(
    means: torch.Tensor,  # [N, 3]
    quats: torch.Tensor,  # [N, 4] wxyz, any norm > 0
    scales: torch.Tensor,  # [N, 3] linear (log-scales with scales_activation="exp")
    opacities: torch.Tensor,  # [N] in [0, 1] (logits with opacities_activation="sigmoid")
    colors: torch.Tensor,  # [N, 3] RGB or [N, K, 3] SH
    viewmats: torch.Tensor,  # [C, 4, 4] world-to-camera
    Ks: torch.Tensor,  # [C, 3, 3]
    width: int,
    height: int,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    radius_clip: float = 0.0,
    eps2d: float = 0.3,
    sh_degree: Optional[int] = None,
    packed: bool = True,
    tile_size: int = 16,
    backgrounds: Optional[torch.Tensor] = None,  # [3] or [C, 3]
    render_mode: str = "RGB",
    sparse_grad: bool = False,
    absgrad: bool = False,
    rasterize_mode: str = "classic",
    channel_chunk: int = 32,
    distributed: bool = False,
    camera_model: str = "pinhole",
    segmented: bool = False,
    covars: Optional[torch.Tensor] = None,
    with_ut: bool = False,
    with_eval3d: bool = False,
    radial_coeffs: Optional[torch.Tensor] = None,
    tangential_coeffs: Optional[torch.Tensor] = None,
    thin_prism_coeffs: Optional[torch.Tensor] = None,
    ftheta_coeffs=None,
    rolling_shutter=None,
    viewmats_rs: Optional[torch.Tensor] = None,
    *,
    reduce: str = "arc",
    threshold: Optional[int] = None,
    context: Optional[RenderContext] = None,
    scales_activation: Optional[str] = None,
    opacities_activation: Optional[str] = None,
    surface_colors: Optional[torch.Tensor] = None,  # [C, H, W, 3]
    surface_depths: Optional[torch.Tensor] = None,  # [C, H, W] camera z, +inf: no surface
) -> Tuple[torch.Tensor, torch.Tensor, dict]:
    """Differentiable 3D Gaussian splatting of N Gaussians into C cameras, with gsplat
    1.5.3's signature (its keywords, in its order) and conventions: camera +x right, +y
    down, +z forward; `viewmats` are world-to-camera; K = [[fx,0,cx],[0,fy,cy],[0,0,1]] in
    pixels; pixel centres at +0.5. Inputs may be float16/32/64 on "cpu" or "cuda" (all
    Gaussian tensors on one device), cast to float32 only when needed; gradients come back
    in their dtype (to means, quats, scales, opacities, colors, backgrounds and
    surface_colors, the raw tensors passed). Double backward raises RuntimeError.

    gsplat keywords not listed under Args are accepted with no effect (packed: meta is
    always dense, [C, N, ...], as gsplat's packed=False; channel_chunk; with_ut: distorted
    cameras project each Gaussian through the lens, its covariance with the camera's
    Jacobian at its mean) or only at gsplat's default (``UNSUPPORTED``; rolling_shutter:
    global shutter), else NotImplementedError.

    Args:
        means: [N, 3] Gaussian centres, world units.
        quats: [N, 4] wxyz rotations of any norm > 0 (normalised inside the projection).
        scales: [N, 3] per-axis standard deviations, world units (log-scales with
            scales_activation="exp").
        opacities: [N] in [0, 1] (logits with opacities_activation="sigmoid").
        colors: [N, 3] RGB, or [N, K, 3] SH coefficients (evaluated per camera with the view
            direction; 0.5 is added and the result clamped at 0, as in gsplat/INRIA).
        viewmats, Ks: [C, 4, 4] world-to-camera and [C, 3, 3] intrinsics (pixels), C >= 1,
            not differentiable (ValueError if they require grad); CUDA tensors on the
            device of `means` are read and checked there, by the projection kernel.
        width, height: image size in pixels.
        near_plane, far_plane: Gaussians with camera depth outside are culled (world units).
        eps2d: dilation added to the 2D covariance's diagonal, pixels^2.
        sh_degree: SH degree 0..3 of [N, K, 3] colors (their first (d+1)^2 coefficients);
            None infers it from K = (d+1)^2; must be None for [N, 3] RGB.
        backgrounds: [3] or [C, 3] RGB composited as rgb + (1 - alpha) * background.
        render_mode: "RGB", "D" (depth sum w_i z_i), "ED" (expected depth D / alpha, 0
            where alpha is 0), "RGB+D" or "RGB+ED" (depth as a 4th channel).
        absgrad: also accumulate |dL/dmeans2d| per pixel into `meta["means2d"].absgrad`.
        rasterize_mode: "classic", or "antialiased" for the Mip-Splatting 2D filter.
        camera_model: "pinhole", "ortho" (fx, fy: pixels per world unit) or "fisheye"
            (equidistant, r = f theta), gsplat's conventions.
        radial_coeffs, tangential_coeffs: OpenCV distortion per camera: [C, 6] pinhole
            k1..k6 or [C, 4] fisheye k1..k4, and [C, 2] p1, p2 (pinhole).
        reduce, threshold: (arc_warp) `arc_warp.RenderSettings`' ("deterministic" whatever
            `reduce` says under torch.use_deterministic_algorithms(True)).
        context: (arc_warp) the `RenderContext` whose renderers to use; None uses
            `default_context` of the device (one per device and thread).
        scales_activation, opacities_activation: (arc_warp) None, or "exp" / "sigmoid"
            applied inside the projection (the gradient lands on the raw tensor).
        surface_colors, surface_depths: (arc_warp) an opaque surface behind the Gaussians,
            both or neither (`arc_warp_torch.surface_from_mesh` makes them): per camera and
            pixel an RGB colour and a camera depth (+inf: none), composited as
            `arc_warp.Surface` says; the background shows only where the depth is +inf.

    Returns:
        render_colors: [C, H, W, 3] for "RGB", [C, H, W, 4] for "RGB+D"/"RGB+ED",
            [C, H, W, 1] for "D"/"ED"; float32 on the device of `means`.
        render_alphas: [C, H, W, 1] float32 accumulated opacity.
        meta: "means2d": [C, N, 2] float32 projected centres in pixels; with gradients
            enabled a leaf whose .grad receives dL/dmeans2d while the caller holds it (for
            densification; .retain_grad() is harmless), and with absgrad its .absgrad.
            "radii": [C, N, 2] int32 extents in pixels, (0, 0) = culled. "width",
            "height", "n_cameras": ints. "status": the render's `arc_warp.RenderStatus`
            (read as `RenderContext` says); pass it to `SparseGaussianAdam.step(skip=...)`.

    Raises:
        TypeError / ValueError: wrong types, dtypes, shapes, devices or options, before
            anything is queued; ValueError for non-finite values, zero quaternions or
            invalid CUDA cameras once the device has found them (see "status").
        NotImplementedError: a gsplat keyword at a value arc_warp does not support.
    """
    passed = {"radius_clip": radius_clip, "tile_size": tile_size, "sparse_grad": sparse_grad,
              "distributed": distributed, "segmented": segmented, "covars": covars, "with_eval3d": with_eval3d,
              "thin_prism_coeffs": thin_prism_coeffs, "ftheta_coeffs": ftheta_coeffs, "viewmats_rs": viewmats_rs}
    for name, default in UNSUPPORTED.items():
        value = passed[name]
        if value is not default and not (default is not None and type(value) in (int, float, bool)
                                         and value == default):
            shown = f"<tensor {list(value.shape)}>" if isinstance(value, torch.Tensor) else repr(value)
            raise NotImplementedError(f"rasterization: {name}={shown} is not supported by arc_warp "
                                      f"(only {name}={default!r}); see the README's list of gsplat keywords")
    if rolling_shutter is not None and getattr(rolling_shutter, "name", rolling_shutter) not in ("GLOBAL", 0):
        raise NotImplementedError(f"rasterization: rolling_shutter={rolling_shutter!r} is not supported by arc_warp "
                                  "(only global shutter; ARCHITECTURE.md says why)")
    if camera_model not in CAMERA_MODELS:
        raise NotImplementedError(f"rasterization: camera_model={camera_model!r} is not supported by arc_warp "
                                  f"(supported: {CAMERA_MODELS})")
    if render_mode not in RENDER_MODES:
        raise ValueError(f"render_mode: expected one of {RENDER_MODES}, got {render_mode!r}")
    if rasterize_mode not in ("classic", "antialiased"):
        raise ValueError(f"rasterize_mode: expected 'classic' or 'antialiased', got {rasterize_mode!r}")
    for name, v in (("width", width), ("height", height)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"{name}: expected a positive int, got {v!r}")
    means = check_tensor("means", means, (None, 3))
    device, n = means.device, means.shape[0]
    quats = check_tensor("quats", quats, (n, 4), device)
    scales = check_tensor("scales", scales, (n, 3), device)
    opacities = check_tensor("opacities", opacities, (n,), device)
    sh_degree, colors = sh_colors("colors", colors, n, sh_degree, device)
    distortion = _distortion(camera_model, radial_coeffs, tangential_coeffs, viewmats)
    cameras, camera_tensors = cameras_of(viewmats, Ks, width, height, near_plane, far_plane, device, camera_model,
                                         distortion)
    c = len(cameras)
    if backgrounds is not None:
        if not isinstance(backgrounds, torch.Tensor) or backgrounds.shape not in ((3,), (c, 3)):
            got = list(backgrounds.shape) if isinstance(backgrounds, torch.Tensor) else type(backgrounds).__name__
            raise ValueError(f"backgrounds: expected a [3] or [{c}, 3] tensor, got {got}")
        backgrounds = check_tensor("backgrounds", backgrounds.expand(c, 3), (c, 3), device)
    surfaces = None
    if surface_colors is not None or surface_depths is not None:
        if surface_colors is None or surface_depths is None:
            raise ValueError("surface_colors and surface_depths go together: give both (+inf depth where a pixel has "
                             "no surface) or neither")
        surfaces = (check_tensor("surface_colors", surface_colors, (c, height, width, 3), device),
                    check_tensor("surface_depths", surface_depths.detach(), (c, height, width), device))
    if context is None:
        context = default_context(device)
    elif context.device != device:
        raise ValueError(f"context: it is on {context.device}, the Gaussians on {device}")
    need_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (means, quats, scales, opacities, colors))
    settings = RenderSettings(
        sh_degree=sh_degree, reduce=reduce, threshold=threshold, eps2d=float(eps2d), absgrad=absgrad and need_grad,
        antialiased=rasterize_mode == "antialiased",
        scale_activation=_option("scales_activation", scales_activation, SCALES_ACTIVATIONS),
        opacity_activation=_option("opacities_activation", opacities_activation, OPACITIES_ACTIVATIONS))

    r = render_batch(means, quats, scales, opacities, colors, cameras, settings, None, context,
                     depths=render_mode != "RGB", means2d_grad=need_grad, surfaces=surfaces)
    del camera_tensors  # read by the queued projection: torch frees them in stream order
    channels = []
    if render_mode.startswith("RGB"):
        rgb = r.color
        if backgrounds is not None:
            shown = 1.0 - r.alpha  # the background shows where the surface does not
            if surfaces is not None:
                shown = shown * torch.isposinf(surfaces[1])[..., None]
            rgb = rgb + shown * backgrounds[:, None, None, :]
        channels.append(rgb)
    if render_mode.endswith("ED"):
        channels.append(r.expected_depth[..., None])
    elif render_mode.endswith("D"):
        channels.append(r.depth[..., None])
    render_colors = channels[0] if len(channels) == 1 else torch.cat(channels, dim=-1)
    meta = {"means2d": r.means2d, "radii": r.radii, "width": width, "height": height, "n_cameras": c,
            "status": r.status}
    return render_colors, r.alpha, meta
