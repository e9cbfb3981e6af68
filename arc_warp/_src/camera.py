"""Camera records (OpenCV / gsplat conventions), their lens distortion and constructors.

Camera space: +x right, +y down, +z forward. ``world_to_camera`` is gsplat's
"viewmat": a 4x4 float64 matrix mapping homogeneous world points to camera
space. Pixel ``(u, v)`` covers ``[u, u+1) x [v, v+1)``; its centre is at
``(u + 0.5, v + 0.5)``.

Camera models (gsplat 1.5.3's ``camera_model``), for a camera-space point (x, y, z):

- ``"pinhole"``: normalised point n = (x / z, y / z);
- ``"ortho"``: n = (x, y) (world units; fx, fy are then pixels per world unit);
- ``"fisheye"``: equidistant, n = theta (x, y) / r with r = sqrt(x^2 + y^2) and theta =
  atan2(r, z), the angle from the optical axis (|n| = theta).

Lens distortion (:class:`Distortion`, OpenCV's conventions) maps n to m; the pixel is
(fx m_x + cx, fy m_y + cy). With s = |n|^2 and rho(s) = (1 + k1 s + k2 s^2 + k3 s^3) /
(1 + k4 s + k5 s^2 + k6 s^3), pinhole (OpenCV's FULL_OPENCV / rational model):
m = rho n + (2 p1 n_x n_y + p2 (s + 2 n_x^2), p1 (s + 2 n_y^2) + 2 p2 n_x n_y); fisheye
(OpenCV's fisheye model): m = n (1 + k1 s + k2 s^2 + k3 s^3 + k4 s^4), i.e. the distorted
radius theta_d = theta (1 + k1 theta^2 + ... + k4 theta^8). An orthographic camera has none.

Depth culling (``near``/``far``) is on camera z for every model, as in gsplat: a fisheye
sees less than a hemisphere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import warp as wp

from arc_warp._src.validate import check_array

CAMERA_MODELS = ("pinhole", "ortho", "fisheye")
# margin beyond the image: the pinhole Jacobian clamps x/z, y/z at 1.3x the half field of view
# (gsplat), a distorted camera projects centres out to 1.3x the corner radius (radial_limit)
FOV_SLACK = 0.3


def _check_size_and_range(record) -> None:
    """``record``'s width and height as ints >= 1 (stored as int) and 0 < near < far;
    ValueError naming the record's class otherwise (Camera and DeviceCameras)."""
    kind = type(record).__name__
    for name in ("width", "height"):
        value = getattr(record, name)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{kind}.{name} must be an int >= 1, got {value!r}")
        object.__setattr__(record, name, int(value))
    if not (0.0 < record.near < record.far):
        raise ValueError(f"{kind} needs 0 < near < far, got near={record.near!r}, far={record.far!r}")


def _center_of(rows: list) -> tuple:
    """-A^-1 t of a world-to-camera ``[[A, t], [0, 1]]`` given as nested lists: the camera's
    position in world space (A's inverse by its adjugate); ValueError if A is singular."""
    (a, b, c, x), (d, e, f, y), (g, h, i, z) = rows[:3]
    inverse = ((e * i - f * h, c * h - b * i, b * f - c * e),
               (f * g - d * i, a * i - c * g, c * d - a * f),
               (d * h - e * g, b * g - a * h, a * e - b * d))
    det = a * inverse[0][0] + b * inverse[1][0] + c * inverse[2][0]
    if det == 0.0:
        raise ValueError("Camera.world_to_camera is singular (its 3x3 part has determinant 0); pass a rigid transform")
    return tuple(-(r0 * x + r1 * y + r2 * z) / det for r0, r1, r2 in inverse)


def _as_vec3(value, name: str) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float64)
    if arr.shape != (3,) or not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be 3 finite numbers, got {value!r}")
    return arr

@dataclass(frozen=True)
class Distortion:
    """Lens distortion coefficients in OpenCV's conventions (see the module docstring).

    A ``"pinhole"`` camera reads k1..k6, p1, p2 (OpenCV's rational radial-tangential
    model); a ``"fisheye"`` camera reads k1..k4 (OpenCV's fisheye model) and needs
    p1 = p2 = k5 = k6 = 0. All coefficients are dimensionless (of normalised coordinates).
    ``Camera(distortion=...)`` also takes the coefficients as a sequence, in OpenCV's order
    for the camera's model (see :meth:`from_coefficients`).
    """

    k1: float = 0.0
    k2: float = 0.0
    p1: float = 0.0
    p2: float = 0.0
    k3: float = 0.0
    k4: float = 0.0
    k5: float = 0.0
    k6: float = 0.0

    def __post_init__(self):
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)) \
                    or not math.isfinite(value):
                raise ValueError(f"Distortion.{name} must be a finite number, got {value!r}")
            object.__setattr__(self, name, float(value))

    @classmethod
    def from_coefficients(cls, coefficients, model: str = "pinhole") -> Distortion:
        """The record of OpenCV's coefficient vector for ``model``: pinhole ``distCoeffs``
        (k1, k2, p1, p2[, k3[, k4, k5, k6]]), 4, 5 or 8 numbers (COLMAP's OPENCV and
        FULL_OPENCV orders); fisheye (k1, k2, k3, k4)."""
        names = DISTORTION_ORDER.get(model)
        if names is None:
            raise ValueError(f"{model!r} cameras take no distortion; the models with one: {tuple(DISTORTION_ORDER)}")
        try:
            values = np.asarray(coefficients, dtype=np.float64).reshape(-1).tolist()
        except (TypeError, ValueError):
            raise TypeError(f"distortion coefficients must be numbers, got {coefficients!r}") from None
        if len(values) not in DISTORTION_LENGTHS[model]:
            raise ValueError(f"{model} distortion: expected {' or '.join(map(str, DISTORTION_LENGTHS[model]))} "
                             f"coefficients in the order {names}, got {len(values)}")
        return cls(**dict(zip(names, values)))

    def coefficients(self, model: str) -> tuple[float, ...]:
        """OpenCV's coefficient vector for ``model`` (8 numbers for pinhole, 4 for fisheye)."""
        return tuple(getattr(self, name) for name in DISTORTION_ORDER[model])

    @property
    def is_zero(self) -> bool:
        """True when every coefficient is 0 (the lens is the undistorted model)."""
        return not any(getattr(self, name) for name in self.__dataclass_fields__)

    def radial(self, model: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """(numerator, denominator) coefficients of rho(s), s = |n|^2, constant term first:
        ``rho = polyval(num, s) / polyval(den, s)`` (numpy.polynomial.polynomial order)."""
        if model == "fisheye":
            return (1.0, self.k1, self.k2, self.k3, self.k4), (1.0,)
        return (1.0, self.k1, self.k2, self.k3), (1.0, self.k4, self.k5, self.k6)


# OpenCV's coefficient order per model (cv2 distCoeffs; cv2.fisheye D)
DISTORTION_ORDER = {"pinhole": ("k1", "k2", "p1", "p2", "k3", "k4", "k5", "k6"),
                    "fisheye": ("k1", "k2", "k3", "k4")}
DISTORTION_LENGTHS = {"pinhole": (4, 5, 8), "fisheye": (4,)}  # accepted coefficient counts


def corner_radius(fx: float, fy: float, cx: float, cy: float, width: int, height: int) -> float:
    """Largest normalised (distorted) radius of the image's four corners."""
    dx = max(abs(cx), abs(width - cx)) / fx
    dy = max(abs(cy), abs(height - cy)) / fy
    return math.hypot(dx, dy)


def radial_limit(model: str, distortion: Distortion, corner: float) -> float:
    """``r2_max`` of a distorted camera: Gaussian centres with |n|^2 > r2_max are culled.

    The radial map R(r) = r rho(r^2), from the undistorted radius r = |n| (pinhole: tan of
    the ray's angle to the axis; fisheye: the angle) to the distorted one, must increase
    until it reaches ``corner`` (the image corner's distorted radius): ValueError if it
    folds back first (dR/dr <= 0, or a pole of rho's denominator). Centres are projected
    out to where R reaches 1.3 ``corner`` (``FOV_SLACK``, as gsplat's Jacobian clamp), or
    to the fold if it comes first: beyond, the polynomial is an extrapolation and would
    fold points back into the image. Tangential terms are left out of this check.
    ``inf``: nothing to cull (R stays below the margin over every visible ray)."""
    num, den = (np.asarray(c, dtype=np.float64) for c in distortion.radial(model))
    P = np.polynomial.polynomial

    def radius_map(r):
        s = r * r
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return r * P.polyval(s, num) / P.polyval(s, den)

    # sign of dR/dr = rho + 2 s rho' on Q > 0 is that of G = (P + 2 s P') Q - 2 s P Q'
    g = P.polysub(P.polymul(P.polyadd(num, 2.0 * P.polymulx(P.polyder(num))), den),
                  2.0 * P.polymul(P.polymulx(num), P.polyder(den)))
    roots = np.concatenate([P.polyroots(P.polytrim(g)) if np.any(g[1:]) else [],
                            P.polyroots(P.polytrim(den)) if np.any(den[1:]) else []])
    real = roots.real[(np.abs(roots.imag) <= 1e-9 * np.abs(roots)) & (roots.real > 0.0)]
    r_fold = math.sqrt(real.min()) if real.size else math.inf
    # rays beyond 90 degrees are culled by depth: a fisheye's radius ends at pi / 2
    r_end = min(r_fold, math.pi / 2) if model == "fisheye" else r_fold
    hi = r_end * (1.0 - 1e-9)  # R increases on [0, hi] (R may have a pole at r_fold)
    if r_fold <= r_end and radius_map(hi) <= corner:
        raise ValueError(
            f"{model} distortion {distortion} is not monotonic inside the image: the distorted radius "
            f"r rho(r^2) stops increasing at undistorted radius {r_fold:.4g} (distorted {radius_map(hi):.4g}), "
            f"before the image corner's {corner:.4g} (normalised units); check the coefficients and their order")
    target = (1.0 + FOV_SLACK) * corner
    if not math.isfinite(hi):  # pinhole without a fold: any radius up to 1e8 (beyond 89.99999 degrees)
        hi = 1.0
        while radius_map(hi) < target and hi < 1e8:
            hi *= 2.0
    if radius_map(hi) < target:
        return r_fold * r_fold if r_fold <= r_end else math.inf
    lo = 0.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if radius_map(mid) < target:
            lo = mid
        else:
            hi = mid
    return hi * hi



def _check_model(record, distortion) -> Distortion | None:
    """ValueError unless ``record.model`` is a known model that admits ``distortion`` (a
    Distortion, OpenCV's coefficients for the model, or None); the Distortion, or None
    for no distortion or all-zero coefficients."""
    kind = type(record).__name__
    if record.model not in CAMERA_MODELS:
        raise ValueError(f"{kind}.model must be one of {CAMERA_MODELS}, got {record.model!r}")
    if distortion is None:
        return None
    if record.model not in DISTORTION_ORDER:
        raise ValueError(f"{kind}: an {record.model!r} camera has no lens distortion; pass distortion=None")
    if not isinstance(distortion, Distortion):
        distortion = Distortion.from_coefficients(distortion, record.model)
    unused = [name for name in Distortion.__dataclass_fields__
              if name not in DISTORTION_ORDER[record.model] and getattr(distortion, name)]
    if unused:
        raise ValueError(f"{kind}: a {record.model} camera's distortion has no {', '.join(unused)} (they must "
                         f"be 0); it reads {DISTORTION_ORDER[record.model]}")
    return None if distortion.is_zero else distortion


@dataclass(frozen=True, eq=False)
class Camera:
    """A camera: pinhole by default, orthographic or fisheye, with optional lens distortion.

    Args:
        fx, fy: focal lengths in pixels (> 0); for ``"ortho"``, pixels per world unit.
        cx, cy: principal point in pixels.
        width, height: image size in pixels (>= 1).
        world_to_camera: (4, 4) float64 rigid transform, world -> camera (OpenCV axes).
            Stored as a read-only copy.
        near, far: depth range on camera z (world units); Gaussians whose centre lies
            outside ``[near, far]`` are culled. ``0 < near < far``.
        model: ``"pinhole"``, ``"ortho"`` or ``"fisheye"`` (see the module docstring).
        distortion: None, a :class:`Distortion` or OpenCV's coefficient sequence for
            ``model`` (:meth:`Distortion.from_coefficients`); stored as a Distortion (None
            when every coefficient is 0). Rendered natively: each Gaussian is projected
            through the distorted camera (its mean exactly, its covariance with the
            camera's Jacobian at the mean). ValueError if the radial map is not
            monotonic out to the image's corners (see :func:`radial_limit`).

    Attributes:
        r2_max: computed from the above; a distorted camera culls Gaussian centres whose
            undistorted |n|^2 exceeds it (``inf`` without distortion).
    """

    fx: float
    fy: float
    cx: float
    cy: float
    width: int
    height: int
    world_to_camera: np.ndarray = field(default_factory=lambda: np.eye(4))
    near: float = 0.01
    far: float = 1e10
    model: str = "pinhole"
    distortion: Distortion | None = None
    # squared undistorted radius beyond which a distorted camera culls centres (radial_limit)
    r2_max: float = field(default=math.inf, init=False, repr=False)

    def __post_init__(self):
        for name in ("fx", "fy"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float, np.floating, np.integer)) and math.isfinite(value) and value > 0):
                raise ValueError(f"Camera.{name} must be a finite number > 0, got {value!r}")
        for name in ("cx", "cy"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float, np.floating, np.integer)) and math.isfinite(value)):
                raise ValueError(f"Camera.{name} must be a finite number, got {value!r}")
        _check_size_and_range(self)
        w2c = np.array(self.world_to_camera, dtype=np.float64)
        # checked on Python floats: numpy's machinery costs more than a Camera's arithmetic
        rows = w2c.tolist() if w2c.shape == (4, 4) else None
        if rows is None or not all(math.isfinite(v) for row in rows for v in row):
            raise ValueError(f"Camera.world_to_camera must be a finite (4, 4) matrix, got {w2c.tolist()}")
        if not all(abs(v - w) <= 1e-8 + 1e-5 * abs(w) for v, w in zip(rows[3], (0.0, 0.0, 0.0, 1.0))):
            raise ValueError(f"Camera.world_to_camera last row must be (0, 0, 0, 1), got {w2c[3]}")
        w2c.setflags(write=False)
        object.__setattr__(self, "world_to_camera", w2c)
        for name in ("fx", "fy", "cx", "cy", "near", "far"):
            object.__setattr__(self, name, float(getattr(self, name)))
        center = np.array(_center_of(rows))
        center.setflags(write=False)
        object.__setattr__(self, "_center", center)
        distortion = _check_model(self, self.distortion)
        object.__setattr__(self, "distortion", distortion)
        if distortion is not None:
            corner = corner_radius(self.fx, self.fy, self.cx, self.cy, self.width, self.height)
            object.__setattr__(self, "r2_max", radial_limit(self.model, distortion, corner))

    @property
    def K(self) -> np.ndarray:
        """(3, 3) float64 intrinsics ``[[fx, 0, cx], [0, fy, cy], [0, 0, 1]]``."""
        return np.array([[self.fx, 0.0, self.cx], [0.0, self.fy, self.cy], [0.0, 0.0, 1.0]])

    @property
    def center(self) -> np.ndarray:
        """(3,) float64 camera position in world space (read-only)."""
        return self._center

    @classmethod
    def from_fov(
        cls,
        fov_y_deg: float,
        width: int,
        height: int,
        world_to_camera: np.ndarray | None = None,
        near: float = 0.01,
        far: float = 1e10,
    ) -> Camera:
        """Square-pixel camera with vertical field of view ``fov_y_deg`` (degrees, in (0, 180))
        and the principal point at the image centre."""
        if not (0.0 < fov_y_deg < 180.0):
            raise ValueError(f"fov_y_deg must be in (0, 180) degrees, got {fov_y_deg!r}")
        focal = 0.5 * height / math.tan(0.5 * math.radians(fov_y_deg))
        return cls(
            focal,
            focal,
            0.5 * width,
            0.5 * height,
            width,
            height,
            np.eye(4) if world_to_camera is None else world_to_camera,
            near,
            far,
        )

    @classmethod
    def look_at(
        cls,
        eye,  # (3,) world position of the camera
        target,  # (3,) world point the optical axis passes through
        up,  # (3,) world "up"; appears towards the top of the image (camera -y)
        fov_y_deg: float,
        width: int,
        height: int,
        near: float = 0.01,
        far: float = 1e10,
    ) -> Camera:
        """Camera at ``eye`` looking at ``target`` (see :meth:`from_fov` for the intrinsics)."""
        eye = _as_vec3(eye, "eye")
        forward = _as_vec3(target, "target") - eye
        up = _as_vec3(up, "up")
        if np.linalg.norm(forward) == 0.0:
            raise ValueError("look_at needs target != eye")
        forward /= np.linalg.norm(forward)
        right = np.cross(forward, up)
        if np.linalg.norm(right) < 1e-12:
            raise ValueError(f"look_at: up {up} is parallel to the viewing direction")
        right /= np.linalg.norm(right)
        down = np.cross(forward, right)
        w2c = np.eye(4)
        w2c[:3, :3] = np.stack([right, down, forward])
        w2c[:3, 3] = -w2c[:3, :3] @ eye
        return cls.from_fov(fov_y_deg, width, height, w2c, near, far)

    @classmethod
    def orbit(
        cls,
        azimuths,  # (C,) radians, measured in the plane normal to `up`
        elevations,  # (C,) radians above that plane
        distance: float,  # world units from `center`
        fov_y_deg: float,
        width: int,
        height: int,
        center=(0.0, 0.0, 0.0),
        up=(0.0, 0.0, 1.0),
    ) -> list[Camera]:
        """Cameras on a sphere of radius ``distance`` around ``center``, each looking at it.

        Azimuth 0 lies along the world axis least aligned with ``up`` (x for a z-up world),
        azimuth pi/2 along ``up`` x that axis (y for z up)."""
        center, up = _as_vec3(center, "center"), _as_vec3(up, "up")
        if not (math.isfinite(distance) and distance > 0):
            raise ValueError(f"orbit distance must be a finite number > 0, got {distance!r}")
        up = up / np.linalg.norm(up)
        helper = np.eye(3)[np.argmin(np.abs(up))]
        a = helper - (helper @ up) * up
        a /= np.linalg.norm(a)
        b = np.cross(up, a)
        cams = []
        for az, el in zip(azimuths, elevations):
            direction = math.cos(el) * (math.cos(az) * a + math.sin(az) * b) + math.sin(el) * up
            cams.append(cls.look_at(center + distance * direction, center, up, fov_y_deg,
                                    width, height))
        return cams

    @staticmethod
    def batch(cameras) -> tuple[Camera, ...]:
        """A batch of cameras: a tuple of :class:`Camera`. ``render_gaussians`` given a
        batch (or any list/tuple of cameras) renders each and returns a list of outputs."""
        cams = tuple(cameras)
        for i, cam in enumerate(cams):
            if not isinstance(cam, Camera):
                raise TypeError(f"Camera.batch expects Camera objects, item {i} is {type(cam).__name__}")
        return cams


@dataclass(frozen=True, eq=False)
class DeviceCameras:
    """C cameras of one image size and model whose matrices stay on the device.

    ``render_gaussians`` reads them in its projection kernel, so cameras computed on the
    device (or held in torch CUDA tensors) need no copy to the host and no sync. Same
    conventions as :class:`Camera`; the values are checked on the device, with the
    Gaussians' flags: a non-finite matrix, a focal length <= 0 or a last row other than
    (0, 0, 0, 1) raises ValueError from ``render_gaussians``, and so does a non-finite
    distortion coefficient or a distortion whose radial map is not monotonic out to the
    image's corners (as :class:`Camera` checks on the host; on the device the map is
    sampled at 256 ray angles and the fold located by bisection).

    Args:
        viewmats: (C,) ``wp.mat44`` float32 world -> camera rigid transforms.
        intrinsics: (C,) ``wp.mat33`` float32 ``[[fx, 0, cx], [0, fy, cy], [0, 0, 1]]``
            (pixels), on the device of ``viewmats``.
        width, height: image size in pixels (>= 1).
        near, far: depth range on camera z (world units), ``0 < near < far``.
        model: ``"pinhole"``, ``"ortho"`` or ``"fisheye"``, for every camera.
        distortion: None or (C, K) float32 coefficients per camera, in OpenCV's order for
            ``model`` (:meth:`Distortion.from_coefficients`): pinhole K = 4, 5 or 8,
            fisheye K = 4; on the device of ``viewmats``.
    """

    viewmats: object
    intrinsics: object
    width: int
    height: int
    near: float = 0.01
    far: float = 1e10
    model: str = "pinhole"
    distortion: object = None

    def __post_init__(self):
        check_array(self.viewmats, "DeviceCameras.viewmats", wp.mat44, 1)
        check_array(self.intrinsics, "DeviceCameras.intrinsics", wp.mat33, 1, self.viewmats.shape,
                    self.viewmats.device)
        _check_size_and_range(self)
        if self.model not in CAMERA_MODELS:
            raise ValueError(f"DeviceCameras.model must be one of {CAMERA_MODELS}, got {self.model!r}")
        if self.distortion is not None:
            if self.model not in DISTORTION_ORDER:
                raise ValueError(f"DeviceCameras: an {self.model!r} camera has no lens distortion; "
                                 "pass distortion=None")
            check_array(self.distortion, "DeviceCameras.distortion", wp.float32, 2, None, self.viewmats.device)
            c, k = self.distortion.shape
            if c != len(self) or k not in DISTORTION_LENGTHS[self.model]:
                raise ValueError(
                    f"DeviceCameras.distortion must have shape (C={len(self)}, K) with K in "
                    f"{DISTORTION_LENGTHS[self.model]} ({self.model}: {DISTORTION_ORDER[self.model]}), "
                    f"got {tuple(self.distortion.shape)}")

    def __len__(self) -> int:
        return self.viewmats.shape[0]
