"""3D Gaussian splatting with an ARC-reduced backward (gsplat 1.5.3 "classic" conventions)."""

from ._src.camera import Camera, DeviceCameras
from ._src.splat.records import GaussianGrads, RenderOutput, RenderSettings
from ._src.splat.render import render_gaussians, render_gaussians_backward
from ._src.splat.sh_kernels import SH_C0
from ._src.splat.surface_ops import surface_from_mesh
from ._src.splat.workspace import Workspace

__all__ = ["SH_C0", "Camera", "DeviceCameras", "GaussianGrads", "RenderOutput", "RenderSettings", "Workspace", "render_gaussians",
           "render_gaussians_backward", "surface_from_mesh"]
