"""arc_warp_newton: differentiable simulation state -> Gaussians for arc_warp.

Differentiate images through a simulation: convert particles / rigid shapes to
Gaussians at every step (:func:`particles_to_gaussians`, :func:`bodies_to_gaussians`),
render them with ``arc_warp.render_gaussians`` on the same ``wp.Tape`` and call
``tape.backward``; gradients reach the simulation's initial state and parameters.

Or render rigid bodies' triangle meshes with ``arc_warp.mesh``
(:func:`render_body_meshes` of :class:`BodyMeshes` at ``State.body_q``, gathered from a
model by :func:`model_mesh_shapes`): image losses then give the body poses gradients.

Or let :class:`SensorHybridCamera` render a model's meshes, primitives and Gaussian shapes
together, every world and camera in one ``update(state, camera_transforms)`` (newton's
``SensorCamera`` conventions), differentiable in the bodies, shapes, Gaussians and cameras.

The conversions, the mesh renderer and the minimal Warp integrator
(:class:`ParticleIntegrator`) need only warp and numpy. :class:`NewtonRollout`,
:func:`shape_surface_samples`, :func:`model_mesh_shapes` and :class:`SensorHybridCamera`
need newton (the checkout's
``newton`` extra); they are imported on first use.
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
from .mesh_render_ops import BodyMeshes, MeshRender, body_meshes_to_clip, camera_clip_matrix, render_body_meshes

# name -> module that needs newton
_NEWTON_NAMES = {"NewtonRollout": "newton_bridge", "shape_surface_samples": "newton_bridge",
                 "model_mesh_shapes": "mesh_shapes", "SensorHybridCamera": "sensor", "SensorGaussians": "sensor_tables",
                 "look_at_transform": "sensor"}
NEWTON_HINT = "pip install -e '.[newton]' (from the arc_warp checkout)"


def __getattr__(name):
    if name in _NEWTON_NAMES:
        import importlib

        try:
            module = importlib.import_module(f"{__name__}.{_NEWTON_NAMES[name]}")
        except ImportError as exc:
            if exc.name is None or not exc.name.startswith("newton"):
                raise
            raise ImportError(
                f"arc_warp_newton.{name} needs the newton simulator: {NEWTON_HINT}"
            ) from exc
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def newton_available() -> bool:
    """True when the newton package can be imported."""
    import importlib.util

    return importlib.util.find_spec("newton") is not None


__all__ = [
    "NEWTON_HINT",
    "BodyMeshes",
    "IntegratorSettings",
    "MeshRender",
    "NewtonRollout",
    "ParticleIntegrator",
    "SensorGaussians",
    "SensorHybridCamera",
    "SimGaussians",
    "SurfaceSamples",
    "bodies_to_gaussians",
    "body_meshes_to_clip",
    "box_surface_points",
    "box_surface_samples",
    "camera_clip_matrix",
    "model_mesh_shapes",
    "look_at_transform",
    "newton_available",
    "particles_to_gaussians",
    "render_body_meshes",
    "shape_surface_samples",
    "sphere_surface_points",
    "sphere_surface_samples",
]
