"""arc_warp_newton: state -> Gaussians conversions, the minimal integrator, the newton
bridge, and image-loss gradients / parameter recovery through simulation + rendering."""

import subprocess
import sys

import numpy as np
import pytest
import warp as wp

import arc_warp_newton as awn
from arc_warp_newton.fit_ops import Adam, image_mse

wp.config.log_level = wp.LOG_WARNING

needs_newton = pytest.mark.skipif(not awn.newton_available(),
                                  reason="newton not installed (pip install arc-warp[newton])")


def vec3(values, device, requires_grad=False):
    return wp.array(np.asarray(values, np.float32).reshape(-1, 3), dtype=wp.vec3, device=device,
                    requires_grad=requires_grad)


def quat_to_mat(q):  # xyzw
    x, y, z, w = q / np.linalg.norm(q)
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ])


def quat_mul(a, b):  # xyzw
    ax, ay, az, aw = a
    bx, by, bz, bw = b
    return np.array([aw * bx + ax * bw + ay * bz - az * by, aw * by - ax * bz + ay * bw + az * bx,
                     aw * bz + ax * by - ay * bx + az * bw, aw * bw - ax * bx - ay * by - az * bz])


# ---------------------------------------------------------------- conversions


def test_particles_to_gaussians_values_and_broadcast(device, rng):
    q = rng.normal(size=(7, 3)).astype(np.float32)
    radius = rng.uniform(0.1, 0.5, 7).astype(np.float32)
    g = awn.particles_to_gaussians(vec3(q, device), wp.array(radius, dtype=float, device=device), (0.2, 0.4, 0.6),
                                   0.7, radius_scale=2.0)
    np.testing.assert_array_equal(g.means.numpy(), q)
    np.testing.assert_array_equal(g.quats.numpy(), np.tile([1, 0, 0, 0], (7, 1)))
    np.testing.assert_allclose(g.scales.numpy(), np.repeat(2.0 * radius[:, None], 3, axis=1), rtol=1e-6)
    np.testing.assert_allclose(g.opacities.numpy(), 0.7, rtol=1e-6)
    np.testing.assert_allclose(g.colors.numpy(), np.tile([0.2, 0.4, 0.6], (7, 1)), rtol=1e-6)
    cols = rng.uniform(size=(7, 3)).astype(np.float32)
    g2 = awn.particles_to_gaussians(vec3(q, device), 0.3, vec3(cols, device))
    np.testing.assert_array_equal(g2.colors.numpy(), cols)
    assert g2.count == 7 and not g2.means.requires_grad


def test_particles_to_gaussians_gradient_is_exact(device, rng):
    n = 5
    q = vec3(rng.normal(size=(n, 3)), device, requires_grad=True)
    radius = wp.array(rng.uniform(0.1, 0.3, n).astype(np.float32), dtype=float, device=device, requires_grad=True)
    tape = wp.Tape()
    with tape:
        g = awn.particles_to_gaussians(q, radius, (1.0, 0.0, 0.0), radius_scale=1.5)
    w_means = rng.normal(size=(n, 3)).astype(np.float32)
    w_scales = rng.normal(size=(n, 3)).astype(np.float32)
    tape.backward(grads={g.means: vec3(w_means, device), g.scales: vec3(w_scales, device)})
    # an identity map and a linear scale: the adjoints are exact up to float32 rounding
    np.testing.assert_allclose(q.grad.numpy(), w_means, rtol=1e-6)
    np.testing.assert_allclose(radius.grad.numpy(), 1.5 * w_scales.sum(axis=1), rtol=1e-5)


def random_transforms(rng, count):
    quats = rng.normal(size=(count, 4))
    quats /= np.linalg.norm(quats, axis=1, keepdims=True)
    return np.concatenate([rng.normal(size=(count, 3)), quats], axis=1).astype(np.float32)


def test_bodies_to_gaussians_values(device, rng):
    body_q = random_transforms(rng, 2)
    local_q = random_transforms(rng, 4)[:, 3:]
    pts = rng.normal(size=(4, 3)).astype(np.float32)
    samples = awn.SurfaceSamples.from_numpy(pts, [0, 1, 1, -1], 0.05, (0.1, 0.2, 0.3), 0.8, quats=local_q,
                                            device=device)
    g = awn.bodies_to_gaussians(wp.array(body_q, dtype=wp.transform, device=device), samples)
    for i, b in enumerate([0, 1, 1, -1]):
        if b < 0:
            mean, rot = pts[i], local_q[i]
        else:
            mean = quat_to_mat(body_q[b, 3:]) @ pts[i] + body_q[b, :3]
            rot = quat_mul(body_q[b, 3:], local_q[i])
        # float32 transform of O(1) values
        np.testing.assert_allclose(g.means.numpy()[i], mean, atol=1e-5)
        np.testing.assert_allclose(g.quats.numpy()[i], [rot[3], *rot[:3]], atol=1e-5)
    np.testing.assert_allclose(g.scales.numpy(), 0.05, rtol=1e-6)
    np.testing.assert_allclose(g.opacities.numpy(), 0.8, rtol=1e-6)


def test_bodies_to_gaussians_gradient_matches_fd(device, rng):
    body_q_np = random_transforms(rng, 2)
    samples = awn.sphere_surface_samples(0, 0.3, 6, (1, 1, 1), device=device)
    samples = awn.SurfaceSamples.concat([samples, awn.box_surface_samples(1, (0.2, 0.1, 0.3), 1, (0, 1, 0),
                                                                           device=device)])
    w_means = rng.normal(size=(samples.count, 3))
    w_quats = rng.normal(size=(samples.count, 4))

    def loss(bq):
        g = awn.bodies_to_gaussians(wp.array(bq, dtype=wp.transform, device=device), samples)
        return float((g.means.numpy() * w_means).sum() + (g.quats.numpy() * w_quats).sum())

    body_q = wp.array(body_q_np, dtype=wp.transform, device=device, requires_grad=True)
    tape = wp.Tape()
    with tape:
        g = awn.bodies_to_gaussians(body_q, samples)
    tape.backward(grads={g.means: vec3(w_means, device),
                         g.quats: wp.array(w_quats.astype(np.float32), dtype=wp.vec4, device=device)})
    fd = np.zeros_like(body_q_np, dtype=np.float64)
    h = 1e-2  # the map is smooth and at most quadratic in body_q: central differences are near exact
    for idx in np.ndindex(body_q_np.shape):
        plus, minus = body_q_np.copy(), body_q_np.copy()
        plus[idx] += h
        minus[idx] -= h
        fd[idx] = (loss(plus) - loss(minus)) / (2 * h)
    # float32 losses of O(10) differenced over 2h = 0.02 leave ~1e-4 absolute noise
    np.testing.assert_allclose(body_q.grad.numpy(), fd, rtol=1e-2, atol=2e-3)


def test_surface_points_lie_on_shapes():
    pts = awn.sphere_surface_points(0.7, 50)
    np.testing.assert_allclose(np.linalg.norm(pts, axis=1), 0.7, rtol=1e-12)
    assert abs(pts.mean(axis=0)).max() < 0.05  # an even spread has its centroid near the centre
    box = awn.box_surface_points((0.1, 0.2, 0.3), 3)
    assert box.shape == (54, 3)
    on_face = np.isclose(np.abs(box) / np.array([0.1, 0.2, 0.3]), 1.0).sum(axis=1)
    assert np.all(on_face == 1)


def test_conversion_validation(device):
    q = vec3(np.zeros((3, 3)), device)
    with pytest.raises(TypeError, match="particle_q"):
        awn.particles_to_gaussians(wp.zeros(3, dtype=float, device=device), 0.1, (1, 1, 1))
    with pytest.raises(ValueError, match="radius must have 1 or 3"):
        awn.particles_to_gaussians(q, wp.zeros(2, dtype=float, device=device), (1, 1, 1))
    with pytest.raises(ValueError, match="colors"):
        awn.particles_to_gaussians(q, 0.1, (1, 1))
    samples = awn.sphere_surface_samples(2, 0.1, 4, (1, 1, 1), device=device)
    with pytest.raises(ValueError, match="body 2"):
        awn.bodies_to_gaussians(wp.zeros(2, dtype=wp.transform, device=device), samples)
    with pytest.raises(ValueError, match="broadcast"):
        awn.SurfaceSamples.from_numpy(np.zeros((4, 3)), 0, np.zeros(2), (1, 1, 1))


# ---------------------------------------------------------------- minimal integrator


def test_integrator_free_fall_and_gradients_closed_form(device, rng):
    dt, steps = 0.02, 25
    x0 = rng.normal(size=(4, 3)).astype(np.float32)
    v0, g = np.array([1.0, -0.5, 2.0]), np.array([0.3, 0.0, -9.0])
    sim = awn.ParticleIntegrator(x0, 1.0, 0.05, awn.IntegratorSettings(dt=dt), device=device)
    vel, grav = vec3(v0, device, True), vec3(g, device, True)
    tape = wp.Tape()
    with tape:
        traj = sim.rollout(vel, grav, steps)
    # symplectic Euler: x_n = x_0 + n dt v0 + dt^2 n (n + 1) / 2 g
    n = steps
    expected = x0 + n * dt * v0 + dt * dt * n * (n + 1) / 2 * g
    np.testing.assert_allclose(traj[-1].numpy(), expected, atol=1e-5)  # float32 sums of 25 steps
    tape.backward(grads={traj[-1]: vec3(np.ones((4, 3)), device)})
    np.testing.assert_allclose(vel.grad.numpy()[0], 4 * n * dt, rtol=1e-5)
    np.testing.assert_allclose(grav.grad.numpy()[0], 4 * dt * dt * n * (n + 1) / 2, rtol=1e-5)


def test_integrator_ground_contact_gradient_matches_fd(device):
    settings = awn.IntegratorSettings(dt=0.005, ground=True, ground_ke=2e3, ground_kd=1e3)
    sim = awn.ParticleIntegrator([[0.0, 0.0, 0.3], [0.1, 0.0, 0.4]], 1.0, 0.05, settings, device=device)
    grav = vec3([0.0, 0.0, -9.81], device)
    steps = 120  # falls, hits the ground around step 50, bounces

    def final(v):
        return sim.rollout(vec3(v, device), grav, steps)[-1].numpy()

    v0 = np.array([0.5, 0.0, -1.0])
    vel = vec3(v0, device, True)
    tape = wp.Tape()
    with tape:
        traj = sim.rollout(vel, grav, steps)
    assert traj[-1].numpy()[:, 2].min() > -0.01  # the ground holds the particles up
    assert min(t.numpy()[:, 2].min() for t in traj) < 0.05  # and they did reach it
    tape.backward(grads={traj[-1]: vec3([[0.0, 0.0, 1.0]] * 2, device)})
    # the bounce is strongly nonlinear in v0 (FD with h = 1e-2 is off by 9 %, and converges
    # to the adjoint as h shrinks); at h = 3e-4 float32 positions of O(0.1) leave ~2e-5 noise
    h = 3e-4
    fd = [(final(v0 + h * e)[:, 2].sum() - final(v0 - h * e)[:, 2].sum()) / (2 * h) for e in np.eye(3)]
    np.testing.assert_allclose(vel.grad.numpy()[0], fd, rtol=1e-2, atol=1e-4)


# ---------------------------------------------------------------- fitting helpers


def test_image_mse_and_adam(device, rng):
    a = wp.array(rng.uniform(size=(4, 5, 3)).astype(np.float32), dtype=wp.vec3, device=device)
    b = wp.array(rng.uniform(size=(4, 5, 3)).astype(np.float32), dtype=wp.vec3, device=device)
    loss = image_mse([a, a], [b, a])
    np.testing.assert_allclose(loss.numpy()[0], 0.5 * ((a.numpy() - b.numpy()) ** 2).mean(), rtol=1e-5)
    with pytest.raises(ValueError, match="shape"):
        image_mse([a], [wp.zeros((5, 4), dtype=wp.vec3, device=device)])
    p = vec3([3.0, -2.0, 1.0], device, True)
    opt = Adam([p], 0.1)
    for _ in range(200):
        opt.step([2.0 * p.numpy()])  # gradient of |p|^2
    assert np.abs(p.numpy()).max() < 0.05  # Adam with step 0.1 ends within ~one step of 0


# ---------------------------------------------------------------- image loss through simulation

# The example needs only arc_warp and this plugin: a broken import of either must fail
# here, not skip. Tests that need newton itself carry `needs_newton`.
from arc_warp_newton.examples import throw_ball  # noqa: E402


def small_config(**kw):
    return throw_ball.ThrowBallConfig(width=24, height=24, frame_steps=(8, 16, 24), **kw)


def image_grad_vs_fd(cfg, device):
    """Tape gradient and central FD of the image loss w.r.t. (v0, g), 3 % off the truth."""
    scene = throw_ball.ThrowBall(cfg, device)
    targets = scene.render(scene.vec3_param(cfg.true_velocity, False), scene.vec3_param(cfg.true_gravity, False))
    # Near the truth: far from it, the rasteriser's alpha >= 1/255 cut-off edges of the
    # blobs cross the target's bright body, and FD (not the gradient) sees those steps.
    v0 = np.array(cfg.true_velocity, np.float32) * np.float32([1.03, 0.97, 1.03])
    g0 = np.array(cfg.true_gravity, np.float32) * np.float32(0.97)
    _, dv, dg = scene.loss_and_grad(scene.vec3_param(v0), scene.vec3_param(g0), targets)
    ad = np.concatenate([dv[0], dg[0]])
    h = 3e-3  # m/s and m/s^2: loss is smooth on this scale and float32 noise stays < 1e-4 relative
    fd = np.zeros(6)
    for k in range(6):
        e = np.zeros(6, np.float32)
        e[k] = h
        plus = scene.loss(scene.vec3_param(v0 + e[:3], False), scene.vec3_param(g0 + e[3:], False), targets)
        minus = scene.loss(scene.vec3_param(v0 - e[:3], False), scene.vec3_param(g0 - e[3:], False), targets)
        fd[k] = (plus - minus) / (2 * h)
    return ad, fd


@pytest.mark.parametrize("backend", ["warp", pytest.param("newton", marks=needs_newton)])
def test_image_loss_gradient_matches_fd(device, backend):
    ad, fd = image_grad_vs_fd(small_config(backend=backend), device)
    # the bar of the task; measured ~2e-3 for both backends on this scene
    assert np.linalg.norm(ad - fd) / np.linalg.norm(fd) <= 1e-2, (ad, fd)
    assert abs(ad[5] - fd[5]) / abs(fd[5]) <= 1e-2, (ad[5], fd[5])  # gravity along z alone


def test_fit_recovers_throw_parameters(device):
    res = throw_ball.fit(small_config(iterations=80), device)
    assert res.losses[-1] < 1e-3 * res.losses[0]
    # the task's 2 % bar; this run reaches ~0.2 %
    assert res.velocity_error < 0.02, res.velocity
    assert res.gravity_error < 0.02, res.gravity
    np.testing.assert_array_equal(res.gravity[:2], 0.0)  # axes not fitted stay put


# ---------------------------------------------------------------- newton


@needs_newton
def test_newton_rollout_matches_minimal_integrator(device):
    import newton

    cfg = small_config(backend="newton")
    positions, _ = throw_ball.ball_particles(cfg)
    nsim = throw_ball.ThrowBall(cfg, device).sim
    wsim = awn.ParticleIntegrator(positions, 1.0, cfg.particle_radius, awn.IntegratorSettings(dt=cfg.dt),
                                  device=device)
    grads = []
    for sim in (nsim, wsim):
        vel, grav = vec3(cfg.init_velocity, device, True), vec3(cfg.init_gravity, device, True)
        tape = wp.Tape()
        with tape:
            traj = sim.rollout(vel, grav, 20)
        tape.backward(grads={traj[-1]: vec3(np.tile([1.0, 2.0, 3.0], (len(positions), 1)), device)})
        grads.append((traj[-1].numpy(), vel.grad.numpy(), grav.grad.numpy()))
        tape.zero()
    # both are symplectic Euler in float32: same formula, rounding-level differences
    for a, b in zip(*grads):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert isinstance(nsim._rollout.model, newton.Model)


@needs_newton
def test_newton_rigid_sphere_image_gradient_matches_fd(device):
    import newton

    from arc_warp import RenderSettings, render_gaussians

    builder = newton.ModelBuilder(up_axis=newton.Axis.Z, gravity=(0.0, 0.0, -9.81))
    body = builder.add_body(xform=wp.transform(wp.vec3(-0.8, 0.0, 0.5), wp.quat_identity()))
    builder.add_shape_sphere(body, radius=0.2)
    model = builder.finalize(device=device, requires_grad=True)
    rollout = awn.NewtonRollout(model, dt=1.0 / 60.0)
    # 8 blobs 3 std-devs apart: few alpha-cut-off edges fall on neighbours (see image_grad_vs_fd)
    samples = awn.shape_surface_samples(model, (0.9, 0.5, 0.2), sphere_count=8, scale=0.08, opacity=0.9)
    assert samples.count == 8 and samples.max_body == body
    cam = throw_ball.cameras(small_config())[0]
    settings = RenderSettings()
    grav = vec3([0.0, 0.0, -9.81], device)

    def frames(vel):
        states = rollout.rollout(vel, grav, 24)
        out = []
        for s in (states[12], states[24]):
            g = awn.bodies_to_gaussians(s.body_q, samples)
            out.append(render_gaussians(*g.arrays, cam, settings).color)
        return out

    targets = frames(vec3([2.0, 0.0, 3.0], device))
    v0 = np.array([2.06, 0.0, 2.91], np.float32)  # 3 % off
    vel = vec3(v0, device, True)
    tape = wp.Tape()
    with tape:
        loss = image_mse(frames(vel), targets)
    tape.backward(loss)
    ad = vel.grad.numpy()[0].copy()
    tape.zero()
    h = 3e-3
    fd = [(image_mse(frames(vec3(v0 + h * e, device)), targets).numpy()[0]
           - image_mse(frames(vec3(v0 - h * e, device)), targets).numpy()[0]) / (2 * h) for e in np.eye(3)]
    fd = np.array(fd)
    # measured 1.1e-2: blobs on a closed surface overlap more than the particle ball, so
    # more alpha-cut-off steps (seen by FD, not by gradients) land on bright pixels; a
    # wrong rotation/translation chain would be off by O(1)
    assert np.linalg.norm(ad - fd) / np.linalg.norm(fd) <= 3e-2, (ad, fd)


def test_missing_newton_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "newton", None)  # import newton now raises ImportError
    monkeypatch.delitem(sys.modules, "arc_warp_newton.newton_bridge", raising=False)
    monkeypatch.delattr(awn, "newton_bridge", raising=False)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[newton\]'"):
        awn.NewtonRollout  # noqa: B018
    g = awn.particles_to_gaussians(vec3(np.zeros((2, 3)), "cpu"), 0.1, (1, 1, 1))  # newton-free part works
    assert g.count == 2


def test_broken_plugin_import_fails_collection(tmp_path):
    # Only a missing newton may skip; an ImportError inside our own plugin must surface.
    script = (
        "import sys, pytest\n"
        "sys.modules['arc_warp_newton.examples.throw_ball'] = None  # importing it now raises\n"
        f"sys.exit(pytest.main(['-q', '--collect-only', '-p', 'no:cacheprovider', {__file__!r}]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, proc.stdout[-2000:]
    assert "throw_ball" in proc.stdout


def test_example_with_newton_backend_and_no_newton_says_so(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "newton", None)  # import newton now raises ImportError
    with pytest.raises(SystemExit) as info:
        throw_ball.main(["--backend", "newton", "--iters", "1"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--backend newton needs the newton simulator" in err and "--backend warp" in err
