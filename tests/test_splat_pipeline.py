"""Pipeline tests of render_gaussians: edge cases, tape, reduce-mode parity, validation.

Dense float64 comparisons live in test_splat_reference.py; here the checks are
analytic single-Gaussian values, invariants, finite differences and mode parity.
"""

import numpy as np
import pytest
import warp as wp

from arc_warp import Camera, GaussianGrads, RenderSettings, render_gaussians, render_gaussians_backward
from arc_warp._src.splat.geometry_funcs import ALPHA_MIN, TILE_SIZE
from arc_warp._src.splat.raster_kernels import SUB_COLS, SUB_H, SUB_ROWS, SUB_W, subtile_mask, warp_skips
from conftest import bins_of

wp.config.log_level = wp.LOG_WARNING

IDENTITY_QUAT = (1.0, 0.0, 0.0, 0.0)
SUB_COUNT = SUB_COLS * SUB_ROWS  # a tile's warps


def gaussians(means, scales, opacities, colors, quats=None, device="cpu", requires_grad=False):
    """wp arrays from lists/numpy; ``colors`` (N,3) is RGB, (N,K,3) SH."""
    n = len(means)
    quats = np.tile(IDENTITY_QUAT, (n, 1)) if quats is None else quats

    def arr(values, dtype):
        return wp.array(np.asarray(values, np.float32), dtype=dtype, device=device, requires_grad=requires_grad)

    return (arr(means, wp.vec3), arr(quats, wp.vec4), arr(scales, wp.vec3), arr(opacities, wp.float32),
            arr(colors, wp.vec3))


def camera(width, height, focal=20.0, **kw):
    """Identity-pose camera with the principal point at the image centre."""
    return Camera(focal, focal, 0.5 * width, 0.5 * height, width, height, **kw)


def smooth_scene(rng, device, requires_grad=False, sh=True):
    """A few wide half-transparent Gaussians: every pixel sees all of them well above
    the 1/255 cut and none terminates, so every output is smooth in every parameter."""
    n = 4
    means = np.column_stack([rng.uniform(-0.3, 0.3, n), rng.uniform(-0.2, 0.2, n), rng.uniform(2.5, 3.5, n)])
    scales = rng.uniform(1.2, 2.0, (n, 3))
    quats = rng.normal(size=(n, 4))
    opacities = rng.uniform(0.3, 0.6, n)
    colors = rng.normal(0.0, 0.3, (n, 4, 3)) if sh else rng.uniform(0.1, 0.9, (n, 3))
    if sh:
        colors[:, 0] += 1.0
    return gaussians(means, scales, opacities, colors, quats, device, requires_grad), camera(20, 14)


def _in_view(rng, n, cam, margin, px_range):
    """(means, scales) of ``n`` Gaussians at depths 2-6 whose centres project within
    ``margin`` pixels of ``cam``'s image, with std-devs of ``px_range`` pixels there."""
    z = rng.uniform(2.0, 6.0, n)
    u = rng.uniform(-margin, cam.width + margin, n)
    v = rng.uniform(-margin, cam.height + margin, n)
    means = np.column_stack([(u - cam.cx) * z / cam.fx, (v - cam.cy) * z / cam.fy, z])
    return means, rng.uniform(*px_range, (n, 3)) * z[:, None] / cam.fx


def random_scene(rng, n, width, height, device, requires_grad=False, sh_degree=2):
    """Gaussians whose centres project near the image, 1-8 px wide, mixed opacities."""
    cam = camera(width, height, focal=25.0)
    means, scales = _in_view(rng, n, cam, 4, (1.0, 8.0))
    colors = rng.normal(0.0, 0.4, (n, (sh_degree + 1) ** 2, 3))
    colors[:, 0] += 1.0
    arrays = gaussians(means, scales, rng.uniform(0.2, 0.99, n), colors, rng.normal(size=(n, 4)), device,
                       requires_grad)
    return arrays, cam


def cotangents(rng, width, height, device):
    shape = (height, width)
    return (wp.array(rng.normal(size=shape + (3,)).astype(np.float32), dtype=wp.vec3, device=device),
            *(wp.array(rng.normal(size=shape).astype(np.float32), dtype=wp.float32, device=device)
              for _ in range(3)))


def weighted_loss(out, cots) -> float:
    """sum <output, cotangent> in float64, so the reduction adds no float32 rounding."""
    return sum(float((img.numpy().astype(np.float64) * c.numpy()).sum())
               for img, c in zip((out.color, out.alpha, out.depth, out.expected_depth), cots))


def single_gaussian_alpha(mean, scale, opacity, cam):
    """float64 alpha image of one axis-aligned Gaussian under an identity-pose camera
    whose centre projects well inside the Jacobian clamp (gsplat classic formulas)."""
    x, y, z = mean
    jac = np.array([[cam.fx / z, 0.0, -cam.fx * x / z**2], [0.0, cam.fy / z, -cam.fy * y / z**2]])
    cov2d = jac @ np.diag(np.square(scale)) @ jac.T + 0.3 * np.eye(2)
    conic = np.linalg.inv(cov2d)
    u = cam.fx * x / z + cam.cx
    v = cam.fy * y / z + cam.cy
    px, py = np.meshgrid(np.arange(cam.width) + 0.5, np.arange(cam.height) + 0.5)
    d = np.stack([u - px, v - py], -1)
    power = 0.5 * np.einsum("...i,ij,...j->...", d, conic, d)
    alpha = np.minimum(0.999, opacity * np.exp(-power))
    # for opacity < 0.97 the box extent sqrt(2 ln(255 o)) < 3.33 sigma is exactly the
    # 1/255 contour, so the alpha cut alone decides which pixels see the Gaussian
    assert opacity < 0.97
    alpha[alpha < 1.0 / 255.0] = 0.0
    return alpha


# ----------------------------------------------------------------------------- edge cases


@pytest.mark.parametrize("width,height", [(1, 1), (37, 29), (16, 16), (17, 3)])
def test_single_gaussian_matches_closed_form(device, width, height):
    cam = camera(width, height, focal=20.0)
    mean = (0.07, -0.05, 3.0)
    scale = (0.4, 0.25, 0.3)
    rgb = (0.2, 0.6, 0.9)
    bg = (0.1, 0.2, 0.3)
    out = render_gaussians(*gaussians([mean], [scale], [0.8], [rgb], device=device), cam,
                           RenderSettings(background=bg))
    want = single_gaussian_alpha(mean, scale, 0.8, cam)
    # float32 exp/matrix products of O(1) values: ~1e-6 absolute
    np.testing.assert_allclose(out.alpha.numpy(), want, atol=2e-6)
    np.testing.assert_allclose(out.color.numpy(), want[..., None] * rgb + (1 - want[..., None]) * bg, atol=2e-6)
    np.testing.assert_allclose(out.depth.numpy(), want * 3.0, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.expected_depth.numpy(), np.where(want > 0, 3.0, 0.0), rtol=1e-5)


def test_zero_gaussians_give_background_and_zero_grads(device):
    arrays = gaussians(np.zeros((0, 3)), np.zeros((0, 3)), np.zeros(0), np.zeros((0, 3)), np.zeros((0, 4)), device)
    out = render_gaussians(*arrays, camera(19, 7), RenderSettings(background=(0.5, 0.25, 1.0)))
    np.testing.assert_array_equal(out.color.numpy(), np.broadcast_to((0.5, 0.25, 1.0), (7, 19, 3)))
    np.testing.assert_array_equal(out.alpha.numpy(), 0.0)
    grads = render_gaussians_backward(out, wp.ones((7, 19), dtype=wp.vec3, device=device))
    assert grads.means.shape == (0,) and grads.colors.shape == (0,)


def test_culled_gaussians_behind_camera_off_image_and_transparent(device):
    means = [(0.0, 0.0, -2.0), (0.0, 0.0, 0.005), (50.0, 0.0, 3.0), (0.0, 0.0, 3.0), (0.0, 0.0, 2e10)]
    opacities = [0.9, 0.9, 0.9, 0.5 / 255.0, 0.9]  # behind, before near, off-image, too faint, beyond far
    arrays = gaussians(means, [(0.1, 0.1, 0.1)] * 5, opacities, [(1.0, 0.0, 0.0)] * 5, device=device)
    out = render_gaussians(*arrays, camera(24, 20), RenderSettings(background=(0.0, 1.0, 0.0)))
    np.testing.assert_array_equal(out.radii.numpy(), 0)
    np.testing.assert_array_equal(out.color.numpy(), np.broadcast_to((0.0, 1.0, 0.0), (20, 24, 3)))
    grads = render_gaussians_backward(out, wp.ones((20, 24), dtype=wp.vec3, device=device))
    for g in (grads.means, grads.quats, grads.scales, grads.opacities, grads.colors):
        np.testing.assert_array_equal(g.numpy(), 0.0)


def test_near_plane_straddling_and_degenerate_scales_stay_finite(rng, device):
    # a huge Gaussian just past the near plane (its 3-sigma ellipsoid crosses z = 0),
    # a zero-scale one (pure eps2d dilation), one with a single zero axis
    means = [(0.2, 0.1, 0.05), (0.0, 0.0, 2.0), (0.3, 0.2, 2.5)]
    scales = [(1.0, 1.0, 1.0), (0.0, 0.0, 0.0), (0.5, 0.0, 0.3)]
    arrays = gaussians(means, scales, [0.5, 0.9, 0.7], rng.normal(size=(3, 9, 3)), rng.normal(size=(3, 4)),
                       device)
    out = render_gaussians(*arrays, camera(33, 21))
    assert (out.radii.numpy() > 0).all()
    for img in (out.color, out.alpha, out.depth, out.expected_depth):
        assert np.isfinite(img.numpy()).all()
    assert out.alpha.numpy()[10, 16] > 0.5  # the zero-scale dot at the image centre
    grads = render_gaussians_backward(out, *cotangents(rng, 33, 21, device))
    for g in (grads.means, grads.quats, grads.scales, grads.opacities, grads.colors):
        assert np.isfinite(g.numpy()).all()
    assert np.abs(grads.means.numpy()[1]).sum() > 0  # the dot moves with its mean


def test_gaussian_covering_whole_image_reaches_every_tile(device):
    arrays = gaussians([(0.0, 0.0, 2.0)], [(50.0, 50.0, 1.0)], [0.6], [(1.0, 1.0, 1.0)], device=device)
    out = render_gaussians(*arrays, camera(70, 45))
    assert out.status.totals == [5 * 3]  # 70x45 px = 5x3 tiles, all touched
    # sigma = 500 px; the farthest pixel is 42 px off centre: exp(-(42/500)^2 / 2) > 0.996
    np.testing.assert_allclose(out.alpha.numpy(), 0.6, rtol=4e-3)


def test_equal_depths_keep_index_order(device):
    # two overlapping opaque Gaussians at the same depth: the lower index is in front
    means = [(0.0, 0.0, 3.0), (0.01, 0.0, 3.0)]
    for colors, front in (([(1, 0, 0), (0, 0, 1)], (1, 0, 0)), ([(0, 0, 1), (1, 0, 0)], (0, 0, 1))):
        out = render_gaussians(*gaussians(means, [(0.3, 0.3, 0.3)] * 2, [0.99, 0.99], colors, device=device),
                               camera(16, 16))
        pixel = out.color.numpy()[8, 8]
        assert np.argmax(pixel) == np.argmax(front)


def test_termination_does_not_composite_the_last_gaussian(device):
    # the first (opacity 0.99 at the pixel centre) leaves T = 0.01; the second would take T
    # to 1e-4 <= T_MIN, so the pixel ends before it: alpha stays 0.99 and its colour is absent
    means = [(0.0, 0.0, 2.0), (0.0, 0.0, 3.0)]
    arrays = gaussians(means, [(0.2, 0.2, 0.2)] * 2, [0.99, 0.99], [(1, 0, 0), (0, 1, 0)], device=device)
    out = render_gaussians(*arrays, Camera(20.0, 20.0, 8.5, 8.5, 17, 17))
    np.testing.assert_allclose(out.alpha.numpy()[8, 8], 0.99, rtol=1e-6)
    np.testing.assert_allclose(out.color.numpy()[8, 8], (0.99, 0.0, 0.0), rtol=1e-6)


def test_camera_batch_renders_each_camera(device):
    arrays = gaussians([(0.0, 0.0, 0.0)], [(0.3, 0.3, 0.3)], [0.9], [(1.0, 0.5, 0.0)], device=device)
    cams = Camera.batch([Camera.look_at((0, 0, -3), (0, 0, 0), (0, -1, 0), 60.0, 24, 16),
                         Camera.look_at((3, 0, 0), (0, 0, 0), (0, 1, 0), 60.0, 24, 16)])
    outs = render_gaussians(*arrays, cams)
    assert len(outs) == 2
    for out in outs:
        np.testing.assert_allclose(out.means2d.numpy()[0], (12.0, 8.0), atol=1e-4)
        np.testing.assert_allclose(out.expected_depth.numpy()[8, 12], 3.0, rtol=1e-4)


def test_look_at_puts_world_up_at_the_image_top():
    cam = Camera.look_at((0, 0, -5), (0, 0, 0), (0, 1, 0), 45.0, 40, 30)
    up_point = cam.world_to_camera @ np.array([0.0, 1.0, 0.0, 1.0])
    assert up_point[1] < 0  # camera +y points down
    np.testing.assert_allclose(cam.center, (0, 0, -5), atol=1e-12)
    np.testing.assert_allclose(cam.fy, 15.0 / np.tan(np.radians(22.5)))


# ----------------------------------------------------------------------------- gradients


def test_finite_differences_through_render(rng, device):
    arrays, cam = smooth_scene(rng, device)
    cots = cotangents(rng, cam.width, cam.height, device)
    settings = RenderSettings(background=(0.2, 0.3, 0.4))
    grads = render_gaussians_backward(render_gaussians(*arrays, cam, settings), *cots)
    names = ("means", "quats", "scales", "opacities", "colors")
    for name, array in zip(names, arrays):
        base = array.numpy()
        ana_all = getattr(grads, name).numpy()
        idx = np.unravel_index(np.argmax(np.abs(ana_all)), ana_all.shape)
        h = 1e-2 * max(abs(float(base[idx])), 0.1)
        values = []
        for sign in (1.0, -1.0):
            bumped = base.copy()
            bumped[idx] += sign * h
            step_arrays = [wp.array(bumped, dtype=array.dtype, device=device) if a is array else a for a in arrays]
            values.append((weighted_loss(render_gaussians(*step_arrays, cam, settings), cots),
                           float(bumped[idx])))
        fd = (values[0][0] - values[1][0]) / (values[0][1] - values[1][1])
        # central differences at 1 % steps on a smooth loss: truncation ~1e-4 relative; the
        # float32 images add ~1e-6 absolute to the loss, i.e. ~1e-4/h; 1 % covers both
        assert abs(fd - ana_all[idx]) <= 1e-2 * abs(ana_all[idx]) + 1e-3, (name, fd, ana_all[idx])


@wp.kernel
def offset_means(base: wp.array(dtype=wp.vec3), shift: wp.array(dtype=wp.vec3), out: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    out[i] = base[i] + shift[0]


@wp.kernel
def image_loss(color: wp.array2d(dtype=wp.vec3), weight: wp.array2d(dtype=wp.vec3), loss: wp.array(dtype=float)):
    y, x = wp.tid()
    wp.atomic_add(loss, 0, wp.dot(color[y, x], weight[y, x]))


def test_tape_reaches_upstream_kernel(rng, device):
    (base, quats, scales, opacities, colors), cam = smooth_scene(rng, device, requires_grad=True)
    weight = cotangents(rng, cam.width, cam.height, device)[0]
    n = base.shape[0]

    def run(shift_value, record):
        shift = wp.array([shift_value], dtype=wp.vec3, device=device, requires_grad=True)
        means = wp.zeros(n, dtype=wp.vec3, device=device, requires_grad=True)
        loss = wp.zeros(1, dtype=float, device=device, requires_grad=True)
        tape = wp.Tape()
        with tape:
            wp.launch(offset_means, dim=n, inputs=[base, shift], outputs=[means], device=device)
            out = render_gaussians(means, quats, scales, opacities, colors, cam)
            wp.launch(image_loss, dim=(cam.height, cam.width), inputs=[out.color, weight], outputs=[loss],
                      device=device)
        if record:
            tape.backward(loss)
        return loss.numpy()[0], shift, means, out, tape

    _, shift, means, out, tape = run((0.0, 0.0, 0.0), True)
    # the tape path equals a direct backward call with the same cotangent (means.grad
    # itself was consumed, and reset, by the adjoint of the overwriting offset kernel)
    direct = render_gaussians_backward(out, weight)
    np.testing.assert_allclose(colors.grad.numpy(), direct.colors.numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(scales.grad.numpy(), direct.scales.numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(shift.grad.numpy()[0], direct.means.numpy().sum(0), rtol=1e-5, atol=1e-6)
    h = 1e-3
    fd = (run((h, 0, 0), False)[0] - run((-h, 0, 0), False)[0]) / (2 * h)
    # float32 loss of ~1e2 summed by atomics: ~1e-5 absolute noise / 2h = 1e-2; plus 1 %
    assert abs(fd - shift.grad.numpy()[0][0]) <= 1e-2 * abs(fd) + 2e-2, (fd, shift.grad.numpy()[0])
    tape.zero()
    np.testing.assert_array_equal(shift.grad.numpy(), 0.0)
    np.testing.assert_array_equal(scales.grad.numpy(), 0.0)


def test_reduce_modes_agree(rng, device, cpu_blocks):
    # 32x16 = two tiles: with cpu_blocks each tile is one emulated 256-lane block of 8 warps
    arrays, cam = random_scene(rng, 40, 32, 16, device)
    cots = cotangents(rng, cam.width, cam.height, device)
    results = {}
    for mode in ("atomic", "warp", "serial", "arc", "deterministic"):
        for threshold in ((None, 1, 33) if mode == "arc" else (None,)):
            settings = RenderSettings(reduce=mode, threshold=threshold, background=(0.3, 0.1, 0.2), absgrad=True)
            out = render_gaussians(*arrays, cam, settings)
            grads = render_gaussians_backward(out, *cots)
            results[(mode, threshold)] = [g.numpy() for g in vars(grads).values()] + [
                out.means2d_grad.numpy(), out.means2d_absgrad.numpy()]
    want = results.pop(("atomic", None))
    assert np.abs(want[0]).max() > 0
    for key, got in results.items():
        for w, g in zip(want, got):
            # the modes only reorder float32 sums of <= 512 pixel terms per Gaussian:
            # ~sqrt(512) * 6e-8 relative to the largest term
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5 * np.abs(w).max(), err_msg=str(key))


def test_floor_mode_produces_no_raster_gradients(rng, device):
    arrays, cam = random_scene(rng, 20, 24, 16, device)
    out = render_gaussians(*arrays, cam, RenderSettings(reduce="floor"))
    grads = render_gaussians_backward(out, *cotangents(rng, cam.width, cam.height, device))
    for g in vars(grads).values():
        np.testing.assert_array_equal(g.numpy(), 0.0)


def test_absgrad_bounds_and_grads_accumulate(rng, device):
    arrays, cam = random_scene(rng, 30, 24, 20, device)
    cots = cotangents(rng, cam.width, cam.height, device)
    plain = render_gaussians_backward(render_gaussians(*arrays, cam), *cots)
    out = render_gaussians(*arrays, cam, RenderSettings(absgrad=True))
    acc = GaussianGrads(*(wp.clone(g) for g in vars(plain).values()))
    render_gaussians_backward(out, *cots, grads=acc)
    for p, a in zip(vars(plain).values(), vars(acc).values()):
        np.testing.assert_allclose(a.numpy(), 2.0 * p.numpy(), rtol=1e-5, atol=1e-6 * np.abs(p.numpy()).max())
    g2d, abs2d = out.means2d_grad.numpy(), out.means2d_absgrad.numpy()
    assert np.abs(g2d).max() > 0
    assert (abs2d >= np.abs(g2d) - 1e-6 * np.abs(g2d).max()).all()


@pytest.mark.parametrize("absgrad", [False, True])
def test_backward_overwrite_writes_every_entry(rng, device, absgrad):
    """accumulate=False writes every gradient entry, culled Gaussians and SH coefficients
    past the evaluated degree included, with the values that adding into zeros gives,
    whatever the buffers held before."""
    arrays, cam = random_scene(rng, 40, 24, 20, device, sh_degree=2)
    means = arrays[0].numpy()
    means[:6, 2] = -1.0  # behind the camera: culled
    arrays = (wp.array(means, dtype=wp.vec3, device=device), *arrays[1:])
    out = render_gaussians(*arrays, cam, RenderSettings(sh_degree=1, absgrad=absgrad))  # 4 of 9 coefficients
    assert (out.radii.numpy()[:6] == 0).all()
    cots = cotangents(rng, cam.width, cam.height, device)
    want = render_gaussians_backward(out, *cots, grads=GaussianGrads(*(wp.zeros_like(a) for a in arrays)))
    want_2d = [out.means2d_grad.numpy().copy()] + ([out.means2d_absgrad.numpy().copy()] if absgrad else [])
    nan = GaussianGrads(*(wp.array(np.full(a.numpy().shape, np.nan, np.float32), dtype=a.dtype, device=device)
                          for a in arrays))
    for buf in [out.means2d_grad] + ([out.means2d_absgrad] if absgrad else []):
        buf.assign(np.full(buf.numpy().shape, np.nan, np.float32))
    got = render_gaussians_backward(out, *cots, grads=nan, accumulate=False)
    exact = device == "cpu"  # on CUDA the rasteriser's float atomics may add in another order
    for g, w in zip(vars(got).values(), vars(want).values()):
        if exact:
            np.testing.assert_array_equal(g.numpy(), w.numpy())
        else:
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-6)
    assert (got.colors.numpy()[:, 4:] == 0).all() and (got.means.numpy()[:6] == 0).all()
    # the 2D mean gradients are written too
    for g, w in zip([out.means2d_grad] + ([out.means2d_absgrad] if absgrad else []), want_2d):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-5, atol=1e-6)


def test_plain_rgb_colors_are_used_as_is(rng, device):
    arrays, cam = smooth_scene(rng, device, sh=False)
    out = render_gaussians(*arrays, cam)
    grads = render_gaussians_backward(out, wp.ones((cam.height, cam.width), dtype=wp.vec3, device=device))
    # d color / d rgb_i = w_i per pixel, summed: the weights of a smooth scene sum to < H*W
    total = grads.colors.numpy()
    assert total.shape == (4, 3) and (total > 0).all()
    np.testing.assert_allclose(total[:, 0], total[:, 1], rtol=1e-6)
    np.testing.assert_allclose(total.sum(0)[0], out.alpha.numpy().sum(), rtol=1e-5)


# ----------------------------------------------------------------------------- validation


def test_input_validation(rng, device):
    arrays, cam = smooth_scene(rng, device)
    means, quats, scales, opacities, colors = arrays
    with pytest.raises(TypeError, match="means"):
        render_gaussians(means.numpy(), quats, scales, opacities, colors, cam)
    with pytest.raises(TypeError, match="quats"):
        render_gaussians(means, wp.zeros(4, dtype=wp.vec3, device=device), scales, opacities, colors, cam)
    with pytest.raises(ValueError, match="scales"):
        render_gaussians(means, quats, wp.zeros(3, dtype=wp.vec3, device=device), opacities, colors, cam)
    with pytest.raises(ValueError, match="SH colors"):
        render_gaussians(means, quats, scales, opacities, wp.zeros((4, 5), dtype=wp.vec3, device=device), cam)
    with pytest.raises(ValueError, match="sh_degree 3"):
        render_gaussians(*arrays, cam, RenderSettings(sh_degree=3))
    with pytest.raises(TypeError, match="camera"):
        render_gaussians(*arrays, "camera")
    with pytest.raises(TypeError, match="settings"):
        render_gaussians(*arrays, cam, {"reduce": "arc"})
    with pytest.raises(ValueError, match="reduce"):
        RenderSettings(reduce="fast")
    with pytest.raises(ValueError, match="near"):
        Camera(10.0, 10.0, 5.0, 5.0, 10, 10, near=0.0)
    with pytest.raises(ValueError, match="width"):
        Camera(10.0, 10.0, 5.0, 5.0, 0, 10)
    out = render_gaussians(*arrays, cam)
    with pytest.raises(ValueError, match="grad_color"):
        render_gaussians_backward(out, wp.zeros((3, 3), dtype=wp.vec3, device=device))
    with pytest.raises(TypeError, match="grad_alpha"):
        render_gaussians_backward(out, None, wp.zeros(out.alpha.shape, dtype=wp.vec3, device=device))


@pytest.mark.parametrize("name,value,message", [
    ("means", np.nan, "means"), ("scales", np.inf, "scales"), ("opacities", np.nan, "opacities"),
    ("colors", -np.inf, "colors"), ("quats", 0.0, "zero norm")])
def test_non_finite_inputs_raise(rng, device, name, value, message):
    arrays, cam = smooth_scene(rng, device)
    names = ("means", "quats", "scales", "opacities", "colors")
    data = arrays[names.index(name)].numpy()
    if name == "quats":
        data[2] = 0.0
    else:
        data.reshape(-1)[5 % data.size] = value
    bad = [wp.array(data, dtype=a.dtype, device=device) if n == name else a for n, a in zip(names, arrays)]
    with pytest.raises(ValueError, match=message):
        render_gaussians(*bad, cam)


@pytest.mark.parametrize("gaussian,row,component", [(0, 15, 0), (-1, 15, 2), (7, 4, 1), (3, 0, 0)])
def test_non_finite_sh_rows_raise_whatever_the_degree(rng, device, gaussian, row, component):
    # The SH forward reads each Gaussian's 16 rows as one vector: a NaN in a row the
    # degree does not evaluate (or the very last float of the array) still raises.
    arrays, cam = random_scene(rng, 12, 16, 12, device, sh_degree=3)
    colors = arrays[4].numpy()
    clean = render_gaussians(*arrays, cam, RenderSettings(sh_degree=1))
    assert np.isfinite(clean.color.numpy()).all()
    colors[gaussian, row, component] = np.nan
    bad = (*arrays[:4], wp.array(colors, dtype=wp.vec3, device=device))
    with pytest.raises(ValueError, match="colors"):
        render_gaussians(*bad, cam, RenderSettings(sh_degree=1))


@pytest.mark.parametrize("sh_degree", [0, 1, 3])
def test_sh_backward_over_cameras_matches_deterministic(rng, device, cpu_blocks, sh_degree):
    """The SH backward kernel (a thread per coefficient row, view-direction shares summed
    per Gaussian by the accumulator) against the deterministic mode's per-Gaussian colour
    vjp: degree ``sh_degree`` of 16 stored coefficients, two cameras, the first writing the
    gradients over NaNs and the second adding to them."""
    arrays, cam = random_scene(rng, 40, 32, 16, device, sh_degree=3)
    w2c = np.eye(4)
    w2c[:3, 3] = (0.3, -0.2, 0.4)
    w2c[:3, :3] = np.linalg.qr(np.eye(3) + 0.1 * rng.normal(size=(3, 3)))[0]
    cams = [cam, Camera(cam.fx, cam.fy, cam.cx, cam.cy, cam.width, cam.height, world_to_camera=w2c)]
    cots = [cotangents(rng, cam.width, cam.height, device) for _ in cams]
    results = {}
    for mode, threshold in (("deterministic", None), ("atomic", None), ("warp", None), ("arc", 1), ("arc", 33)):
        settings = RenderSettings(sh_degree=sh_degree, reduce=mode, threshold=threshold)
        grads = GaussianGrads(*(wp.array(np.full(a.numpy().shape, np.nan, np.float32), dtype=a.dtype,
                                         device=device) for a in arrays))
        for c, (view, cot) in enumerate(zip(cams, cots)):
            render_gaussians_backward(render_gaussians(*arrays, view, settings), *cot, grads=grads,
                                      accumulate=c > 0)
        results[(mode, threshold)] = [g.numpy() for g in vars(grads).values()]
    want = results.pop(("deterministic", None))
    n_coeffs = (sh_degree + 1) ** 2
    assert np.abs(want[4][:, :n_coeffs]).max(axis=(0, 2)).min() > 0 and (want[4][:, n_coeffs:] == 0).all()
    for key, got in results.items():
        for w, g in zip(want, got):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5 * np.abs(w).max(), err_msg=str(key))


@wp.kernel(enable_backward=False, module="unique", module_options={"fast_math": True})
def _subtile_masks(geom: wp.array(dtype=wp.vec4), conic: wp.array(dtype=wp.vec4), origin: wp.array(dtype=wp.vec2i),
                   out: wp.array(dtype=wp.int32)):
    # the rasteriser's mask of splat i in the tile whose first pixel is origin[i] (fast math, as there)
    i = wp.tid()
    out[i] = subtile_mask(geom[i], conic[i], origin[i][0], origin[i][1])


@wp.kernel(enable_backward=False, module="unique")
def _warp_skips(out: wp.array(dtype=wp.int32)):
    # out[mask * SUB_COUNT + sub]: 1 where the backward's warp of subtile sub passes over an entry
    # staged with mask
    i = wp.tid()
    out[i] = wp.where(warp_skips(i // SUB_COUNT, i % SUB_COUNT), 1, 0)


def subtile_masks(geom, conic, origin, device):
    """``subtile_mask`` of each splat (``Splat2D`` quads ``geom``, ``conic``: (N, 4)) in the
    tile whose first pixel is ``origin`` (N, 2) (x, y): (N,) int32."""
    out = wp.zeros(len(geom), dtype=wp.int32, device=device)
    wp.launch(_subtile_masks, len(geom), [wp.array(np.asarray(geom, np.float32), dtype=wp.vec4, device=device),
                                          wp.array(np.asarray(conic, np.float32), dtype=wp.vec4, device=device),
                                          wp.array(np.asarray(origin, np.int32), dtype=wp.vec2i, device=device), out],
              device=device)
    return out.numpy()


def staged_subtile_masks(out):
    """The ``subtile_mask`` with which the rasteriser stages each sorted entry of a
    ``render_gaussians`` output's tiles: (n_isects,) int32."""
    bins = bins_of(out)
    ranges = bins.tile_ranges.numpy()[: bins.tiles_x * bins.tiles_y]
    tiles = np.repeat(np.arange(len(ranges)), ranges[:, 1] - ranges[:, 0])
    ids = np.concatenate([bins.gauss_ids.numpy()[r0:r1] for r0, r1 in ranges])
    splats = bins.splats.numpy()[ids]
    origin = np.column_stack([tiles % bins.tiles_x, tiles // bins.tiles_x]) * TILE_SIZE
    return subtile_masks(splats["geom"], splats["conic"], origin, str(bins.splats.device))


def subtiles_of(hit):
    """Per splat, the subtile mask (bit ``SUB_COLS * row + col``, as ``tile_pixel``) of
    the pixels of a 16x16 tile where ``hit`` (N, 16, 16) [y, x] holds."""
    cells = hit.reshape(len(hit), SUB_ROWS, SUB_H, SUB_COLS, SUB_W).any(axis=(2, 4)).reshape(len(hit), -1)
    return (cells << np.arange(SUB_COUNT)).sum(axis=1)


def random_splats(rng, n):
    """``Splat2D`` quads (float32) of ``n`` splats around a tile at (32, 48): std-devs 0.15-6
    px (log-uniform), any orientation, opacities 0.02-1 (the 1/255 cut inside EXTEND_MAX),
    centres up to 10 px past the tile's edges; and the tile's origin per splat."""
    origin = np.tile([32, 48], (n, 1))
    centre = origin + rng.uniform(-10.0, TILE_SIZE + 10.0, (n, 2))
    sigma = np.exp(rng.uniform(np.log(0.15), np.log(6.0), (n, 2)))
    angle = rng.uniform(0.0, np.pi, n)
    rot = np.stack([np.cos(angle), -np.sin(angle), np.sin(angle), np.cos(angle)], -1).reshape(n, 2, 2)
    cov = rot @ (sigma[:, :, None] ** 2 * np.eye(2)) @ rot.transpose(0, 2, 1)
    inv = np.linalg.inv(cov)
    geom = np.column_stack([centre, rng.uniform(0.02, 1.0, n), rng.uniform(1.0, 5.0, n)]).astype(np.float32)
    conic = np.column_stack([inv[:, 0, 0], inv[:, 0, 1], inv[:, 1, 1], np.zeros(n)]).astype(np.float32)
    return geom, conic, origin


def test_subtile_mask_holds_every_subtile_a_splat_reaches_and_little_more(rng, device):
    """The mask by which the forward evaluates an entry in a warp, and the backward skips
    it, holds every 8x4 subtile with a pixel centre where the splat's alpha passes 1/255
    (float64), and none that its 1/255 ellipse's box misses by more than the mask's slack."""
    geom, conic, origin = random_splats(rng, 4000)
    got = subtile_masks(geom, conic, origin, device)
    g, c = geom.astype(np.float64), conic.astype(np.float64)
    centres = np.arange(TILE_SIZE) + 0.5
    dx = g[:, 0, None] - origin[:, 0, None] - centres  # (N, 16) centre - pixel, per column
    dy = g[:, 1, None] - origin[:, 1, None] - centres
    power = 0.5 * (c[:, 0, None, None] * dx[:, None, :] ** 2 + c[:, 2, None, None] * dy[:, :, None] ** 2) \
        + c[:, 1, None, None] * dx[:, None, :] * dy[:, :, None]
    # 1e-3 below the cut: more than float32 moves alpha (~1e-6 relative), less than the
    # footprint's BIN_SLACK widening (t * 2^-10, alpha ~0.6 % lower at the box's edge)
    reached = subtiles_of(g[:, 2, None, None] * np.exp(-power) >= ALPHA_MIN * (1.0 - 1e-3))
    missing = reached & ~got
    assert not missing.any(), f"{np.count_nonzero(missing)} splats lack a subtile they reach, e.g. {np.argmax(missing)}"
    # the ellipse opacity * exp(-Q / 2) = 1/255 has the box half-sizes sqrt(t c / det), sqrt(t a / det)
    det = c[:, 0] * c[:, 2] - c[:, 1] ** 2
    t = 2.0 * np.log(g[:, 2] / ALPHA_MIN)
    # widened by the mask's own slack (BIN_SLACK, x 1.0006 here, and a pad of 1e-3 (1 + half-size))
    # and by CUDA's fast-math log, sqrt and division (2 of 4000 splats past x 1.003 + 3e-3 on an H200)
    half_w = np.sqrt(t * c[:, 2] / det) * 1.01 + 0.02
    half_h = np.sqrt(t * c[:, 0] / det) * 1.01 + 0.02
    boxed = subtiles_of((np.abs(dy) <= half_h[:, None])[:, :, None] & (np.abs(dx) <= half_w[:, None])[:, None, :])
    extra = got & ~boxed
    assert not extra.any(), f"{np.count_nonzero(extra)} splats hold a subtile their box misses, e.g. {np.argmax(extra)}"
    # the splats exercise the skip: most subtiles missed, and some splats reach no pixel centre
    bits = np.unpackbits(got.astype(np.uint8)[:, None], axis=1).sum()
    assert bits < 0.5 * SUB_COUNT * len(got) and (got == 0).sum() > 20, (bits, (got == 0).sum())


def test_a_warp_skips_the_entries_its_subtile_bit_lacks(device, cpu_blocks):
    """The backward's warp passes over an entry whose mask lacks its subtile; where the CPU
    emulates warps (enable_cpu_blocks, 32-lane blocks) the block passes together, over
    the entries with mask 0 only (its collectives synchronise the whole block)."""
    out = wp.zeros((1 << SUB_COUNT) * SUB_COUNT, dtype=wp.int32, device=device)
    wp.launch(_warp_skips, out.shape[0], [out], block_dim=32, device=device)
    mask, sub = np.divmod(np.arange(out.shape[0]), SUB_COUNT)
    want = mask == 0 if device == "cpu" and cpu_blocks else (mask >> sub) & 1 == 0
    np.testing.assert_array_equal(out.numpy(), want)


def test_backward_weights_match_the_forward_with_opacities_above_one(rng, device):
    """Opacities above ~1 (no activation) pass 1/255 past the EXTEND_MAX box, which the
    forward's subtile mask cuts; the backward restores the same compositing (it skipped
    by the same mask), so dL/dcolour, linear in the colour, is the image's difference."""
    n, width, height = 60, 48, 32
    cam = camera(width, height, focal=25.0)
    z = rng.uniform(2.0, 6.0, n)
    means = np.column_stack([(rng.uniform(0, width, n) - cam.cx) * z / cam.fx,
                             (rng.uniform(0, height, n) - cam.cy) * z / cam.fy, z])
    scales = rng.uniform(0.5, 2.0, (n, 3)) * z[:, None] / cam.fx
    colors = rng.uniform(0.0, 1.0, (n, 3))
    arrays = gaussians(means, scales, rng.uniform(2.0, 5.0, n), colors, rng.normal(size=(n, 4)), device)
    out = render_gaussians(*arrays, cam)
    v_color = rng.normal(size=(height, width, 3))
    got = render_gaussians_backward(out, wp.array(v_color.astype(np.float32), dtype=wp.vec3, device=device))
    got = got.colors.numpy()
    base = out.color.numpy().astype(np.float64)
    for k in range(n):
        shifted = colors.copy()
        shifted[k] += 1.0
        image = render_gaussians(*arrays[:4], wp.array(np.float32(shifted), dtype=wp.vec3, device=device), cam)
        want = ((image.color.numpy() - base) * v_color).sum((0, 1))
        # float32 images of ~1 over 1536 pixels: ~1e-4; evaluating the box's cut entries gave 5e-3
        np.testing.assert_allclose(got[k], want, rtol=0, atol=1e-3, err_msg=str(k))
