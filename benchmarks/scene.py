"""The benchmarks' scene: N random Gaussians filling the view frustum, seen by C cameras.

Gaussians lie at depths 2-12 in front of camera 0 (at the origin, looking down +z, a
60-degree horizontal field of view), their centres uniform over its image; the other
cameras are turned by 2 degrees each. Parameters are stored as 3DGS training stores them:
raw quaternions (wxyz, not normalised), log-scales, logit-opacities and SH degree 3
coefficients [N, 16, 3]. Size regimes, per-axis standard deviations:

- ``small``: 0.3-1.5 pixels at the Gaussian's depth (log-uniform), few pixels each;
- ``large``: 4-16 pixels;
- ``shrink``: 0.4-2.5 cm at 1M Gaussians, times (1e6 / N)^(1/3) (denser scenes get smaller
  Gaussians, about 1-6 pixels at 1M): the scene of the splat kernel tables up to 0.11.0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SH_DEGREE = 3
REGIMES = ("small", "large", "shrink")
PIXEL_SIGMAS = {"small": (0.3, 1.5), "large": (4.0, 16.0)}
SHRINK_SIGMAS = (0.004, 0.025)  # world units at 1M Gaussians
NEAR, FAR = 0.01, 1e10  # arc_warp's and gsplat's default planes


@dataclass
class Scene:
    """float32 numpy arrays: ``means`` [N, 3], ``quats`` [N, 4], ``log_scales`` [N, 3],
    ``logit_opacities`` [N], ``sh`` [N, 16, 3]; ``viewmats`` [C, 4, 4] world-to-camera,
    ``Ks`` [C, 3, 3] pixels; the image ``width`` x ``height``."""

    means: np.ndarray
    quats: np.ndarray
    log_scales: np.ndarray
    logit_opacities: np.ndarray
    sh: np.ndarray
    viewmats: np.ndarray
    Ks: np.ndarray
    width: int
    height: int
    regime: str

    PARAMS = ("means", "quats", "log_scales", "logit_opacities", "sh")
    ACTIVATED = ("means", "quats", "scales", "opacities", "sh")  # the keys of activated()

    @property
    def n(self) -> int:
        return self.means.shape[0]

    @property
    def raw(self) -> dict:
        """The parameters by name, as :attr:`PARAMS` orders them."""
        return {k: getattr(self, k) for k in self.PARAMS}

    def cameras(self, model: str = "pinhole", distortion=None) -> list:
        """The cameras as ``arc_warp.Camera`` objects (``model``, OpenCV ``distortion`` coefficients)."""
        from arc_warp import Camera

        return [Camera(float(k[0, 0]), float(k[1, 1]), float(k[0, 2]), float(k[1, 2]), self.width, self.height,
                       world_to_camera=v.astype(np.float64), near=NEAR, far=FAR, model=model, distortion=distortion)
                for v, k in zip(self.viewmats, self.Ks)]

    def activated(self) -> dict:
        """float32 means, unit quaternions, linear scales, opacities in (0, 1) and SH, as
        ``render_gaussians`` and gsplat take them without activations."""
        quats = self.quats / np.linalg.norm(self.quats, axis=1, keepdims=True)
        return {"means": self.means, "quats": quats.astype(np.float32),
                "scales": np.exp(self.log_scales).astype(np.float32),
                "opacities": (1 / (1 + np.exp(-self.logit_opacities))).astype(np.float32), "sh": self.sh}

    def warp_gaussians(self, device):
        """The :meth:`activated` parameters as ``arc_warp.Gaussians`` on a Warp device."""
        import warp as wp

        from arc_warp import check_gaussians

        a = self.activated()
        return check_gaussians(*(wp.array(a[k], dtype=t, device=device) for k, t in
                                 (("means", wp.vec3), ("quats", wp.vec4), ("scales", wp.vec3),
                                  ("opacities", wp.float32), ("sh", wp.vec3))))


def make_scene(n: int, regime: str = "small", width: int = 1920, height: int = 1080, cameras: int = 1,
               seed: int = 0) -> Scene:
    """A :class:`Scene` of ``n`` Gaussians in one of :data:`REGIMES` (see the module notes)."""
    if regime not in REGIMES:
        raise ValueError(f"regime must be one of {REGIMES}, got {regime!r}")
    rng = np.random.default_rng(seed)
    f = 0.5 * width / math.tan(math.radians(30.0))
    z = rng.uniform(2.0, 12.0, n)
    u, v = rng.uniform(0, width, n), rng.uniform(0, height, n)
    means = np.stack([(u - width / 2) / f * z, (v - height / 2) / f * z, z], 1)
    if regime == "shrink":
        lo, hi = SHRINK_SIGMAS
        scales = np.exp(rng.uniform(np.log(lo), np.log(hi), (n, 3))) * (1e6 / max(n, 1)) ** (1 / 3)
    else:
        lo, hi = PIXEL_SIGMAS[regime]
        scales = np.exp(rng.uniform(np.log(lo), np.log(hi), (n, 3))) * z[:, None] / f
    p = rng.uniform(0.05, 0.95, n)
    sh = np.zeros((n, (SH_DEGREE + 1) ** 2, 3))
    sh[:, 0] = rng.uniform(-1.5, 1.5, (n, 3))
    sh[:, 1:] = rng.standard_normal((n, (SH_DEGREE + 1) ** 2 - 1, 3)) * 0.15
    viewmats = np.repeat(np.eye(4)[None], cameras, 0)
    for c in range(1, cameras):
        a = math.radians(2.0 * c)
        viewmats[c, :3, :3] = [[math.cos(a), 0, math.sin(a)], [0, 1, 0], [-math.sin(a), 0, math.cos(a)]]
    ks = np.repeat(np.array([[f, 0, width / 2], [0, f, height / 2], [0, 0, 1]])[None], cameras, 0)
    f32 = np.float32
    return Scene(means.astype(f32), rng.standard_normal((n, 4)).astype(f32), np.log(scales).astype(f32),
                 np.log(p / (1 - p)).astype(f32), sh.astype(f32), viewmats.astype(f32), ks.astype(f32), width, height,
                 regime)
