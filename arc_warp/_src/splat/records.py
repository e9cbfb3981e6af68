"""Typed records that travel between the splatting stages, and :func:`check_gaussians`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import warp as wp

from arc_warp._src.arc.calibrate import MAX_THRESHOLD, MIN_THRESHOLD
from arc_warp._src.arc.reduce_funcs import MODES
from arc_warp._src.camera import Camera, DeviceCameras
from arc_warp._src.validate import check_array

# RenderSettings.scale_activation / opacity_activation values
SCALE_ACTIVATIONS = ("none", "exp")
OPACITY_ACTIVATIONS = ("none", "sigmoid")


def _int_in(value, low: int, high: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and low <= value <= high


@dataclass(frozen=True)
class RenderSettings:
    """Options of :func:`render_gaussians`.

    Args:
        sh_degree: SH degree 0..3 evaluated of SH ``colors`` (``None``: the full degree of
            the coefficients given); ignored for plain RGB colours.
        background: RGB added as ``T_final * background`` to the colour image.
        reduce: the rasteriser backward's reduction of per-Gaussian gradients: ``"atomic"``,
            ``"warp"``, ``"serial"``, ``"arc"`` (adaptive, the default), ``"deterministic"``
            (the same bits on every run: per-entry partials summed in a fixed order) or
            ``"floor"`` (benchmarks only: NO rasteriser gradients).
        threshold: ARC threshold (lanes on one address before a warp reduction); ``None``:
            the device's calibrated value.
        eps2d: dilation added to the 2D covariance diagonal, pixels^2.
        antialiased: the Mip-Splatting 2D filter (gsplat's ``rasterize_mode="antialiased"``,
            INRIA's ``antialiasing=True``): opacities scaled by sqrt(det(cov2d) / det(cov2d +
            eps2d I)), so dilation keeps a small Gaussian's integral instead of brightening it.
        absgrad: also accumulate ``|dL/dmean2d|`` per pixel and Gaussian (gsplat's absgrad
            densification) into ``RenderOutput.means2d_absgrad`` (two more accumulated values).
        scale_activation: ``"none"`` (``scales`` are linear std-devs) or ``"exp"``: raw
            log-scales, as 3DGS training stores them (one above about 88.7, whose exp
            overflows float32, counts as non-finite).
        opacity_activation: ``"none"`` (``opacities`` in [0, 1]) or ``"sigmoid"``: raw
            logits. With either activation the gradients are w.r.t. the raw inputs.
            Quaternions are always normalised inside the projection (the gradient goes
            through it).
    """

    sh_degree: int | None = None
    background: tuple[float, float, float] = (0.0, 0.0, 0.0)
    reduce: str = "arc"
    threshold: int | None = None
    eps2d: float = 0.3
    absgrad: bool = False
    antialiased: bool = False
    scale_activation: str = "none"
    opacity_activation: str = "none"

    def __post_init__(self):
        if self.sh_degree is not None and not _int_in(self.sh_degree, 0, 3):
            raise ValueError(f"RenderSettings.sh_degree must be None or an int in 0..3, got {self.sh_degree!r}")
        bg = tuple(float(v) for v in self.background)
        if len(bg) != 3 or not all(math.isfinite(v) for v in bg):
            raise ValueError(f"RenderSettings.background must be 3 finite floats, got {self.background!r}")
        object.__setattr__(self, "background", bg)
        if self.reduce not in MODES:
            raise ValueError(f"RenderSettings.reduce must be one of {MODES}, got {self.reduce!r}")
        if self.threshold is not None and not _int_in(self.threshold, MIN_THRESHOLD, MAX_THRESHOLD):
            raise ValueError(f"RenderSettings.threshold must be None or an int in [{MIN_THRESHOLD}, {MAX_THRESHOLD}], "
                             f"got {self.threshold!r}")
        if not (math.isfinite(self.eps2d) and self.eps2d >= 0.0):
            raise ValueError(f"RenderSettings.eps2d must be a finite float >= 0, got {self.eps2d!r}")
        for name, allowed in (("scale_activation", SCALE_ACTIVATIONS), ("opacity_activation", OPACITY_ACTIVATIONS)):
            value = getattr(self, name)
            if not isinstance(value, str) or value not in allowed:
                raise ValueError(f"RenderSettings.{name} must be one of {allowed}, got {value!r}")


@dataclass
class GaussianGrads:
    """Gradients w.r.t. the inputs of :func:`render_gaussians`, shaped like them."""

    means: wp.array  # (N,) wp.vec3
    quats: wp.array  # (N,) wp.vec4
    scales: wp.array  # (N,) wp.vec3
    opacities: wp.array  # (N,) float
    colors: wp.array  # (N, K) wp.vec3 SH coefficients, or (N,) wp.vec3 RGB

    @property
    def arrays(self) -> tuple[wp.array, ...]:
        return (self.means, self.quats, self.scales, self.opacities, self.colors)


@dataclass(frozen=True)
class Gaussians:
    """N Gaussians as the renderer reads them, checked by :func:`check_gaussians`: the
    arrays of :func:`render_gaussians`, on one device, contiguous. ``sh_coeffs``: the
    coefficients evaluated, (degree + 1)^2, or 0 for RGB. ``coeff_rows``: the SH
    coefficients' memory as (N,) vectors of 3K floats, which the SH kernels load whole
    (None for RGB)."""

    means: wp.array
    quats: wp.array
    scales: wp.array
    opacities: wp.array
    colors: wp.array
    sh_coeffs: int
    coeff_rows: wp.array | None = None

    @property
    def count(self) -> int:
        return self.means.shape[0]

    @property
    def device(self):
        return self.means.device

    arrays = GaussianGrads.arrays  # (means, quats, scales, opacities, colors)


def check_gaussians(means, quats, scales, opacities, colors, sh_degree: int | None = None) -> Gaussians:
    """The :class:`Gaussians` of these arrays, or TypeError/ValueError naming what is wrong
    (dtype, shape, device, contiguity). ``colors`` (N, K) wp.vec3 holds SH coefficients
    (K = 1, 4, 9 or 16), of which the first (sh_degree + 1)^2 are evaluated (``sh_degree``
    None: all K); (N,) wp.vec3 holds RGB. NaN/Inf are found later, on the device."""
    means = check_array(means, "means", wp.vec3, 1)
    n, device = means.shape[0], means.device
    check_array(quats, "quats", wp.vec4, 1, (n,), device)
    check_array(scales, "scales", wp.vec3, 1, (n,), device)
    check_array(opacities, "opacities", wp.float32, 1, (n,), device)
    if not isinstance(colors, wp.array):
        raise TypeError(f"colors must be a wp.array of wp.vec3, got {type(colors).__name__}")
    if colors.ndim == 1:
        check_array(colors, "colors", wp.vec3, 1, (n,), device)
        return Gaussians(means, quats, scales, opacities, colors, 0)
    check_array(colors, "colors", wp.vec3, 2, None, device)
    k = colors.shape[1]
    if colors.shape[0] != n or k not in (1, 4, 9, 16):
        raise ValueError(f"SH colors must have shape (N={n}, (d+1)^2) with d in 0..3, got {colors.shape}")
    degree = math.isqrt(k) - 1 if sh_degree is None else sh_degree
    if (degree + 1) ** 2 > k:
        raise ValueError(f"sh_degree {degree} needs {(degree + 1) ** 2} SH coefficients, colors has {k}")
    rows = wp.array(ptr=colors.ptr if n else None, dtype=wp.types.vector(3 * k, wp.float32), shape=(n,), device=device)
    rows._ref = colors
    return Gaussians(means, quats, scales, opacities, colors, (degree + 1) ** 2, rows)


@dataclass(frozen=True)
class Surface:
    """An opaque surface behind the Gaussians of one camera's pixels (a mesh: see
    :func:`surface_from_mesh`; non-finite colours and NaN depths are flagged by the device).
    Where its depth is below +inf, Gaussians whose centre's camera z is not in front of it
    are hidden and its colour shows through the others' ``T_final`` in place of the
    background (so a surface at +inf everywhere renders what no surface renders, bit for
    bit); ``alpha`` and the depths stay the visible Gaussians' own. The backward adds
    ``T_final * dL/dcolor`` into the colours' gradient; the depths get none."""

    colors: wp.array  # (H, W) wp.vec3
    depths: wp.array  # (H, W) float32, camera z (world units, the depth the Gaussians are sorted by), +inf: none


@dataclass(frozen=True)
class RenderImages:
    """What :meth:`GaussianRenderer.forward` writes for C cameras of one H x W size:
    ``color`` (C, H, W) wp.vec3; ``alpha`` (C, H, W) float32 = 1 - T_final; ``depth``
    (C, H, W) float32 = sum w_i z_i (camera z, world units) and ``expected_depth`` (C, H, W)
    = depth / alpha (0 where alpha is 0), both (C, 0, 0) when not wanted (left unwritten;
    the backward then takes no depth cotangents); ``means2d`` (C, N) wp.vec2 projected
    centres in pixels (0 where culled); ``radii`` (C, N) wp.vec2i ((0, 0) = culled)."""

    color: wp.array
    alpha: wp.array
    depth: wp.array
    expected_depth: wp.array
    means2d: wp.array
    radii: wp.array
    planes: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        # each camera's (color, alpha, depth, expected_depth, means2d, radii), as the kernels take them
        arrays = (self.color, self.alpha, self.depth, self.expected_depth, self.means2d, self.radii)
        object.__setattr__(self, "planes", tuple(tuple(camera_plane(a, c) for a in arrays)
                                                 for c in range(self.color.shape[0])))


def camera_plane(a: wp.array, c: int) -> wp.array:
    """Camera ``c``'s part of a contiguous (C, ...) array, made from its pointer (cheaper than
    Warp's indexing, which cannot index an empty array), keeping ``a`` alive."""
    view = wp.array(ptr=a.ptr + c * a.strides[0] if a.size else None, dtype=a.dtype, shape=a.shape[1:],
                    device=a.device)
    view._ref = a
    return view


@dataclass(frozen=True)
class ImageGrads:
    """Cotangents of one camera's images, each (H, W) like :class:`RenderImages`' planes or
    None (zero): ``color`` wp.vec3, ``alpha``, ``depth``, ``expected_depth`` float32."""

    color: wp.array | None = None
    alpha: wp.array | None = None
    depth: wp.array | None = None
    expected_depth: wp.array | None = None


@dataclass
class RenderOutput:
    """One camera's images from :func:`render_gaussians` (its planes of
    :class:`RenderImages`: (H, W) and (N,) wp arrays), and what its backward needs.
    ``means2d_grad`` ((N,) wp.vec2, pixels) accumulates dL/dmean2d in every backward not
    given a buffer of its own (made and zeroed when first read); ``means2d_absgrad`` (same
    shape) its per-pixel absolute values with ``settings.absgrad``, else ``None``.
    ``camera``: the :class:`Camera` rendered, or the :class:`DeviceCameras` batch with
    ``camera_index`` naming it. ``status``: the call's :class:`RenderStatus`."""

    color: wp.array
    alpha: wp.array
    depth: wp.array
    expected_depth: wp.array
    means2d: wp.array
    radii: wp.array
    camera: Camera | DeviceCameras
    settings: RenderSettings
    status: object
    means2d_absgrad: wp.array | None = None
    camera_index: int | None = None
    _renderer: object = field(default=None, repr=False)
    _state: object = field(default=None, repr=False)
    _index: int = field(default=0, repr=False)  # the camera's index in its state
    _means2d_grad: wp.array | None = field(default=None, repr=False)

    @property
    def means2d_grad(self) -> wp.array:
        if self._means2d_grad is None:
            self._means2d_grad = wp.zeros(self.means2d.shape[0], dtype=wp.vec2, device=self.means2d.device)
        return self._means2d_grad
