"""3D Gaussian splatting with an ARC-reduced backward (gsplat 1.5.3 "classic" conventions).

Two ways in: :func:`render_gaussians` / :func:`render_gaussians_backward` (functional,
recorded on ``wp.Tape``), and :class:`GaussianRenderer`, the object they run on, for
callers that hold their buffers and want renders that never wait for the device.
"""

from ._src.camera import Camera, DeviceCameras, Distortion
from ._src.splat.records import (GaussianGrads, Gaussians, ImageGrads, RenderImages, RenderOutput, RenderSettings,
                               Surface, check_gaussians)
from ._src.splat.render import render_gaussians, render_gaussians_backward
from ._src.splat.renderer import GaussianRenderer, RenderState
from ._src.splat.sh_kernels import SH_C0
from ._src.splat.status import RenderStatus
from ._src.splat.surface_ops import surface_from_mesh
from ._src.splat.validate_kernels import BAD_SLOTS, FLAG_SLOTS, OVERFLOW_SLOT
from ._src.splat.render import Workspace

__all__ = ["BAD_SLOTS", "FLAG_SLOTS", "OVERFLOW_SLOT", "SH_C0", "Camera", "DeviceCameras", "Distortion", "GaussianGrads",
           "GaussianRenderer", "Gaussians", "ImageGrads", "RenderImages", "RenderOutput", "RenderSettings", "RenderState",
           "RenderStatus", "Surface", "Workspace", "check_gaussians", "render_gaussians", "render_gaussians_backward",
           "surface_from_mesh"]
