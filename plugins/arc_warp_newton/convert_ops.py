"""Simulation state -> Gaussians: validation, allocation and launches.

Two conversions, both differentiable and recorded on an active ``wp.Tape``:

- :func:`particles_to_gaussians`: one isotropic Gaussian per particle, centred on
  ``particle_q``, std-dev = particle radius (times ``radius_scale``).
- :func:`bodies_to_gaussians`: Gaussians at fixed body-frame points on rigid shapes
  (:class:`SurfaceSamples`), moved by ``body_q``; gradients flow into ``body_q``.

The results are :class:`SimGaussians`, whose arrays plug straight into
``arc_warp.render_gaussians(*g.arrays, camera, settings)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import warp as wp

from arc_warp.validate import check_array

from .convert_kernels import body_samples_to_gaussians_kernel, particles_to_gaussians_kernel


@dataclass
class SimGaussians:
    """Renderable Gaussians (the inputs of ``arc_warp.render_gaussians``).

    means (N,) wp.vec3 world units; quats (N,) wp.vec4 wxyz; scales (N,) wp.vec3 linear
    std-devs in world units; opacities (N,) float in [0, 1]; colors (N,) wp.vec3 RGB.
    """

    means: wp.array
    quats: wp.array
    scales: wp.array
    opacities: wp.array
    colors: wp.array

    @property
    def arrays(self) -> tuple[wp.array, ...]:
        """(means, quats, scales, opacities, colors), the order ``render_gaussians`` takes."""
        return (self.means, self.quats, self.scales, self.opacities, self.colors)

    @property
    def count(self) -> int:
        return self.means.shape[0]


def _per_element(value, name: str, dtype, count: int, device) -> tuple[wp.array, int]:
    """A per-element attribute as (array, stride): an (N,) array (stride 1), a (1,)
    array or a plain value (stride 0, broadcast)."""
    if isinstance(value, wp.array):
        check_array(value, name, dtype, 1, None, device)
        if value.shape[0] not in (1, count):
            raise ValueError(f"{name} must have 1 or {count} elements, got {value.shape[0]}")
        return value, int(value.shape[0] == count and count != 1)
    arr = np.asarray(value, dtype=np.float32)
    want = (3,) if dtype == wp.vec3 else ()
    if arr.shape != want or not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be a wp.array or {'3 finite floats' if want else 'a finite float'}, got {value!r}")
    return wp.array(arr.reshape(1, *want), dtype=dtype, device=device), 0


def _alloc_gaussians(count: int, device, requires_grad: bool) -> SimGaussians:
    def new(dtype):
        return wp.empty(count, dtype=dtype, device=device, requires_grad=requires_grad)

    return SimGaussians(new(wp.vec3), new(wp.vec4), new(wp.vec3), new(float), new(wp.vec3))


def particles_to_gaussians(
    particle_q: wp.array,  # (N,) wp.vec3 world positions, e.g. newton State.particle_q
    radius,  # (N,) or (1,) wp.array(float), or a float: particle radius, world units
    colors,  # (N,) or (1,) wp.array(wp.vec3), or an RGB triple
    opacities=1.0,  # (N,) or (1,) wp.array(float), or a float in [0, 1]
    *,
    radius_scale: float = 1.0,
    requires_grad: bool | None = None,
) -> SimGaussians:
    """Isotropic Gaussians at particle positions.

    Gaussian i has mean ``particle_q[i]``, identity rotation, per-axis std-dev
    ``radius[i] * radius_scale`` (world units), opacity ``opacities[i]`` and RGB
    ``colors[i]``. A (1,) array or a plain value is broadcast to every particle.

    Differentiable: on an active ``wp.Tape`` the launch is recorded, so gradients of
    the outputs flow into ``particle_q.grad`` (and into ``radius``/``opacities``/
    ``colors`` arrays that have ``requires_grad``). ``requires_grad`` of the outputs
    defaults to that of ``particle_q``. Launches on ``particle_q.device``.
    """
    check_array(particle_q, "particle_q", wp.vec3, 1)
    device, n = particle_q.device, particle_q.shape[0]
    if n == 0:
        raise ValueError("particle_q is empty: nothing to convert")
    if not (isinstance(radius_scale, (int, float)) and math.isfinite(radius_scale) and radius_scale > 0):
        raise ValueError(f"radius_scale must be a finite float > 0, got {radius_scale!r}")
    radius_arr, radius_stride = _per_element(radius, "radius", float, n, device)
    opacity_arr, opacity_stride = _per_element(opacities, "opacities", float, n, device)
    color_arr, color_stride = _per_element(colors, "colors", wp.vec3, n, device)
    if requires_grad is None:
        requires_grad = particle_q.requires_grad
    out = _alloc_gaussians(n, device, requires_grad)
    wp.launch(
        particles_to_gaussians_kernel,
        dim=n,
        inputs=[particle_q, radius_arr, radius_stride, float(radius_scale), opacity_arr, opacity_stride,
                color_arr, color_stride],
        outputs=list(out.arrays),
        device=device,
    )
    return out


@dataclass
class SurfaceSamples:
    """Gaussians fixed in rigid-body frames (e.g. sampled on shape surfaces).

    points (M,) wp.vec3 body-frame positions (world positions where body is -1);
    body (M,) wp.int32 index into ``body_q`` (-1 = static, world frame);
    quats (M,) wp.quat (xyzw, Warp's convention) body-frame rotation of each Gaussian;
    scales (M,) wp.vec3 std-devs (world units); opacities (M,) float; colors (M,) wp.vec3.
    Build with :meth:`from_numpy`, :func:`sphere_surface_samples`,
    :func:`box_surface_samples`, and join with :meth:`concat`.
    """

    points: wp.array
    body: wp.array
    quats: wp.array
    scales: wp.array
    opacities: wp.array
    colors: wp.array
    max_body: int  # largest body index used (-1: all static), checked against body_q

    @property
    def count(self) -> int:
        return self.points.shape[0]

    @classmethod
    def from_numpy(cls, points, body, scales, colors, opacities=1.0, quats=None, device=None) -> SurfaceSamples:
        """points (M, 3); body int or (M,) ints; scales float, (M,) or (M, 3); colors (3,) or
        (M, 3); opacities float or (M,); quats None (identity) or (M, 4) xyzw."""
        points = np.asarray(points, dtype=np.float32)
        if points.ndim != 2 or points.shape[1] != 3 or points.shape[0] == 0:
            raise ValueError(f"points must be (M, 3) with M >= 1, got shape {points.shape}")
        m = points.shape[0]

        def grow(value, name, tail):
            arr = np.asarray(value, dtype=np.float32)
            if tail == (3,) and arr.shape == (m,):  # one isotropic value per sample
                arr = arr[:, None]
            try:
                arr = np.broadcast_to(arr, (m, *tail))
            except ValueError:
                raise ValueError(f"{name} must broadcast to {(m, *tail)}, got shape {np.shape(value)}") from None
            if not np.all(np.isfinite(arr)):
                raise ValueError(f"{name} must be finite")
            return np.ascontiguousarray(arr)

        body_np = np.ascontiguousarray(np.broadcast_to(np.asarray(body, dtype=np.int32), (m,)))
        if body_np.min() < -1:
            raise ValueError(f"body indices must be >= -1, got {body_np.min()}")
        quats_np = np.tile(np.array([0.0, 0.0, 0.0, 1.0], np.float32), (m, 1)) if quats is None else grow(quats, "quats", (4,))
        return cls(
            wp.array(points, dtype=wp.vec3, device=device),
            wp.array(body_np, dtype=wp.int32, device=device),
            wp.array(quats_np, dtype=wp.quat, device=device),
            wp.array(grow(scales, "scales", (3,)), dtype=wp.vec3, device=device),
            wp.array(grow(opacities, "opacities", ()), dtype=float, device=device),
            wp.array(grow(colors, "colors", (3,)), dtype=wp.vec3, device=device),
            int(body_np.max()),
        )

    @classmethod
    def concat(cls, parts) -> SurfaceSamples:
        """Join sample sets (on one device) into one."""
        parts = list(parts)
        if not parts:
            raise ValueError("concat needs at least one SurfaceSamples")
        device = parts[0].points.device
        fields = ("points", "body", "quats", "scales", "opacities", "colors")
        joined = {"max_body": max(p.max_body for p in parts)}
        for name in fields:
            arrays = [getattr(p, name) for p in parts]
            if any(a.device != device for a in arrays):
                raise ValueError("concat needs all SurfaceSamples on one device")
            joined[name] = wp.array(np.concatenate([a.numpy() for a in arrays]), dtype=arrays[0].dtype, device=device)
        return cls(**joined)


def _shape_to_body(points: np.ndarray, shape_xform) -> np.ndarray:
    """Apply a (7,) transform (px, py, pz, qx, qy, qz, qw) to (M, 3) points."""
    if shape_xform is None:
        return points
    t = np.asarray(shape_xform, dtype=np.float64)
    if t.shape != (7,):
        raise ValueError(f"shape transform must be 7 numbers (p, q xyzw), got shape {t.shape}")
    x, y, z, w = t[3:] / np.linalg.norm(t[3:])
    rot = np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ])
    return points @ rot.T + t[:3]


def sphere_surface_points(radius: float, count: int) -> np.ndarray:
    """(count, 3) float64 points spread evenly on a sphere (Fibonacci lattice)."""
    if not (math.isfinite(radius) and radius > 0):
        raise ValueError(f"radius must be a finite float > 0, got {radius!r}")
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count!r}")
    k = np.arange(count) + 0.5
    z = 1.0 - 2.0 * k / count
    phi = k * math.pi * (3.0 - math.sqrt(5.0))
    rho = np.sqrt(np.maximum(0.0, 1.0 - z * z))
    return radius * np.stack([rho * np.cos(phi), rho * np.sin(phi), z], axis=-1)


def box_surface_points(half_extents, per_side: int) -> np.ndarray:
    """(6 * per_side^2, 3) float64 points on a grid over each face of a box centred at
    the origin with half extents (hx, hy, hz)."""
    h = np.asarray(half_extents, dtype=np.float64)
    if h.shape != (3,) or not np.all(np.isfinite(h)) or np.any(h <= 0):
        raise ValueError(f"half_extents must be 3 finite floats > 0, got {half_extents!r}")
    if per_side < 1:
        raise ValueError(f"per_side must be >= 1, got {per_side!r}")
    t = (np.arange(per_side) + 0.5) / per_side * 2.0 - 1.0
    u, v = (g.ravel() for g in np.meshgrid(t, t, indexing="ij"))
    faces = []
    for axis in range(3):
        a, b = [d for d in range(3) if d != axis]
        for sign in (-1.0, 1.0):
            p = np.zeros((u.size, 3))
            p[:, axis] = sign
            p[:, a], p[:, b] = u, v
            faces.append(p * h)
    return np.concatenate(faces)


def sphere_surface_samples(body: int, radius: float, count: int, color, *, scale=None, opacity=1.0,
                           shape_xform=None, device=None) -> SurfaceSamples:
    """``count`` Gaussians on a sphere of ``radius`` attached to ``body`` (-1 = world).

    ``shape_xform`` places the sphere in the body frame ((7,) p, q xyzw; None = identity).
    ``scale`` is the isotropic std-dev; default: half the mean spacing of the samples,
    so neighbouring Gaussians overlap into a closed surface.
    """
    pts = _shape_to_body(sphere_surface_points(radius, count), shape_xform)
    if scale is None:
        scale = 0.5 * math.sqrt(4.0 * math.pi / count) * radius
    return SurfaceSamples.from_numpy(pts, body, scale, color, opacity, device=device)


def box_surface_samples(body: int, half_extents, per_side: int, color, *, scale=None, opacity=1.0,
                        shape_xform=None, device=None) -> SurfaceSamples:
    """Gaussians on a per-face grid over a box with ``half_extents`` on ``body`` (-1 = world).
    ``scale`` defaults to half the grid spacing of the largest face side."""
    h = np.asarray(half_extents, dtype=np.float64)
    pts = _shape_to_body(box_surface_points(h, per_side), shape_xform)
    if scale is None:
        scale = float(np.max(h)) / per_side
    return SurfaceSamples.from_numpy(pts, body, scale, color, opacity, device=device)


def bodies_to_gaussians(
    body_q: wp.array,  # (B,) wp.transform body poses, e.g. newton State.body_q
    samples: SurfaceSamples,  # M body-frame Gaussians
    *,
    requires_grad: bool | None = None,
) -> SimGaussians:
    """Gaussians of rigid shapes at the body poses ``body_q``.

    Sample i becomes a Gaussian with mean ``body_q[b] * points[i]`` and rotation
    ``rot(body_q[b]) * quats[i]`` (returned as wxyz), where ``b = samples.body[i]``;
    ``b == -1`` leaves it in the world frame. Scales, opacities and colours are copied.

    Differentiable: on an active ``wp.Tape`` gradients of the means/quats flow into
    ``body_q.grad``. ``requires_grad`` of the outputs defaults to that of ``body_q``.
    Launches on ``body_q.device``; ``samples`` must be on the same device and its body
    indices must be < B.
    """
    check_array(body_q, "body_q", wp.transform, 1)
    if not isinstance(samples, SurfaceSamples):
        raise TypeError(f"samples must be SurfaceSamples, got {type(samples).__name__}")
    device = body_q.device
    if samples.points.device != device:
        raise ValueError(f"samples are on {samples.points.device}, body_q on {device}")
    if samples.max_body >= body_q.shape[0]:
        raise ValueError(f"samples use body {samples.max_body} but body_q has only {body_q.shape[0]} bodies")
    if requires_grad is None:
        requires_grad = body_q.requires_grad
    out = _alloc_gaussians(samples.count, device, requires_grad)
    wp.launch(
        body_samples_to_gaussians_kernel,
        dim=samples.count,
        inputs=[body_q, samples.body, samples.points, samples.quats, samples.scales, samples.opacities, samples.colors],
        outputs=list(out.arrays),
        device=device,
    )
    return out
