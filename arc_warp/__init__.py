"""arc_warp: differentiable rasterization in NVIDIA Warp with ARC adaptive atomic reduction."""

__version__ = "0.1.0"

from .reduce import MODES, Calibration, accumulator, calibrate, resolve_threshold, scatter_add

__all__ = ["MODES", "Calibration", "accumulator", "calibrate", "resolve_threshold", "scatter_add"]

from .splat import Camera, GaussianGrads, RenderOutput, RenderSettings, render_gaussians, render_gaussians_backward

__all__ += ["Camera", "GaussianGrads", "RenderOutput", "RenderSettings", "render_gaussians", "render_gaussians_backward"]
