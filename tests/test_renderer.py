"""GaussianRenderer, the explicit object under every splat API: buffers and launches made
once, renders alive at once that never share buffers, the overflow rule (checks in the
call, or left on the device and read by the next call or the optimizer), resizes, and the
functional and torch APIs on top of it (CPU)."""

import threading
import warnings

import numpy as np
import pytest
import warp as wp

import arc_warp
from arc_warp import (Camera, DeviceCameras, GaussianGrads, GaussianRenderer, ImageGrads, RenderImages,
                      RenderSettings, Workspace, check_gaussians, render_gaussians, render_gaussians_backward)
from arc_warp._src.launches import Plan
from arc_warp._src.splat.renderer import SORT_SLACK
from conftest import random_scene


def _arrays(scene, requires_grad=False):
    def arr(x, dtype):
        return wp.array(x, dtype=dtype, device="cpu", requires_grad=requires_grad)

    return (arr(scene.means, wp.vec3), arr(scene.quats, wp.vec4), arr(scene.scales, wp.vec3),
            arr(scene.opacities, wp.float32), arr(scene.colors, wp.vec3))


def _camera(scene, focal_scale=1.0):
    return Camera(scene.fx * focal_scale, scene.fy * focal_scale, scene.cx, scene.cy, scene.width, scene.height,
                  world_to_camera=scene.world_to_camera)


def _images(c, n, h, w):
    return RenderImages(wp.empty((c, h, w), dtype=wp.vec3), wp.empty((c, h, w), dtype=wp.float32),
                        wp.empty((c, h, w), dtype=wp.float32), wp.empty((c, h, w), dtype=wp.float32),
                        wp.empty((c, n), dtype=wp.vec2), wp.empty((c, n), dtype=wp.vec2i))


def _count_allocations(monkeypatch):
    """Sizes of the Warp allocations on the CPU from now on."""
    allocator = wp.get_device("cpu").default_allocator
    allocate, sizes = allocator.allocate, []
    monkeypatch.setattr(allocator, "allocate", lambda size: sizes.append(size) or allocate(size))
    return sizes


class Setup:
    """A renderer of a random scene, its inputs, cotangents and gradient buffers."""

    def __init__(self, rng, n=40, width=24, height=20, sh_degree=2, cameras=1, **settings):
        self.scene = scene = random_scene(rng, n=n, width=width, height=height, sh_degree=sh_degree)
        self.arrays = _arrays(scene)
        self.g = check_gaussians(*self.arrays)
        self.cameras = [_camera(scene, 1.0 - 0.1 * i) for i in range(cameras)]
        self.settings = RenderSettings(**settings)
        self.renderer = GaussianRenderer(width, height, n, cameras, self.g.sh_coeffs, self.settings)
        self.cot = [ImageGrads(wp.array(rng.normal(size=(height, width, 3)).astype(np.float32), dtype=wp.vec3))
                    for _ in range(cameras)]
        self.grads = GaussianGrads(*(wp.empty_like(a) for a in self.arrays))

    def forward(self, state=None, images=None, **kw):
        state = self.renderer.new_state() if state is None else state
        images = _images(len(self.cameras), self.g.count, self.scene.height, self.scene.width) if images is None \
            else images
        self.renderer.forward(self.g, self.cameras, state, images, **kw)
        return state, images

    def backward(self, state):
        self.renderer.backward(state, self.cot, self.grads)
        return [a.numpy().copy() for a in self.grads.arrays]


def test_a_repeated_forward_and_backward_allocates_nothing_and_replays_its_plan(rng, monkeypatch):
    """A call on the same memory is run as it is, then recorded into a plan, then replayed
    from it: no Warp allocation, no wp.launch (nor its Python), the same results."""
    s = Setup(rng, cameras=2, absgrad=True)
    state, images = s.forward()
    first = [images.color.numpy().copy(), *s.backward(state)]
    s.forward(state, images)  # the second time: recorded
    s.backward(state)
    sizes = _count_allocations(monkeypatch)
    launched = []
    launch = wp.launch
    monkeypatch.setattr(wp, "launch", lambda *a, **k: launched.append(a[0]) or launch(*a, **k))
    for _ in range(2):
        s.forward(state, images)
        again = [images.color.numpy().copy(), *s.backward(state)]
        for a, b in zip(again, first):
            np.testing.assert_array_equal(a, b)
    assert sizes == [] and launched == []  # replayed plans, owned scratch, the caller's state
    assert sum(isinstance(p, Plan) for p in s.renderer._bindings.values()) == 2  # the forward and the backward


def test_renders_alive_at_once_keep_their_own_state(rng):
    """Two forwards before either backward: each backward gives its own render's gradients."""
    s = Setup(rng)
    want = s.backward(s.forward()[0])
    other = Setup(np.random.default_rng(1), n=40)
    state_a, _ = s.forward()
    s.g, s_other_g = other.g, s.g  # the second render has other Gaussians
    state_b, _ = s.forward()
    s.g = s_other_g
    got = s.backward(state_a)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    assert state_b.gaussians is other.g


def test_the_first_forward_measures_the_capacity_and_a_resize_measures_again(rng):
    s = Setup(rng)
    assert s.renderer.capacity is None
    state, _ = s.forward()
    total = state.status.totals[0]
    assert total > 0 and s.renderer.capacity == total * 5 // 4 + SORT_SLACK
    s.renderer.resize(s.g.count)
    assert s.renderer.capacity is None
    with pytest.raises(ValueError, match="made for 40 Gaussians"):
        s.renderer.forward(check_gaussians(*(a[:10] for a in s.arrays)), s.cameras, state,
                           _images(1, 10, 20, 24))


@pytest.mark.parametrize("reduce", ["arc", "deterministic"])
def test_an_overflow_checked_in_the_call_is_rendered_again_exactly(rng, reduce):
    """With check=True a camera whose intersections outgrow the capacity is rendered
    again with a grown one before the call returns: images and gradients equal a render
    with room to spare."""
    s = Setup(rng, n=60, reduce=reduce, cameras=2)
    want_state, want_images = s.forward()
    want = [want_images.color.numpy().copy(), *s.backward(want_state)]
    small = GaussianRenderer(24, 20, 60, 2, s.g.sh_coeffs, s.settings, capacity=10)
    s.renderer = small
    state, images = s.forward(check=True)
    assert small.capacity > 10 and state.status.overflowed == []
    got = [images.color.numpy().copy(), *s.backward(state)]
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_an_overflow_left_on_the_device_is_flagged_and_grows_the_next_render(rng):
    """With check=False (what CUDA does) an overflowed render returns an image that lacks
    Gaussians and says so in its status (on the device and once read); the next forward
    reads it, warns and grows the capacity, and renders exactly."""
    s = Setup(rng, n=60)
    exact = s.forward()[1].color.numpy().copy()
    s.renderer = GaussianRenderer(24, 20, 60, 1, s.g.sh_coeffs, s.settings, capacity=10)
    state, images = s.forward(check=False)
    assert not state.status.is_read
    flags = state.status.flags.numpy()
    assert flags[0, arc_warp.splat.OVERFLOW_SLOT] == 1 and state.status.overflowed == [0]
    assert np.abs(images.color.numpy() - exact).max() > 1e-3  # Gaussians left out
    with pytest.warns(RuntimeWarning, match="more tile intersections than the 10"):
        state, images = s.forward(check=False)
    assert s.renderer.capacity > 10
    np.testing.assert_array_equal(images.color.numpy(), exact)


def test_bad_inputs_raise_in_the_call_or_at_the_next(rng):
    s = Setup(rng)
    means = s.arrays[0].numpy()
    means[3, 1] = np.nan
    s.g = check_gaussians(wp.array(means, dtype=wp.vec3), *s.arrays[1:])
    with pytest.raises(ValueError, match="non-finite .* means"):
        s.forward(check=True)
    s.renderer = GaussianRenderer(24, 20, 40, 1, s.g.sh_coeffs, capacity=100_000)
    s.forward(check=False)  # returns; the check is left for later
    s.g = check_gaussians(*s.arrays)
    with pytest.raises(ValueError, match="previous render on this renderer"):
        s.forward()


def test_sparse_gaussian_adam_skips_a_step_whose_render_overflowed(rng):
    """GradScaler's rule: the optimizer reads the render's status and leaves parameters,
    moments and counts as they were when it flags anything, on the host (host counts) and
    on the device (capturable)."""
    torch = pytest.importorskip("torch")
    from arc_warp_torch import SparseGaussianAdam

    s = Setup(rng, n=60)
    s.renderer = GaussianRenderer(24, 20, 60, 1, s.g.sh_coeffs, capacity=10)
    overflowed, _ = s.forward(check=False)
    fine, _ = Setup(rng, n=60).forward()
    for capturable in (False, True):
        p = torch.nn.Parameter(torch.ones(60, 3))
        opt = SparseGaussianAdam([p], lr=0.1, eps=1e-8, capturable=capturable)
        p.grad = torch.ones(60, 3)
        opt.step(skip=overflowed.status)
        assert torch.equal(p.detach(), torch.ones(60, 3)) and float(opt.state[p].get("step", 0)) == 0
        opt.step(skip=fine.status)
        assert (p.detach() < 1).all() and float(opt.state[p]["step"]) == 1


def test_functional_calls_with_a_workspace_reuse_one_renderer_per_size(rng):
    scene = random_scene(rng, n=30, width=20, height=16, sh_degree=1)
    ws = Workspace("cpu")
    out = render_gaussians(*_arrays(scene), _camera(scene), workspace=ws)
    render_gaussians(*_arrays(scene), _camera(scene), workspace=ws)
    assert len(ws.renderers()) == 1
    renderer = ws.renderers()[0]
    smaller = random_scene(rng, n=12, width=20, height=16, sh_degree=1)
    render_gaussians(*_arrays(smaller), _camera(smaller), workspace=ws)  # a new N: resized
    assert len(ws.renderers()) == 1 and renderer.num_gaussians == 12
    grads = render_gaussians_backward(out, wp.ones((16, 20), dtype=wp.vec3))  # the first render's state
    assert np.abs(grads.means.numpy()).max() > 0


def test_a_workspace_drops_its_least_recently_used_object_past_its_limit(rng):
    scene = random_scene(rng, n=8, width=16, height=16)
    ws = Workspace("cpu", limit=2)
    renderers = []
    for width in (16, 20, 16, 24):  # the 16-wide renderer is used again before the third size comes
        render_gaussians(*_arrays(scene), Camera(scene.fx, scene.fy, scene.cx, scene.cy, width, 16,
                                                 world_to_camera=scene.world_to_camera), workspace=ws)
        renderers.append(ws.renderers()[-1])
    assert [r.width for r in ws.renderers()] == [16, 24]  # the 20-wide one went
    assert renderers[2] is renderers[0]  # reused while held


def test_a_deterministic_backward_allocates_nothing_on_new_totals(rng, monkeypatch):
    """Its per-entry partials and the scratch of their ordered sum are the renderer's, sized
    by the capacity: a backward with other totals allocates no Warp memory, and its
    gradients are a fresh renderer's, bit for bit."""
    s = Setup(rng, reduce="deterministic")
    state, images = s.forward()
    s.backward(state)
    before = state.status.totals
    s.cameras = [_camera(s.scene, 0.8)]
    sizes = _count_allocations(monkeypatch)
    s.forward(state, images)
    got = s.backward(state)
    assert sizes == [] and state.status.totals != before
    monkeypatch.undo()
    fresh = Setup(rng, reduce="deterministic")
    fresh.g, fresh.cameras, fresh.cot = s.g, s.cameras, s.cot
    for a, b in zip(fresh.backward(fresh.forward()[0]), got):
        np.testing.assert_array_equal(a, b)


def test_device_cameras_render_like_host_cameras(rng):
    """DeviceCameras (matrices in device arrays, read by the projection kernel) render and
    differentiate like the same Cameras; invalid matrices raise ValueError."""
    scene = random_scene(rng, n=60, width=24, height=20, sh_degree=1)
    cams = [_camera(scene), _camera(scene, 0.8)]
    viewmats = wp.array(np.stack([c.world_to_camera for c in cams]).astype(np.float32), dtype=wp.mat44)
    ks = wp.array(np.stack([c.K for c in cams]).astype(np.float32), dtype=wp.mat33)
    cot = wp.array(rng.normal(size=(20, 24, 3)), dtype=wp.vec3)
    outs = render_gaussians(*_arrays(scene), DeviceCameras(viewmats, ks, 24, 20))
    assert [o.camera_index for o in outs] == [0, 1]
    for out, cam in zip(outs, cams):
        ref = render_gaussians(*_arrays(scene), cam)
        np.testing.assert_allclose(out.color.numpy(), ref.color.numpy(), atol=1e-5)
        got = render_gaussians_backward(out, cot).colors.numpy()
        np.testing.assert_allclose(got, render_gaussians_backward(ref, cot).colors.numpy(), rtol=1e-4, atol=1e-5)
    bad = viewmats.numpy()
    bad[1, 0, 0] = np.nan
    with pytest.raises(ValueError, match="camera's viewmat/K"):
        render_gaussians(*_arrays(scene), DeviceCameras(wp.array(bad, dtype=wp.mat44), ks, 24, 20))
    with pytest.raises(TypeError, match="intrinsics"):
        DeviceCameras(viewmats, viewmats, 24, 20)


def test_a_capturing_renderer_never_waits(rng):
    """While a renderer records into a CUDA graph (``capturing``) its forward leaves its
    checks for later and refuses a render that would have to wait: its first."""
    s = Setup(rng)
    s.renderer.capturing = True
    with pytest.raises(RuntimeError, match="run the captured step once"):
        s.forward()
    s.renderer.capturing = False
    s.forward()
    s.renderer.capturing = True
    state, _ = s.forward(check=True)
    assert not state.status.is_read and s.renderer._pending is state.status


def _torch_inputs(scene, torch, requires_grad=True):
    p = {k: torch.tensor(getattr(scene, k), requires_grad=requires_grad)
         for k in ("means", "quats", "scales", "opacities", "colors")}
    viewmats = torch.tensor(scene.world_to_camera[None], dtype=torch.float32)
    ks = torch.tensor([[[scene.fx, 0.0, scene.cx], [0.0, scene.fy, scene.cy], [0.0, 0.0, 1.0]]],
                      dtype=torch.float32)
    return p, viewmats, ks


def test_torch_renders_from_several_threads(rng):
    """Each thread renders through its own default context (issue 37 case 8: two threads
    sharing one crashed); the results equal one thread's."""
    torch = pytest.importorskip("torch")
    from arc_warp_torch import rasterization

    scene = random_scene(rng, n=80, width=32, height=24, sh_degree=1)

    def run():
        p, vm, ks = _torch_inputs(scene, torch)
        colors, _, _ = rasterization(*p.values(), vm, ks, scene.width, scene.height)
        colors.square().sum().backward()
        return colors.detach(), p["means"].grad

    want = run()
    results, errors = [None] * 4, []

    def worker(i):
        try:
            for _ in range(3):
                results[i] = run()
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for colors, grad in results:
        torch.testing.assert_close(colors, want[0], rtol=0, atol=0)
        torch.testing.assert_close(grad, want[1], rtol=1e-6, atol=1e-7)


def test_torch_rejects_no_cameras_and_cameras_off_the_device(rng):
    torch = pytest.importorskip("torch")
    from arc_warp_torch import rasterization

    scene = random_scene(rng, n=8, width=16, height=12)
    p, vm, ks = _torch_inputs(scene, torch)
    with pytest.raises(ValueError, match="no cameras"):
        rasterization(*p.values(), vm[:0], ks[:0], 16, 12)
    with pytest.raises(ValueError, match="Ks: expected a cpu or cuda tensor, got device meta"):
        rasterization(*p.values(), vm, ks.to("meta"), 16, 12)


def test_torch_memory_of_a_render_goes_with_its_graph(rng):
    """What a render's backward reads is torch memory the autograd node saves: the node
    frees it with its other saved tensors, after the backward (no garbage collector), and
    a retained graph keeps it for a second backward."""
    torch = pytest.importorskip("torch")
    from arc_warp_torch import rasterization

    scene = random_scene(rng, n=40, width=24, height=20, sh_degree=1)
    p, vm, ks = _torch_inputs(scene, torch)
    colors, _, _ = rasterization(*p.values(), vm, ks, scene.width, scene.height)
    colors.sum().backward(retain_graph=True)
    first = p["means"].grad.clone()
    p["means"].grad = None
    colors.sum().backward()
    torch.testing.assert_close(p["means"].grad, first)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        colors.sum().backward()


def test_workspace_checks_its_arguments(rng):
    scene = random_scene(rng, n=4, width=8, height=8)
    with pytest.raises(TypeError, match="workspace"):
        render_gaussians(*_arrays(scene), _camera(scene), workspace="cpu")
    with pytest.raises(ValueError, match="outputs"):
        render_gaussians(*_arrays(scene), _camera(scene), outputs={"colour": None})
    with pytest.raises(ValueError, match="width must be an int"):
        GaussianRenderer(0, 8, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GaussianRenderer(8, 8, 4).resize(0)
