"""gsplat-like functional API: `rasterization(...)` over a batch of cameras."""

import math
from typing import Optional, Tuple

import torch

from arc_warp import DeviceCameras

from ._autograd import RenderContext, check_tensor, default_context, render_batch

RENDER_MODES = ("RGB", "D", "ED", "RGB+D", "RGB+ED")
# scales_activation / opacities_activation -> RenderSettings.scale_activation / opacity_activation
SCALES_ACTIVATIONS = {None: "none", "exp": "exp"}
OPACITIES_ACTIVATIONS = {None: "none", "sigmoid": "sigmoid"}


def _sh_degree_and_colors(colors, n: int, sh_degree: Optional[int], device):
    """Validate colors; return (sh_degree or None, float32 colors with exactly the needed
    SH coefficients). [N,K,3] with sh_degree None infers the degree from K = (d+1)^2."""
    if not isinstance(colors, torch.Tensor):
        raise TypeError(f"colors: expected a torch.Tensor, got {type(colors).__name__}")
    if colors.dim() == 2:
        if sh_degree is not None:
            raise ValueError(f"colors: sh_degree={sh_degree} needs SH coefficients [N, K, 3], "
                             f"got RGB shape {list(colors.shape)}")
        return None, check_tensor("colors", colors, (n, 3), device)
    colors = check_tensor("colors", colors, (n, None, 3), device)
    k = colors.shape[1]
    if sh_degree is None:
        sh_degree = math.isqrt(k) - 1
        if (sh_degree + 1) ** 2 != k:
            raise ValueError(f"colors: [N, K, 3] with sh_degree=None needs K = (d+1)^2, got K={k}")
    if not isinstance(sh_degree, int) or not 0 <= sh_degree <= 3:
        raise ValueError(f"sh_degree: expected None or an int in 0..3, got {sh_degree!r}")
    needed = (sh_degree + 1) ** 2
    if k < needed:
        raise ValueError(f"colors: sh_degree={sh_degree} needs K >= {needed} coefficients, got K={k}")
    if k > needed:
        colors = colors[:, :needed].contiguous()
    return sh_degree, colors


def _option(name: str, value, allowed: dict) -> str:
    """``allowed[value]``, or a ValueError naming the keyword and its allowed values."""
    if isinstance(value, (str, type(None))) and value in allowed:
        return allowed[value]
    raise ValueError(f"{name}: expected one of {tuple(allowed)}, got {value!r}")


def _cameras(viewmats, Ks, width: int, height: int, near_plane: float, far_plane: float,
             context: RenderContext):
    """Validate [C,4,4] viewmats and [C,3,3] Ks; return the cameras to render.

    CUDA tensors on the context's device stay there: `arc_warp.DeviceCameras` views of
    them, read by the projection kernel (no host copy, no sync; their values are checked
    on the device). Host tensors are read in place into C `Camera`s (cached by value in
    `context`); CUDA tensors on another device come to the host in one copy."""
    last = context.last_cameras
    if (last is not None and last[0] is viewmats and last[1] is Ks
            and last[2] == _camera_state(viewmats, Ks, width, height, near_plane, far_plane)):
        return last[3]  # the same device tensors as the last call: checked then, read on the device
    if not isinstance(viewmats, torch.Tensor) or not isinstance(Ks, torch.Tensor):
        raise TypeError(f"viewmats, Ks: expected torch.Tensors, got {type(viewmats).__name__}, "
                        f"{type(Ks).__name__}")
    if viewmats.dim() != 3 or tuple(viewmats.shape[1:]) != (4, 4) or not viewmats.is_floating_point():
        raise ValueError(f"viewmats: expected a float [C, 4, 4] tensor, got {viewmats.dtype} "
                         f"{list(viewmats.shape)}")
    if Ks.shape != (viewmats.shape[0], 3, 3) or not Ks.is_floating_point():
        raise ValueError(f"Ks: expected a float [C, 3, 3] tensor with C={viewmats.shape[0]} "
                         f"(from viewmats), got {Ks.dtype} {list(Ks.shape)}")
    if viewmats.requires_grad or Ks.requires_grad:
        # Gradients w.r.t. cameras are not computed; say so instead of returning None silently.
        raise ValueError("viewmats/Ks require grad, but camera gradients are not supported; "
                         "pass detached tensors")
    c = viewmats.shape[0]
    if viewmats.device == context.device == Ks.device and context.device.type == "cuda":
        cameras = context.device_cameras(viewmats, Ks, width, height, near_plane, far_plane)
        context.last_cameras = (viewmats, Ks, _camera_state(viewmats, Ks, width, height, near_plane, far_plane),
                                cameras)
        return cameras
    if viewmats.device.type == "cpu" and Ks.device.type == "cpu":
        vm, ks = viewmats.detach().numpy(), Ks.detach().numpy()
    else:
        packed = torch.cat([viewmats.detach().reshape(c, 16).to(Ks.device, torch.float64),
                            Ks.detach().reshape(c, 9).to(torch.float64)], dim=1).cpu().numpy()
        vm, ks = packed[:, :16].reshape(c, 4, 4), packed[:, 16:].reshape(c, 3, 3)
    return [context.camera(float(k[0, 0]), float(k[1, 1]), float(k[0, 2]), float(k[1, 2]), width,
                           height, v, near_plane, far_plane) for v, k in zip(vm, ks)]


def _call_key(tensors: tuple, options: tuple) -> Optional[tuple]:
    """What a `rasterization` call's checks depend on, for `RenderContext.checked_calls`:
    ``options`` and, per tensor, its memory, shape, dtype, requires_grad and contiguity (not
    its device: under CUDA's unified addressing, memory on different devices, the host's
    included, never shares an address, and torch.device objects would double the key's
    hashing cost, paid on every call); a host tensor's values too (host cameras are read
    by value; their [C, 4, 4] and [C, 3, 3] are small). None if one of them is not a cpu
    or cuda tensor (the checks then run, and raise)."""
    key = [options]
    for t in tensors:
        if not isinstance(t, torch.Tensor) or not (t.is_cuda or t.is_cpu):
            return None
        key.append((t.data_ptr(), t.shape, t.dtype, t.requires_grad, t.is_contiguous()))
    for t in tensors[-2:]:  # viewmats, Ks
        if t.is_cpu:
            if t.dtype not in (torch.float32, torch.float64):
                return None  # checked, or converted, by _cameras every call
            key.append(t.detach().numpy().tobytes())
    return tuple(key)


def _camera_state(viewmats, Ks, width, height, near_plane, far_plane) -> tuple:
    """What `_cameras` checked of camera tensors that can change behind the same objects."""
    return (viewmats.data_ptr(), Ks.data_ptr(), viewmats.shape, Ks.shape, viewmats.dtype, Ks.dtype,
            viewmats.requires_grad or Ks.requires_grad, width, height, near_plane, far_plane)


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
    sh_degree: Optional[int] = None,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    backgrounds: Optional[torch.Tensor] = None,  # [3] or [C, 3]
    reduce: str = "arc",
    threshold: Optional[int] = None,
    absgrad: bool = False,
    render_mode: str = "RGB",
    rasterize_mode: str = "classic",
    context: Optional[RenderContext] = None,
    *,
    scales_activation: Optional[str] = None,
    opacities_activation: Optional[str] = None,
) -> Tuple[torch.Tensor, torch.Tensor, dict]:
    """Differentiable 3D Gaussian splatting of N Gaussians into C cameras (gsplat-like).

    Conventions follow gsplat / OpenCV: camera +x right, +y down, +z forward; `viewmats` are
    world-to-camera; K = [[fx,0,cx],[0,fy,cy],[0,0,1]] in pixels; pixel centres at +0.5.

    Args:
        means: [N, 3] Gaussian centres, world units.
        quats: [N, 4] rotations as wxyz quaternions of any norm > 0: they are normalised
            inside the projection kernel and the gradient goes through that normalisation,
            so pass the raw training parameters (an F.normalize before the call only adds
            torch ops).
        scales: [N, 3] per-axis standard deviations, world units, linear; with
            scales_activation="exp", log-scales (the renderer uses exp(scales)).
        opacities: [N] opacities in [0, 1]; with opacities_activation="sigmoid", logits
            (the renderer uses sigmoid(opacities)).
        colors: [N, 3] RGB, or [N, K, 3] SH coefficients (evaluated per camera with the view
            direction; 0.5 is added and the result clamped at 0, as in gsplat/INRIA).
        viewmats: [C, 4, 4] world-to-camera matrices, not differentiable (ValueError if
            they require grad). CUDA tensors on the device of `means` stay there (read by
            the projection kernel, no host copy or sync; non-finite values or fx, fy <= 0
            raise ValueError after the render is queued); host (cpu) tensors are read
            directly.
        Ks: [C, 3, 3] pinhole intrinsics in pixels; same handling as viewmats.
        width, height: image size in pixels.
        sh_degree: SH degree 0..3 to use from [N, K, 3] colors (the first (d+1)^2
            coefficients, so a growing active degree works); None with [N, K, 3] infers it
            from K = (d+1)^2; must be None for [N, 3] RGB.
        near_plane, far_plane: Gaussians with camera depth outside are culled (world units).
        backgrounds: [3] or [C, 3] RGB composited behind the image as
            rgb + (1 - alpha) * background (differentiable); None = black. Depth channels get
            no background.
        reduce: backward reduction of per-pixel gradients: "arc" (default), "atomic",
            "warp", "serial" or "deterministic" (bit-identical gradients from run to run;
            selected whatever this says under torch.use_deterministic_algorithms(True));
            "floor" is for timing only and yields NO rasteriser gradients (see
            arc_warp.RenderSettings).
        threshold: ARC lane-count threshold; None = calibrated per device.
        absgrad: also accumulate |dL/dmeans2d| per pixel into `meta["means2d"].absgrad`
            [C, N, 2] during backward (gsplat's absgrad densification).
        render_mode: "RGB", "D" (accumulated depth sum w_i z_i), "ED" (expected depth,
            D / alpha, 0 where alpha is 0), "RGB+D" or "RGB+ED" (depth as a 4th channel).
        rasterize_mode: "classic", or "antialiased" for the Mip-Splatting 2D filter (each
            opacity times sqrt(det S / det(S + 0.3 I)), S the 2D covariance), as gsplat.
        context: the `RenderContext` whose workspace, streams and threshold to use; None
            uses `default_context` of the device (one per device, made on first use).
        scales_activation: None (default: `scales` are linear) or "exp": `scales` are
            [N, 3] log-scales, as 3DGS training stores them, and the projection kernel
            applies exp as it reads them (no torch op, no autograd node); a log-scale
            above ~88.7 (exp overflows float32) raises like a non-finite scale.
        opacities_activation: None (default: `opacities` in [0, 1]) or "sigmoid":
            `opacities` are [N] logits and the projection kernel applies sigmoid.
            With either option the gradient lands on the raw tensor passed (dL/dlog_s =
            dL/ds * exp(log_s), dL/dlogit = dL/do * o (1 - o)), as torch.exp /
            torch.sigmoid before the call would give; the renders are the same
            (arc_warp.RenderSettings.scale_activation / opacity_activation).

    Inputs may be float16/32/64 on "cpu" or "cuda" (all Gaussian tensors on one device);
    they are cast to float32 only when needed, and gradients come back in their dtype.
    Warp runs zero-copy on the tensors, on torch's current CUDA stream.

    Returns:
        render_colors: [C, H, W, 3] for "RGB", [C, H, W, 4] for "RGB+D"/"RGB+ED",
            [C, H, W, 1] for "D"/"ED"; float32 on the device of `means`.
        render_alphas: [C, H, W, 1] float32 accumulated opacity.
        meta: dict with
            "means2d": [C, N, 2] float32 projected centres in pixels. When gradients are
                enabled it is a leaf tensor with requires_grad=True whose .grad receives
                dL/dmeans2d (pixels) during backward, for densification; calling
                .retain_grad() on it, as gsplat code does, is harmless. With absgrad=True
                its .absgrad attribute gets the per-pixel absolute gradient sum. It is
                not an input of the autograd graph: the render's backward adds into its
                .grad while the tensor is alive, and computes no such gradient once the
                caller has dropped it (a loop that does not read it holds neither it nor
                its gradient through the optimizer step, like gsplat's intermediate
                means2d without retain_grad). So read it from .grad after backward:
                torch.autograd.grad(loss, meta["means2d"]) and hooks on it do not see it.
            "radii": [C, N, 2] int32 screen-space extents in pixels, (0, 0) = culled.
            "width", "height", "n_cameras": ints.

    Raises:
        TypeError / ValueError: wrong types, dtypes, shapes, devices or options, before
            anything is queued. ValueError for non-finite values (and zero quaternions,
            invalid CUDA cameras), found by the device: before the call returns, or, for
            a render with grad on CUDA, from its backward (``RenderContext.defer_checks``:
            the forward then never waits for the device).

    Gradients flow to means, quats, scales, opacities, colors and backgrounds (to the raw
    tensors passed, whatever the activations). Double backward (differentiating these
    gradients again) raises RuntimeError.

    Example (one training step on the raw 3DGS parameters, with gsplat-style
    densification statistics)::

        colors, alphas, meta = rasterization(means, quats, log_scales, logit_opacities, sh,
                                             viewmats, Ks, W, H, sh_degree=active_degree,
                                             scales_activation="exp",
                                             opacities_activation="sigmoid")
        loss = (colors - target).abs().mean()
        loss.backward()
        grad2d = meta["means2d"].grad          # [C, N, 2], pixels
        seen = (meta["radii"] > 0).all(-1)    # [C, N]
    """
    grad_enabled = torch.is_grad_enabled()
    # the options as passed (their types too where an equal value of another type, 1920.0
    # for 1920, would be refused): a call like one checked before skips their checks
    key = _call_key((means, quats, scales, opacities, colors, viewmats, Ks),
                    (width, height, type(width), type(height), sh_degree, near_plane, far_plane, reduce, threshold,
                     absgrad, render_mode, rasterize_mode, scales_activation, opacities_activation, grad_enabled))
    if context is None and key is not None:
        context = default_context(means.device)
    try:
        kept = None if key is None else context.checked_calls.get(key)
    except TypeError:  # an unhashable option: the checks below say what is wrong with it
        kept = key = None
    if kept is not None:  # a call like one checked before: the same tensors, cameras and options
        sh_degree, cameras, settings, need_grad = kept
    else:
        if render_mode not in RENDER_MODES:
            raise ValueError(f"render_mode: expected one of {RENDER_MODES}, got {render_mode!r}")
        scale_activation = _option("scales_activation", scales_activation, SCALES_ACTIVATIONS)
        opacity_activation = _option("opacities_activation", opacities_activation, OPACITIES_ACTIVATIONS)
        for name, v in (("width", width), ("height", height)):
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{name}: expected a positive int, got {v!r}")
        if rasterize_mode not in ("classic", "antialiased"):
            raise ValueError(f"rasterize_mode: expected 'classic' or 'antialiased', got {rasterize_mode!r}")
        passed = (means, quats, scales, opacities, colors)
        means = check_tensor("means", means, (None, 3))
        device, n = means.device, means.shape[0]
        quats = check_tensor("quats", quats, (n, 4), device)
        scales = check_tensor("scales", scales, (n, 3), device)
        opacities = check_tensor("opacities", opacities, (n,), device)
        sh_degree, colors = _sh_degree_and_colors(colors, n, sh_degree, device)
        if context is None:
            context = default_context(device)
        cameras = _cameras(viewmats, Ks, width, height, near_plane, far_plane, context)
        need_grad = grad_enabled and any(t.requires_grad for t in (means, quats, scales, opacities, colors))
        settings = context.settings(sh_degree=sh_degree, reduce=reduce, threshold=threshold,
                                    absgrad=absgrad and need_grad, antialiased=rasterize_mode == "antialiased",
                                    scale_activation=scale_activation, opacity_activation=opacity_activation)
        # kept if nothing here copied a tensor (a copy is new memory every call) and the
        # cameras are read on the device or their host values are in the key
        if (key is not None and all(a is b for a, b in zip(passed, (means, quats, scales, opacities, colors)))
                and (isinstance(cameras, DeviceCameras) or viewmats.device.type == Ks.device.type == "cpu")):
            context.keep_checked_call(key, (sh_degree, cameras, settings, need_grad))
    c = len(cameras)
    if backgrounds is not None:
        if not isinstance(backgrounds, torch.Tensor) or backgrounds.shape not in ((3,), (c, 3)):
            got = list(backgrounds.shape) if isinstance(backgrounds, torch.Tensor) else type(backgrounds).__name__
            raise ValueError(f"backgrounds: expected a [3] or [{c}, 3] tensor, got {got}")
        backgrounds = check_tensor("backgrounds", backgrounds.expand(c, 3), (c, 3), means.device)

    # the projected means are written straight into the leaf that receives their gradient
    r = render_batch(means, quats, scales, opacities, colors, cameras, settings, None, context,
                     depths=render_mode != "RGB", means2d_grad=need_grad)
    means2d = r.means2d
    alphas = r.alpha
    channels = []
    if render_mode.startswith("RGB"):
        rgb = r.color
        if backgrounds is not None:
            rgb = rgb + (1.0 - alphas) * backgrounds[:, None, None, :]
        channels.append(rgb)
    if render_mode.endswith("ED"):
        channels.append(r.expected_depth[..., None])
    elif render_mode.endswith("D"):
        channels.append(r.depth[..., None])
    render_colors = channels[0] if len(channels) == 1 else torch.cat(channels, dim=-1)
    meta = {
        "means2d": means2d,
        "radii": r.radii,
        "width": width,
        "height": height,
        "n_cameras": c,
    }
    return render_colors, alphas, meta
