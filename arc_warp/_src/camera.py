"""Pinhole camera record (OpenCV / gsplat convention) and its constructors.

Camera space: +x right, +y down, +z forward. ``world_to_camera`` is gsplat's
"viewmat": a 4x4 float64 matrix mapping homogeneous world points to camera
space. Pixel ``(u, v)`` covers ``[u, u+1) x [v, v+1)``; its centre is at
``(u + 0.5, v + 0.5)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import warp as wp

from arc_warp._src.validate import check_array


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


def _as_vec3(value, name: str) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float64)
    if arr.shape != (3,) or not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be 3 finite numbers, got {value!r}")
    return arr


@dataclass(frozen=True, eq=False)
class Camera:
    """A pinhole camera.

    Args:
        fx, fy: focal lengths in pixels (> 0).
        cx, cy: principal point in pixels.
        width, height: image size in pixels (>= 1).
        world_to_camera: (4, 4) float64 rigid transform, world -> camera (OpenCV axes).
            Stored as a read-only copy.
        near, far: depth range on camera z (world units); Gaussians whose centre lies
            outside ``[near, far]`` are culled. ``0 < near < far``.
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
        if w2c.shape != (4, 4) or not np.all(np.isfinite(w2c)):
            raise ValueError(f"Camera.world_to_camera must be a finite (4, 4) matrix, got shape {w2c.shape}")
        last = w2c[3].tolist()  # as np.allclose(w2c[3], (0, 0, 0, 1)), without its array machinery
        if not all(abs(v - w) <= 1e-8 + 1e-5 * abs(w) for v, w in zip(last, (0.0, 0.0, 0.0, 1.0))):
            raise ValueError(f"Camera.world_to_camera last row must be (0, 0, 0, 1), got {w2c[3]}")
        w2c.setflags(write=False)
        object.__setattr__(self, "world_to_camera", w2c)
        for name in ("fx", "fy", "cx", "cy", "near", "far"):
            object.__setattr__(self, name, float(getattr(self, name)))
        center = np.linalg.inv(w2c)[:3, 3]
        center.setflags(write=False)
        object.__setattr__(self, "_center", center)

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
    """C pinhole cameras of one image size whose matrices stay on the device.

    ``render_gaussians`` reads them in its projection kernel, so cameras computed on the
    device (or held in torch CUDA tensors) need no copy to the host and no sync. Same
    conventions as :class:`Camera`; the values are checked on the device, with the
    Gaussians' flags: a non-finite matrix, a focal length <= 0 or a last row other than
    (0, 0, 0, 1) raises ValueError from ``render_gaussians``.

    Args:
        viewmats: (C,) ``wp.mat44`` float32 world -> camera rigid transforms.
        intrinsics: (C,) ``wp.mat33`` float32 ``[[fx, 0, cx], [0, fy, cy], [0, 0, 1]]``
            (pixels), on the device of ``viewmats``.
        width, height: image size in pixels (>= 1).
        near, far: depth range on camera z (world units), ``0 < near < far``.
    """

    viewmats: object
    intrinsics: object
    width: int
    height: int
    near: float = 0.01
    far: float = 1e10

    def __post_init__(self):
        check_array(self.viewmats, "DeviceCameras.viewmats", wp.mat44, 1)
        check_array(self.intrinsics, "DeviceCameras.intrinsics", wp.mat33, 1, self.viewmats.shape,
                    self.viewmats.device)
        _check_size_and_range(self)

    def __len__(self) -> int:
        return self.viewmats.shape[0]
