"""arc_warp_newton: differentiable simulation state -> Gaussians for arc_warp.

Differentiate images through a simulation: convert particles / rigid shapes to
Gaussians at every step (:func:`particles_to_gaussians`, :func:`bodies_to_gaussians`),
render them with ``arc_warp.render_gaussians`` on the same ``wp.Tape`` and call
``tape.backward``; gradients reach the simulation's initial state and parameters.

The conversions and the minimal Warp integrator (:class:`ParticleIntegrator`) need only
warp and numpy. :class:`NewtonRollout` and :func:`shape_surface_samples` need newton
(the checkout's ``newton`` extra); they are imported on first use.
"""

from .convert_ops import (
    SimGaussians,
    SurfaceSamples,
    bodies_to_gaussians,
    box_surface_points,
    box_surface_samples,
    particles_to_gaussians,
    sphere_surface_points,
    sphere_surface_samples,
)
from .integrator_ops import IntegratorSettings, ParticleIntegrator

_NEWTON_NAMES = ("NewtonRollout", "shape_surface_samples")
NEWTON_HINT = "pip install -e '.[newton]' (from the arc_warp checkout)"


def __getattr__(name):
    if name in _NEWTON_NAMES:
        try:
            from . import newton_bridge
        except ImportError as exc:
            if exc.name is None or not exc.name.startswith("newton"):
                raise
            raise ImportError(
                f"arc_warp_newton.{name} needs the newton simulator: {NEWTON_HINT}"
            ) from exc
        return getattr(newton_bridge, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def newton_available() -> bool:
    """True when the newton package can be imported."""
    import importlib.util

    return importlib.util.find_spec("newton") is not None


__all__ = [
    "NEWTON_HINT",
    "IntegratorSettings",
    "NewtonRollout",
    "ParticleIntegrator",
    "SimGaussians",
    "SurfaceSamples",
    "bodies_to_gaussians",
    "box_surface_points",
    "box_surface_samples",
    "newton_available",
    "particles_to_gaussians",
    "shape_surface_samples",
    "sphere_surface_points",
    "sphere_surface_samples",
]
