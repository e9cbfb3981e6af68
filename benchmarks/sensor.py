"""SensorHybridCamera: 64 worlds in one update against 64 updates, and hybrid compositing's cost.

Workloads (issue 39), on a newton model of W worlds, each a box and a sphere on a body
among N Gaussians (a ``GeoType.GAUSSIAN`` shape per world), one camera per world:

- ``batched`` / ``separate``: one ``update`` over the W views against W updates of one
  view each, forward (``fwd``) and forward + backward (``fwd_bwd``: the update and a
  squared-image loss on a ``wp.Tape``, then ``tape.backward``);
- ``composite`` / ``plain``: one view's splat render (``arc_warp.render_gaussians`` of the
  world's Gaussians) with the shapes' surface (``surface_colors=``, ``surface_depths=``,
  made once outside the timing) against the same render without it, forward and
  forward + backward (``render_gaussians_backward``): the cost of compositing.

Each call is timed as a user's call on an idle device (CUDA events on Warp's stream around
it, its host work included; the host clock on the CPU), the cases interleaved, medians of
``--reps`` after ``--warmup``. Needs newton.
"""

from __future__ import annotations

import numpy as np
import warp as wp

from benchmarks import results, timing

BACKGROUND = (0.05, 0.05, 0.08)


@wp.kernel
def squared_sum(image: wp.array3d(dtype=wp.vec3), loss: wp.array(dtype=float)):
    v, y, x = wp.tid()
    wp.atomic_add(loss, 0, wp.dot(image[v, y, x], image[v, y, x]))


def build_model(worlds: int, gaussians: int, device):
    """W worlds of one body (a box and a sphere) among ``gaussians`` blobs (one static,
    unscaled Gaussian shape per world, sharing its asset)."""
    import newton

    rng = np.random.default_rng(0)
    n = gaussians
    blobs = newton.Gaussian(positions=np.stack([rng.uniform(-1.2, 1.2, n), rng.uniform(-0.6, 0.9, n),
                                                rng.uniform(-0.4, 1.4, n)], 1),
                            rotations=rng.normal(size=(n, 4)), scales=np.exp(rng.uniform(-3.5, -2.3, (n, 3))),
                            opacities=rng.uniform(0.2, 0.8, n), sh_coeffs=rng.normal(0.0, 0.9, (n, 3)))
    world = newton.ModelBuilder(up_axis=newton.Axis.Z)
    body = world.add_body(xform=wp.transform(wp.vec3(0.0, 0.0, 0.4), wp.quat_rpy(0.3, -0.2, 0.5)))
    world.add_shape_box(body, hx=0.25, hy=0.18, hz=0.14)
    world.add_shape_sphere(body, xform=wp.transform(wp.vec3(0.3, 0.0, 0.2), wp.quat_identity()), radius=0.15)
    world.add_shape_gaussian(-1, gaussian=blobs)
    builder = newton.ModelBuilder(up_axis=newton.Axis.Z)
    for _ in range(worlds):
        builder.add_world(world)
    return builder.finalize(device=device, requires_grad=True)


def sensor_cases(sensor, state, cameras, worlds: int) -> dict:
    """The batched and separate updates, forward and forward + backward."""
    device = sensor.device
    all_views = list(range(worlds))
    singles = [wp.array(cameras.numpy()[v:v + 1], dtype=wp.transform, device=device) for v in all_views]

    def forward(views):
        def run():
            for cams, indices in views:
                sensor.update(state, cams, world_indices=indices)
        return run

    def forward_backward(views):
        def run():
            for cams, indices in views:
                tape = wp.Tape()
                loss = wp.zeros(1, dtype=float, device=device, requires_grad=True)
                with tape:
                    image = sensor.update(state, cams, world_indices=indices)
                    wp.launch(squared_sum, dim=image.shape, inputs=[image], outputs=[loss], device=device)
                tape.backward(loss)
                tape.zero()
        return run

    batched = [(cameras, all_views)]
    separate = [(singles[v], [v]) for v in all_views]
    return {"batched_fwd": forward(batched), "separate_fwd": forward(separate),
            "batched_fwd_bwd": forward_backward(batched), "separate_fwd_bwd": forward_backward(separate)}


def composite_cases(model, sensor, state, camera_transform) -> dict:
    """One view's splat render with and without the shapes' surface (core calls)."""
    import newton

    import arc_warp_newton as awn
    from arc_warp import Camera, RenderSettings, Workspace, render_gaussians, render_gaussians_backward
    from arc_warp.splat import surface_from_mesh

    device = sensor.device
    # world 0's Gaussians (static, unscaled: their asset frame is the world's) and shapes,
    # seen by the OpenCV camera of newton's camera transform
    flip = np.diag([1.0, -1.0, -1.0, 1.0])
    t = np.asarray(camera_transform, np.float64)
    x, y, z, w = t[3:]
    rot = np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                    [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                    [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])
    world_from_camera = np.eye(4)
    world_from_camera[:3, :3], world_from_camera[:3, 3] = rot, t[:3]
    c = sensor.camera
    camera = Camera(c.fx, c.fy, c.cx, c.cy, c.width, c.height, flip @ np.linalg.inv(world_from_camera), c.near, c.far)
    g = sensor.gaussians
    gaussian_shape = int(np.flatnonzero(model.shape_type.numpy() == int(newton.GeoType.GAUSSIAN))[0])
    start, count = sensor.gaussian_rows(gaussian_shape)
    quats = g.rotations.numpy()[start:start + count][:, [3, 0, 1, 2]]
    rgb = np.maximum(0.28209479177387814 * g.sh_dc.numpy()[start:start + count] + 0.5, 0.0)
    inputs = [wp.array(a, dtype=dt, device=device, requires_grad=True)
              for a, dt in ((g.positions.numpy()[start:start + count], wp.vec3), (quats, wp.vec4),
                            (g.scales.numpy()[start:start + count], wp.vec3),
                            (g.opacities.numpy()[start:start + count], wp.float32), (rgb, wp.vec3))]
    meshes = awn.model_mesh_shapes(model)
    body0 = meshes.body.numpy() == 0  # world 0's body
    meshes = awn.BodyMeshes.from_numpy(meshes.points.numpy()[body0],
                                       _kept_triangles(meshes.tri.numpy(), body0), meshes.body.numpy()[body0],
                                       meshes.colors.numpy()[body0], device)
    out = awn.render_body_meshes(state.body_q, meshes, camera, antialias=False)
    surface_colors, surface_depths = surface_from_mesh(out.color, out.rast, out.clip, meshes.tri, flip_y=False)
    if not np.isfinite(surface_depths.numpy()).any():
        raise RuntimeError("the shapes are out of view: the composite case would time no surface")
    surface = {"surface_colors": surface_colors[0], "surface_depths": surface_depths[0]}
    settings = RenderSettings(background=BACKGROUND)
    workspace = Workspace(device)
    grad = wp.ones((c.height, c.width), dtype=wp.vec3, device=device)

    def render(with_surface: bool, backward: bool):
        def run():
            o = render_gaussians(*inputs, camera, settings, workspace=workspace, **(surface if with_surface else {}))
            if backward:
                render_gaussians_backward(o, grad)
        return run

    return {"composite_fwd": render(True, False), "plain_fwd": render(False, False),
            "composite_fwd_bwd": render(True, True), "plain_fwd_bwd": render(False, True)}


def _kept_triangles(tri: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """The triangles whose vertices are all kept, renumbered over the kept vertices."""
    index = np.cumsum(kept) - 1
    return index[tri[kept[tri].all(axis=1)]]


def add_arguments(parser) -> None:
    parser.add_argument("--worlds", type=int, default=64)
    parser.add_argument("--size", type=int, default=128, help="image width = height, pixels")
    parser.add_argument("--gaussians", type=int, default=5000, help="Gaussians per world")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)


def run(args) -> dict:
    import warp as wp

    import arc_warp_newton as awn
    from arc_warp import RenderSettings

    if args.smoke:
        args.worlds, args.size, args.gaussians, args.reps, args.warmup = 3, 24, 50, 2, 1
    device = wp.get_device("cpu" if args.smoke or not wp.is_cuda_available() else "cuda")
    model = build_model(args.worlds, args.gaussians, device)
    state = model.state(requires_grad=True)
    sensor = awn.SensorHybridCamera(model, args.size, args.size, camera_fov=0.9,
                                    settings=RenderSettings(background=BACKGROUND))
    eye = awn.look_at_transform((0.2, -2.6, 1.0), (0.0, 0.2, 0.4))
    cameras = wp.array([eye] * args.worlds, dtype=wp.transform, device=device, requires_grad=True)
    cases = {**sensor_cases(sensor, state, cameras, args.worlds),
             **composite_cases(model, sensor, state, np.asarray(eye))}
    ms = {name: t["device_ms"] for name, t in
          timing.medians(timing.Clock(device, "warp"), cases, args.warmup, args.reps).items()}
    row = {"worlds": args.worlds, "size": args.size, "gaussians_per_world": args.gaussians, **ms}
    return {"device": device.name if device.is_cuda else "cpu", "rows": [row],
            "notes": [] if device.is_cuda else ["no CUDA device: times are the host clock's"]}


def table(result: dict) -> str:
    num, ratio, out = results.num, results.ratio, []
    for r in result["rows"]:
        for what in ("fwd", "fwd_bwd"):
            out.append([str(r["worlds"]), f"{r['size']}²", str(r["gaussians_per_world"]), what.replace("_", "+"),
                        num(r[f"batched_{what}"]), num(r[f"separate_{what}"]),
                        ratio(r[f"batched_{what}"], r[f"separate_{what}"]), num(r[f"composite_{what}"]),
                        num(r[f"plain_{what}"]), ratio(r[f"composite_{what}"], r[f"plain_{what}"])])
    return results.markdown(["worlds", "size", "Gaussians per world", "pass", "one update ms", "W updates ms",
                             "one ÷ W updates", "composite ms", "plain ms", "composite ÷ plain"], out)
