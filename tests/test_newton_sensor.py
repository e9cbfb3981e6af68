"""arc_warp_newton.SensorHybridCamera: a newton model's meshes, primitives and Gaussian
shapes, every world and camera in one call.

Checked: the shape templates against their analytic surfaces; each view against a
reference composite built in float64 numpy (newton's camera convention, shape and body
transforms, world membership) and rendered by the core's own mesh + splat path, its
silhouettes antialiased over the composite; W worlds x
C cameras in one call against W*C single calls (bit for bit on the CPU); gradients of the
bodies, camera transforms, shape scale and Gaussian parameters against central
differences; bad input; and the example's 5 % bar.
"""

import math

import numpy as np
import pytest
import warp as wp
from conftest import needs_cpu_kernels

import arc_warp_newton as awn
from arc_warp_newton.examples import fit_throw_pose

newton = pytest.importorskip("newton", reason="the sensor needs newton (pip install arc-warp[newton])")

import arc_warp.mesh as dr  # noqa: E402
from arc_warp import Camera, RenderSettings, render_gaussians  # noqa: E402
from arc_warp.splat import surface_from_mesh  # noqa: E402
from arc_warp_newton.convert_ops import _shape_to_body  # noqa: E402
from arc_warp_newton.mesh_shapes import shape_template  # noqa: E402
from arc_warp_newton.shape_templates import capsule_template, ellipsoid_template  # noqa: E402

wp.config.log_level = wp.LOG_WARNING

SH_C0 = 0.28209479177387814
BACKGROUND = (0.1, 0.2, 0.3)
W, H = 40, 30


def gaussian_asset(rng, n, spread=0.5, size=0.06):
    return newton.Gaussian(positions=rng.uniform(-spread, spread, (n, 3)),
                           rotations=_unit(rng.normal(size=(n, 4))),
                           scales=np.exp(rng.uniform(np.log(0.5 * size), np.log(size), (n, 3))),
                           opacities=rng.uniform(0.3, 0.9, n), sh_coeffs=rng.normal(0.0, 0.8, (n, 3)))


def _unit(q):
    return q / np.linalg.norm(q, axis=-1, keepdims=True)


def build_model(rng, worlds=2, requires_grad=True, device="cpu"):
    """Worlds that differ: world k has a body with a cube mesh and a capsule, a Gaussian
    asset on the body and a static one of its own size; odd worlds add a box and an
    ellipsoid; a global sphere sits in every world."""
    pts, _, tri, _ = dr.cube(0.5)
    mesh = newton.Mesh(pts, tri.ravel())
    builder = newton.ModelBuilder(up_axis=newton.Axis.Z)
    for k in range(worlds):
        world = newton.ModelBuilder(up_axis=newton.Axis.Z)
        body = world.add_body(xform=wp.transform(wp.vec3(0.1 * k, 0.0, 0.0), wp.quat_identity()))
        world.add_shape_mesh(body, mesh=mesh, scale=(1.0, 0.8, 1.2))
        world.add_shape_capsule(body, xform=wp.transform(wp.vec3(0.0, 0.0, 0.45), wp.quat_rpy(0.3, 0.0, 0.0)),
                                radius=0.1, half_height=0.3)
        world.add_shape_gaussian(body, gaussian=gaussian_asset(rng, 12, 0.3), scale=(1.5, 1.5, 1.5),
                                 xform=wp.transform(wp.vec3(0.0, -0.3, 0.0), wp.quat_rpy(0.0, 0.2, 0.1)))
        world.add_shape_gaussian(-1, gaussian=gaussian_asset(rng, 20 + 5 * k, 0.9))
        if k % 2:
            world.add_shape_box(-1, xform=wp.transform(wp.vec3(-0.6, 0.5, -0.3), wp.quat_rpy(0.0, 0.0, 0.4)),
                                hx=0.2, hy=0.1, hz=0.15)
            world.add_shape_ellipsoid(body, xform=wp.transform(wp.vec3(0.4, 0.0, -0.2), wp.quat_identity()),
                                      rx=0.15, ry=0.1, rz=0.2)
        builder.add_world(world)
    builder.add_shape_sphere(-1, xform=wp.transform(wp.vec3(0.5, 0.6, 0.4), wp.quat_identity()), radius=0.15)
    return builder.finalize(device=device, requires_grad=requires_grad)


def posed_state(model, rng):
    """A state whose bodies are moved and turned differently per world."""
    state = model.state(requires_grad=True)
    q = state.body_q.numpy()
    q[:, :3] += rng.uniform(-0.1, 0.1, (len(q), 3))
    q[:, 3:] = _unit(q[:, 3:] + rng.uniform(-0.2, 0.2, (len(q), 4)))
    state.body_q.assign(q)
    return state


EYES = [(0.3, -3.0, 0.6), (2.2, -1.8, 1.4), (-2.0, -2.2, -0.8)]


def camera_transforms(views, requires_grad=False):
    return wp.array([awn.look_at_transform(EYES[i % len(EYES)], (0.0, 0.05, 0.1)) for i in views],
                    dtype=wp.transform, device="cpu", requires_grad=requires_grad)


def sensor_of(model, **kw):
    kw.setdefault("camera_fov", 0.8)
    return awn.SensorHybridCamera(model, W, H, settings=RenderSettings(background=BACKGROUND), **kw)


# --- a float64 reference of one view ---------------------------------------------------


def _matrix(t):
    """(4, 4) float64 of a (7,) transform (p, q xyzw)."""
    t = np.asarray(t, np.float64)
    m = np.eye(4)
    m[:3, :3] = _rotation(t[3:])
    m[:3, 3] = t[:3]
    return m


def _rotation(q):
    x, y, z, w = np.asarray(q, np.float64) / np.linalg.norm(q)
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                     [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                     [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])


def _quat(r):
    """xyzw of a rotation matrix (float64)."""
    w = math.sqrt(max(0.0, 1.0 + np.trace(r))) / 2.0
    if w > 1e-3:
        return np.array([r[2, 1] - r[1, 2], r[0, 2] - r[2, 0], r[1, 0] - r[0, 1], 4 * w * w]) / (4 * w)
    i = int(np.argmax(np.diag(r)))
    j, k = (i + 1) % 3, (i + 2) % 3
    s = math.sqrt(1.0 + r[i, i] - r[j, j] - r[k, k]) * 2.0
    q = np.zeros(4)
    q[i], q[j], q[k], q[3] = s / 4, (r[j, i] + r[i, j]) / s, (r[k, i] + r[i, k]) / s, (r[k, j] - r[j, k]) / s
    return q


def reference_view(model, sensor, body_q, camera, world):
    """The view by the core's own calls: world-frame Gaussians (float64 numpy) and the
    world's shapes through render_body_meshes, surface_from_mesh and render_gaussians with
    an OpenCV camera built from newton's transform (flip y and z)."""
    flip = np.diag([1.0, -1.0, -1.0, 1.0])
    cam = sensor.camera
    view = Camera(cam.fx, cam.fy, cam.cx, cam.cy, cam.width, cam.height, flip @ np.linalg.inv(_matrix(camera)),
                  cam.near, cam.far)
    types, worlds = model.shape_type.numpy(), model.shape_world.numpy()
    scales, xforms, bodies = model.shape_scale.numpy(), model.shape_transform.numpy(), model.shape_body.numpy()
    colors = model.shape_color.numpy()
    means, quats, sizes, opacities, rgb, parts = [], [], [], [], [], []
    for s in range(len(types)):
        if worlds[s] not in (world, -1) or types[s] == int(newton.GeoType.PLANE):
            continue
        pose = _matrix(xforms[s])
        if bodies[s] >= 0:
            pose = _matrix(body_q[bodies[s]]) @ pose
        if types[s] == int(newton.GeoType.GAUSSIAN):
            g = model.shape_source[s]
            local = g.positions * scales[s]
            means.append(local @ pose[:3, :3].T + pose[:3, 3])
            quats.append([np.roll(_quat(pose[:3, :3] @ _rotation(q)), 1) for q in g.rotations])
            sizes.append(g.scales * scales[s].mean())
            opacities.append(g.opacities)
            rgb.append(np.maximum(SH_C0 * g.sh_coeffs[:, :3] + 0.5, 0.0))
        else:
            t = shape_template(int(types[s]), model.shape_source[s], 12, 24)
            world_points = _shape_to_body(t.points(scales[s]), xforms[s])
            if bodies[s] >= 0:
                world_points = _shape_to_body(world_points, body_q[bodies[s]])
            parts.append(awn.BodyMeshes.from_numpy(world_points, t.tri, -1, colors[s], device="cpu"))
    meshes = awn.BodyMeshes.concat(parts)
    out = awn.render_body_meshes(wp.zeros(1, dtype=wp.transform, device="cpu"), meshes, view, antialias=False)
    surface_colors, surface_depths = surface_from_mesh(out.color, out.rast, out.clip, meshes.tri, flip_y=False)
    arrays = [wp.array(np.concatenate(x).astype(np.float32), dtype=dt, device="cpu")
              for x, dt in ((means, wp.vec3), (quats, wp.vec4), (sizes, wp.vec3), (opacities, wp.float32),
                            (rgb, wp.vec3))]
    composite = render_gaussians(*arrays, view, RenderSettings(background=BACKGROUND),
                                 surface_colors=surface_colors[0], surface_depths=surface_depths[0]).color
    # the silhouettes are antialiased over the composite
    image = composite.numpy()[None]
    return dr.antialias(wp.array(image, dtype=wp.float32, device="cpu"), out.rast, out.clip, meshes.tri,
                        topology_hash=meshes.topology).numpy()[0]


# --- tests -----------------------------------------------------------------------------


def test_templates_lie_on_their_shapes():
    t = capsule_template(3, 10)
    p = t.points((0.2, 0.5, 0.0))  # radius 0.2, half height 0.5, along z
    axis = np.clip(p[:, 2], -0.5, 0.5)
    dist = np.linalg.norm(p - np.stack([0 * axis, 0 * axis, axis], 1), axis=1)
    np.testing.assert_allclose(dist, 0.2, rtol=1e-6)
    assert p[:, 2].min() == pytest.approx(-0.7) and p[:, 2].max() == pytest.approx(0.7)
    e = ellipsoid_template(6, 8).points((0.3, 0.2, 0.1))
    np.testing.assert_allclose(((e / [0.3, 0.2, 0.1]) ** 2).sum(1), 1.0, rtol=1e-6)
    box = shape_template(int(newton.GeoType.BOX), None, 4, 6).points((0.1, 0.2, 0.3))
    np.testing.assert_allclose(np.abs(box), np.broadcast_to([0.1, 0.2, 0.3], box.shape))
    # closed: every edge has two triangles, which antialiasing's silhouettes need
    for tri in (t.tri, ellipsoid_template(6, 8).tri):
        edges = np.sort(np.concatenate([tri[:, [0, 1]], tri[:, [1, 2]], tri[:, [2, 0]]]), axis=1)
        assert set(np.unique(edges, axis=0, return_counts=True)[1]) == {2}


def test_views_match_a_reference_composite(rng):
    model = build_model(rng, worlds=2)
    state = posed_state(model, rng)
    sensor = sensor_of(model)
    worlds = [0, 1, 1]
    cams = camera_transforms([0, 1, 2])
    image = sensor.update(state, cams, world_indices=worlds).numpy()
    for v, w in enumerate(worlds):
        want = reference_view(model, sensor, state.body_q.numpy(), cams.numpy()[v], w)
        diff = np.abs(image[v] - want).max(-1)
        # float32 transforms composed in another order move vertices and centres by ~1e-7
        # relative: a pixel centre within that of an edge may change hands (a few pixels);
        # everywhere else the images agree to float32 rounding
        assert (diff > 1e-4).sum() <= 3, (v, (diff > 1e-4).sum())
        assert np.median(diff) < 1e-6
        # the view shows its world: meshes, Gaussians and background all present
        assert (np.abs(want - BACKGROUND).max(-1) > 0.05).mean() > 0.1
    # world 1 has shapes world 0 lacks, and its bodies are posed differently
    assert np.abs(image[1] - reference_view(model, sensor, state.body_q.numpy(), cams.numpy()[1], 0)).max() > 0.1


def _loss_grads(sensor, state, cams, worlds, cot):
    tape = wp.Tape()
    with tape:
        image = sensor.update(state, cams, world_indices=worlds)
    tape.backward(grads={image: wp.array(cot, dtype=wp.vec3, device="cpu")})
    return image.numpy(), tape


def test_batch_equals_single_views(rng):
    # 3 worlds x 2 cameras in one call against 6 calls of one view: images and the
    # per-view camera gradients bit for bit; gradients summed over views (bodies, Gaussian
    # parameters) equal up to the order of the float32 sum
    model = build_model(rng, worlds=3)
    state = posed_state(model, rng)
    sensor = sensor_of(model)
    worlds = [w for w in range(3) for _ in range(2)]
    cam_ids = [c for _ in range(3) for c in range(2)]
    cot = rng.normal(size=(len(worlds), H, W, 3)).astype(np.float32)
    cams = camera_transforms(cam_ids, requires_grad=True)
    batch, tape = _loss_grads(sensor, state, cams, wp.array(worlds, dtype=wp.int32, device="cpu"), cot)
    batch_cam_grad = cams.grad.numpy().copy()
    batch_body_grad = state.body_q.grad.numpy().copy()
    batch_pos_grad = sensor.gaussians.positions.grad.numpy().copy()
    tape.zero()
    body_grad = np.zeros_like(batch_body_grad)
    pos_grad = np.zeros_like(batch_pos_grad)
    for v, (w, c) in enumerate(zip(worlds, cam_ids)):
        one = camera_transforms([c], requires_grad=True)
        single, tape = _loss_grads(sensor, state, one, [w], cot[v:v + 1])
        np.testing.assert_array_equal(single[0], batch[v])
        np.testing.assert_array_equal(one.grad.numpy()[0], batch_cam_grad[v])
        body_grad += state.body_q.grad.numpy()
        pos_grad += sensor.gaussians.positions.grad.numpy()
        tape.zero()
    assert np.abs(batch_cam_grad).min() > 0 and np.abs(batch_body_grad).max() > 0
    np.testing.assert_allclose(batch_body_grad, body_grad, rtol=1e-4, atol=1e-5 * np.abs(body_grad).max())
    np.testing.assert_allclose(batch_pos_grad, pos_grad, rtol=1e-4, atol=1e-5 * np.abs(pos_grad).max())
    assert len(set(map(bytes, batch))) == len(batch)  # every view differs from the others


def fd_model(rng):
    """One body carrying a cube mesh (two faces' colours differ) and 8 Gaussians, 6 static
    Gaussians around it: Gaussians of 2-4 px, so few pixels sit on alpha cut-offs."""
    pts, _, tri, _ = dr.cube(0.4)
    builder = newton.ModelBuilder(up_axis=newton.Axis.Z)
    body = builder.add_body(xform=wp.transform(wp.vec3(0.0, 0.0, 0.0), wp.quat_rpy(0.3, 0.2, 0.5)))
    builder.add_shape_mesh(body, mesh=newton.Mesh(pts, tri.ravel()), scale=(1.0, 1.2, 0.9))
    builder.add_shape_gaussian(body, gaussian=gaussian_asset(rng, 8, 0.35, 0.11),
                               xform=wp.transform(wp.vec3(0.0, -0.1, 0.05), wp.quat_rpy(0.1, 0.0, 0.2)))
    builder.add_shape_gaussian(-1, gaussian=gaussian_asset(rng, 6, 0.5, 0.12))
    return builder.finalize(device="cpu", requires_grad=True)


def _fd_scene(rng):
    model = fd_model(rng)
    state = model.state(requires_grad=True)
    sensor = awn.SensorHybridCamera(model, W, H, camera_fov=0.5, settings=RenderSettings(background=BACKGROUND))
    colors = sensor.mesh_colors.numpy()
    colors[::2] = rng.uniform(0.2, 0.9, size=(len(colors[::2]), 3))  # shading inside the silhouette
    sensor.mesh_colors.assign(colors)
    cams = wp.array([awn.look_at_transform((0.3, -2.0, 0.4), (0.0, 0.0, 0.0)),
                     awn.look_at_transform((1.6, -1.2, -0.5), (0.0, 0.0, 0.05))], dtype=wp.transform, device="cpu",
                    requires_grad=True)
    return model, state, sensor, cams


def _check_against_central_differences(groups, grads, loss, h_rel, smooth_share):
    """Central differences of ``loss()`` at about 10 coordinates with a gradient per group
    against ``grads``; coordinates whose quotients at h and h / 2 disagree (a jump inside
    the step) are skipped, but at least ``smooth_share[group]`` of them must be checked."""
    for name, array in groups.items():
        base = array.numpy().copy()
        flat_base, got = base.reshape(-1), grads[name].reshape(-1)
        picks = np.flatnonzero(got)[:: max(1, np.count_nonzero(got) // 10)]
        assert len(picks) >= 4, name
        kept = 0
        for i in picks:
            def central(h):
                values = []
                for sign in (1.0, -1.0):
                    moved = flat_base.copy()
                    moved[i] += sign * h
                    array.assign(moved.reshape(base.shape))
                    values.append(loss())
                array.assign(base)
                return (values[0] - values[1]) / (2.0 * h)

            h = h_rel * max(1.0, abs(flat_base[i]))
            fd, fd_half = central(h), central(h / 2)
            if abs(fd - fd_half) > 0.02 * abs(fd) + 0.02:
                continue
            kept += 1
            # 5 % + 0.03: the float32 renders' rounding (~1e-6 of the loss over 2h) and
            # the quotient's O(h^2) error, plus 2.5x the agreement demanded above
            assert abs(got[i] - fd) <= 0.05 * abs(fd) + 0.03, (name, i, got[i], fd, fd_half)
        assert kept >= smooth_share[name] * len(picks), f"{name}: only {kept}/{len(picks)} coordinates smooth"


def test_image_gradients_match_finite_differences(rng):
    # end to end, image loss -> the Gaussian parameters and the vertex colours: Gaussians of
    # 2-4 px put few pixels on alpha cut-offs, so nearly every coordinate is smooth
    model, state, sensor, cams = _fd_scene(rng)
    cot = rng.uniform(-1.0, 1.0, size=(2, H, W, 3)).astype(np.float32)
    _loss_grads(sensor, state, cams, [0, 0], cot)
    g = sensor.gaussians
    groups = {"positions": g.positions, "rotations": g.rotations, "scales": g.scales, "opacities": g.opacities,
              "sh_dc": g.sh_dc, "mesh_colors": sensor.mesh_colors}
    grads = {name: a.grad.numpy().copy() for name, a in groups.items()}

    def loss():
        image = sensor.update(state, cams, world_indices=[0, 0]).numpy()
        return float((image.astype(np.float64) * cot).sum())

    # a scale moves its Gaussian's cut-off ring over many pixels: fewer smooth coordinates
    shares = {name: 0.3 if name == "scales" else 0.6 for name in groups}
    _check_against_central_differences(groups, grads, loss, 2e-4, shares)


def test_geometry_gradients_match_finite_differences(rng):
    # bodies, cameras and shapes move every vertex and Gaussian at once, so an image loss
    # meets alpha cut-offs and silhouette pixel pairs within any step: its quotients are
    # jumps, not derivatives. What the sensor adds to the core's composite (whose gradients
    # tests/test_hybrid.py checks) is the placement of vertices and Gaussians in each
    # view's camera frame: its gradients are checked here, on a random linear function of
    # the clip positions and of every Gaussian input of the renders
    model, state, sensor, cams = _fd_scene(rng)
    lay = sensor._layout((0, 0))
    clip, _, splats = sensor._place(lay, state.body_q, cams, True)
    outputs = [clip, *splats]
    weights = [rng.normal(size=a.numpy().shape) for a in outputs]

    def loss_of(arrays):
        return sum(float((a.numpy().astype(np.float64) * w).sum()) for a, w in zip(arrays, weights))

    tape = wp.Tape()
    with tape:
        clip, _, splats = sensor._place(lay, state.body_q, cams, True)
    tape.backward(grads={a: wp.array(w.astype(np.float32), dtype=a.dtype, shape=a.shape, device="cpu")
                         for a, w in zip([clip, *splats], weights)})
    groups = {"camera transforms": cams, "body_q": state.body_q, "shape_scale": model.shape_scale,
              "shape_transform": model.shape_transform}
    grads = {name: a.grad.numpy().copy() for name, a in groups.items()}
    assert np.abs(grads["camera transforms"]).min() > 0

    def loss():
        clip, _, splats = sensor._place(lay, state.body_q, cams, False)
        return loss_of([clip, *splats])

    # smooth maps: every coordinate must pass
    _check_against_central_differences(groups, grads, loss, 1e-3, dict.fromkeys(groups, 1.0))


def test_example_recovers_the_throw_pose():
    # the bar: the initial pose, recovered through simulation and renders, ends at
    # 5 % of its starting error or better (observed 2.6-3.3 % over seeds 3-5 at 32 px)
    cfg = fit_throw_pose.ThrowPoseConfig(width=32, height=32, iterations=60)
    res = fit_throw_pose.fit(cfg)
    assert res.ratio <= 0.05, (res.ratio, res.position_errors[-1], res.rotation_errors[-1])
    assert res.losses[-1] < 0.1 * res.losses[0]


def test_example_command_line(capsys):
    assert fit_throw_pose.main(["--steps", "2", "--size", "16"]) == 0
    out = capsys.readouterr().out
    assert "step   1 loss" in out and "final pose error:" in out


def test_bad_input_raises_before_launching(rng):
    model = build_model(rng, worlds=2)
    sensor = sensor_of(model)
    state = model.state()
    cams = camera_transforms([0, 1])
    with pytest.raises(TypeError, match="state must be a newton.State"):
        sensor.update("state", cams)
    with pytest.raises(TypeError, match="camera_transforms must have dtype transform"):
        sensor.update(state, wp.zeros(2, dtype=wp.vec3, device="cpu"))
    with pytest.raises(ValueError, match="camera_transforms is empty"):
        sensor.update(state, wp.zeros(0, dtype=wp.transform, device="cpu"))
    with pytest.raises(ValueError, match=r"3 views but the model has 2 world\(s\); pass world_indices"):
        sensor.update(state, camera_transforms([0, 1, 2]))
    with pytest.raises(ValueError, match="world_indices has 1 entries for 2 camera transforms"):
        sensor.update(state, cams, world_indices=[0])
    with pytest.raises(ValueError, match=r"world_indices \[2\] are outside the model's worlds \[0, 2\)"):
        sensor.update(state, cams, world_indices=[0, 2])
    with pytest.raises(ValueError, match=r"color_image must have shape \(2, 30, 40\), got \(2, 40, 30\)"):
        sensor.update(state, cams, color_image=wp.zeros((2, W, H), dtype=wp.vec3, device="cpu"))
    other = build_model(rng, worlds=1).state()
    with pytest.raises(ValueError, match=r"state.body_q must have shape \(2,\), got \(1,\)"):
        sensor.update(other, cams)
    # a NaN camera reaches the renders' device checks
    bad = cams.numpy()
    bad[1, 0] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        sensor.update(state, wp.array(bad, dtype=wp.transform, device="cpu"))
    # the constructor
    with pytest.raises(ValueError, match="camera_fov .* or intrinsics"):
        awn.SensorHybridCamera(model, W, H)
    with pytest.raises(ValueError, match="camera_fov must be in"):
        awn.SensorHybridCamera(model, W, H, camera_fov=4.0)
    with pytest.raises(TypeError, match="newton.Model"):
        awn.SensorHybridCamera("model", W, H, camera_fov=1.0)
    builder = newton.ModelBuilder(up_axis=newton.Axis.Z)
    builder.add_ground_plane()
    with pytest.raises(ValueError, match="no visible mesh, box, sphere"):
        awn.SensorHybridCamera(builder.finalize(device="cpu"), W, H, camera_fov=1.0)
    builder.add_shape_cylinder(builder.add_body(), radius=0.1, half_height=0.2)
    builder.add_shape_box(0, hx=0.1, hy=0.1, hz=0.1)
    with pytest.raises(ValueError, match="type CYLINDER.*skip_unsupported=True"):
        awn.SensorHybridCamera(builder.finalize(device="cpu"), W, H, camera_fov=1.0)
    awn.SensorHybridCamera(builder.finalize(device="cpu"), W, H, camera_fov=1.0, skip_unsupported=True)


@pytest.mark.gpu
@pytest.mark.skipif(not wp.is_cuda_available(), reason="needs a CUDA device")
@needs_cpu_kernels
def test_cuda_matches_cpu_and_checks_devices(rng):
    cot = rng.normal(size=(3, H, W, 3)).astype(np.float32)
    results = []
    for device in ("cpu", "cuda:0"):
        model = build_model(np.random.default_rng(7), worlds=2, device=device)
        state = model.state(requires_grad=True)
        sensor = sensor_of(model)
        cams = wp.array(camera_transforms([0, 1, 2]).numpy(), dtype=wp.transform, device=device, requires_grad=True)
        tape = wp.Tape()
        with tape:
            image = sensor.update(state, cams, world_indices=[0, 1, 1])
        tape.backward(grads={image: wp.array(cot, dtype=wp.vec3, device=device)})
        results.append((image.numpy(), cams.grad.numpy(), state.body_q.grad.numpy()))
    (ci, cc, cb), (gi, gc, gb) = results
    # float32 on two devices (fused multiply-adds, atomics in another order): a pixel
    # centre near an edge may change hands
    assert (np.abs(ci - gi).max(-1) > 1e-3).mean() < 0.01
    np.testing.assert_allclose(gc, cc, rtol=2e-2, atol=2e-2 * np.abs(cc).max())
    np.testing.assert_allclose(gb, cb, rtol=2e-2, atol=2e-2 * np.abs(cb).max())
    with pytest.raises(ValueError, match="camera_transforms is on cpu, expected cuda:0"):
        sensor.update(model.state(), camera_transforms([0]))
