"""arc_warp: differentiable rasterization in NVIDIA Warp with ARC adaptive atomic reduction."""

__version__ = "0.13.0"

from .ply import GaussianPly, PlyFormatError, read_ply, write_ply
from .arc import (MODES, Calibration, accumulator, calibrate, keyed_plan, planned_accumulator, resolve_threshold,
                  scatter_add, warp_plan, warp_reducer)
from .arc import ADJOINT_MODES, AdjointSite, adjoint_sites, arc_adjoint
from ._src.png import write_png
from .splat import (Camera, DeviceCameras, Distortion, GaussianGrads, GaussianRenderer, Gaussians, ImageGrads,
                    RenderImages, RenderOutput, RenderSettings, RenderState, RenderStatus, Workspace, check_gaussians,
                    render_gaussians, render_gaussians_backward)

__all__ = [
    "ADJOINT_MODES",
    "AdjointSite",
    "MODES",
    "Calibration",
    "Camera",
    "DeviceCameras",
    "Distortion",
    "GaussianGrads",
    "GaussianRenderer",
    "Gaussians",
    "ImageGrads",
    "GaussianPly",
    "PlyFormatError",
    "RenderImages",
    "RenderOutput",
    "RenderSettings",
    "RenderState",
    "RenderStatus",
    "accumulator",
    "adjoint_sites",
    "arc_adjoint",
    "calibrate",
    "check_gaussians",
    "keyed_plan",
    "planned_accumulator",
    "read_ply",
    "render_gaussians",
    "render_gaussians_backward",
    "resolve_threshold",
    "scatter_add",
    "warp_plan",
    "warp_reducer",
    "Workspace",
    "write_ply",
    "write_png",
]
