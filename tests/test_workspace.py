"""Workspace reuse: repeated renders of one size allocate no Warp arrays, and renders alive
at the same time never share buffers (Warp API and torch bridge, CPU)."""

import numpy as np
import pytest
import warp as wp

from arc_warp import Camera, RenderSettings, Workspace, render_gaussians, render_gaussians_backward
from conftest import random_scene


def _arrays(scene, requires_grad=False):
    def arr(x, dtype):
        return wp.array(x, dtype=dtype, device="cpu", requires_grad=requires_grad)

    return (arr(scene.means, wp.vec3), arr(scene.quats, wp.vec4), arr(scene.scales, wp.vec3),
            arr(scene.opacities, wp.float32), arr(scene.colors, wp.vec3))


def _camera(scene):
    return Camera(scene.fx, scene.fy, scene.cx, scene.cy, scene.width, scene.height,
                  world_to_camera=scene.world_to_camera)


def _warp_step(arrays, camera, settings, workspace, cotangent):
    out = render_gaussians(*arrays, camera, settings, workspace)
    grads = render_gaussians_backward(out, cotangent)
    return out.color.numpy(), grads.means.numpy()


def test_warp_api_repeated_step_allocates_nothing(rng):
    scene = random_scene(rng, n=40, width=24, height=20, sh_degree=2)
    arrays, camera = _arrays(scene), _camera(scene)
    settings = RenderSettings(absgrad=True)
    ws = Workspace("cpu")
    cot = wp.array(rng.normal(size=(20, 24, 3)), dtype=wp.vec3, device="cpu")
    first = _warp_step(arrays, camera, settings, ws, cot)
    after_first = ws.allocations
    assert after_first > 0
    for _ in range(2):  # the second and third steps allocate nothing, and agree with the first
        again = _warp_step(arrays, camera, settings, ws, cot)
        assert ws.allocations == after_first
        np.testing.assert_array_equal(again[0], first[0])
        np.testing.assert_array_equal(again[1], first[1])
    fresh = _warp_step(arrays, camera, settings, None, cot)  # no workspace: same numbers
    np.testing.assert_array_equal(fresh[1], first[1])


def test_warp_tape_repeated_step_allocates_nothing(rng):
    scene = random_scene(rng, n=30, width=20, height=16)
    arrays, camera = _arrays(scene, requires_grad=True), _camera(scene)
    ws = Workspace("cpu")

    def step():
        tape = wp.Tape()
        out = render_gaussians(*arrays, camera, workspace=ws, tape=tape)
        tape.backward(grads={out.color: wp.ones(out.color.shape, dtype=wp.vec3, device="cpu")})
        grad = arrays[0].grad.numpy().copy()
        tape.zero()
        return grad

    counts, grads = [], []
    for _ in range(3):
        grads.append(step())
        counts.append(ws.allocations)
    assert np.abs(grads[0]).max() > 0
    np.testing.assert_array_equal(grads[2], grads[0])
    assert counts[1] == counts[0] and counts[2] == counts[0]


def test_live_renders_do_not_share_buffers(rng):
    """A second render while the first is alive gets its own frame: the first one's
    backward still sees its own forward state."""
    a = random_scene(rng, n=30, width=20, height=16)
    b = random_scene(rng, n=30, width=20, height=16)
    cot = wp.array(rng.normal(size=(16, 20, 3)), dtype=wp.vec3, device="cpu")
    expected = _warp_step(_arrays(a), _camera(a), RenderSettings(), None, cot)[1]
    ws = Workspace("cpu")
    counts = []
    for _ in range(2):
        out_a = render_gaussians(*_arrays(a), _camera(a), workspace=ws)
        out_b = render_gaussians(*_arrays(b), _camera(b), workspace=ws)
        assert out_b.color.ptr != out_a.color.ptr
        render_gaussians_backward(out_b, cot)
        got = render_gaussians_backward(out_a, cot).means.numpy()
        np.testing.assert_array_equal(got, expected)
        del out_a, out_b  # both frames return to the pool
        counts.append(ws.allocations)
    assert counts[1] == counts[0]


def _sort_sizes(monkeypatch):
    """Records the size each sort is queued with."""
    import arc_warp._src.splat.render as render_module

    sizes, sort = [], render_module.sort_intersections
    monkeypatch.setattr(render_module, "sort_intersections",
                        lambda proj, depth, size, *a: sizes.append(size) or sort(proj, depth, size, *a))
    return sizes


@pytest.mark.parametrize("reduce", ["arc", "deterministic"])
def test_kept_sort_size_and_overflow_give_exact_results(rng, monkeypatch, reduce):
    """After the first render of a size, the sort is sized from the workspace's capacity
    (no readback first); a scene whose total exceeds it is re-rendered, so images and
    gradients equal a one-off render's, and the exact total replaces the size."""
    small = random_scene(rng, n=6, width=40, height=32, size_px_range=(0.3, 1.0))
    big = random_scene(rng, n=120, width=40, height=32, size_px_range=(4.0, 12.0))
    settings = RenderSettings(reduce=reduce)
    cot = wp.array(rng.normal(size=(32, 40, 3)), dtype=wp.vec3, device="cpu")
    monkeypatch.setattr("arc_warp._src.splat.workspace.SORT_SLACK", 0)  # tiny scenes overflow too
    ws = Workspace("cpu")
    sizes = _sort_sizes(monkeypatch)
    _warp_step(_arrays(small), _camera(small), settings, ws, cot)
    grid = (3, 2)
    kept = ws.sort_size(grid)
    assert kept is not None and kept > sizes[0]  # headroom over the first, exact total
    overflows = 0
    for scene in (small, big, small):
        expected = _warp_step(_arrays(scene), _camera(scene), settings, None, cot)
        sizes.clear()
        out = render_gaussians(*_arrays(scene), _camera(scene), settings, ws)
        grads = render_gaussians_backward(out, cot)
        np.testing.assert_array_equal(out.color.numpy(), expected[0])
        np.testing.assert_array_equal(grads.means.numpy(), expected[1])
        assert sizes[0] == kept  # queued with the kept size, before any readback
        total = out._bins.n_isects
        ranges = out._bins.tile_ranges.numpy()  # the tile counts were scratch, taken by the backward
        assert total == int(np.sum(ranges[:, 1] - ranges[:, 0]))
        if total > kept:  # the overflow: a second, exact sort, and a larger kept size
            assert sizes[1:] == [total] and ws.sort_size(grid) >= total
            overflows += 1
        kept = ws.sort_size(grid)
    assert overflows == 1  # the big scene
    assert len(sizes) == 1 and kept > 4 * out._bins.n_isects  # the big scene's total is remembered


def test_camera_list_renders_like_single_cameras(rng):
    """A list of cameras is queued in one call (outputs= as a list) and equals per-camera
    renders."""
    scene = random_scene(rng, n=50, width=24, height=20)
    cams = [_camera(scene), _camera(random_scene(rng, n=1, width=24, height=20))]
    targets = [{"color": wp.zeros((20, 24), dtype=wp.vec3, device="cpu")}, None]
    ws = Workspace("cpu")
    for _ in range(2):  # the first call reads totals back, the second sorts with the kept size
        outs = render_gaussians(*_arrays(scene), cams, workspace=ws, outputs=targets)
        assert outs[0].color is targets[0]["color"]
        for out, cam in zip(outs, cams):
            np.testing.assert_array_equal(out.color.numpy(), render_gaussians(*_arrays(scene), cam).color.numpy())
    with pytest.raises(ValueError, match="list of 2 cameras"):
        render_gaussians(*_arrays(scene), cams, outputs=targets[:1])


def test_workspace_checks_its_arguments(rng):
    scene = random_scene(rng, n=4, width=8, height=8)
    with pytest.raises(TypeError, match="workspace"):
        render_gaussians(*_arrays(scene), _camera(scene), workspace="cpu")
    with pytest.raises(ValueError, match="outputs"):
        render_gaussians(*_arrays(scene), _camera(scene), outputs={"colour": None})


def test_torch_repeated_step_allocates_nothing(rng, device):
    torch = pytest.importorskip("torch")
    from arc_warp_torch import RenderContext, rasterization

    scene = random_scene(rng, n=40, width=24, height=20, sh_degree=1)
    p = {k: torch.tensor(getattr(scene, k), device=device, requires_grad=True)
         for k in ("means", "quats", "scales", "opacities", "colors")}
    viewmats = torch.tensor(np.stack([scene.world_to_camera] * 2), dtype=torch.float32)
    ks = torch.tensor([[[scene.fx, 0.0, scene.cx], [0.0, scene.fy, scene.cy], [0.0, 0.0, 1.0]]] * 2,
                      dtype=torch.float32)
    def step():
        colors, _, meta = rasterization(*p.values(), viewmats, ks, scene.width, scene.height,
                                        absgrad=True, context=ctx)
        colors.square().sum().backward()
        grad = p["means"].grad.clone()
        for t in p.values():
            t.grad = None
        return grad

    ctx = RenderContext(device)
    counts, grads = [], []
    for _ in range(3):  # the step's outputs are dropped when step() returns
        grads.append(step())
        counts.append(ctx.workspace.allocations)
    assert counts[0] > 0 and counts[1] == counts[0] and counts[2] == counts[0]
    # the same buffers give the same result: exactly on the CPU, up to the order of the
    # GPU's float atomics on CUDA (the deterministic mode's own tests check exactness there)
    exact = device != "cuda"
    torch.testing.assert_close(grads[2], grads[0], rtol=0 if exact else 1e-5, atol=0 if exact else 1e-6)
    if device == "cuda":  # nothing else grows Warp's pool either
        torch.cuda.synchronize()
        used = wp.get_mempool_used_mem_current("cuda")
        step()
        torch.cuda.synchronize()
        assert wp.get_mempool_used_mem_current("cuda") == used

    # A loop keeps the last outputs while rendering the next; once their backward has run,
    # their frame serves the next render: it allocates in its first step only.
    ctx, counts = RenderContext(device), []
    for _ in range(4):
        colors, _, meta = rasterization(*p.values(), viewmats, ks, scene.width, scene.height,
                                        context=ctx)
        colors.sum().backward()
        counts.append(ctx.workspace.allocations)
    assert counts[3] == counts[2] == counts[1] == counts[0]


def test_device_cameras_render_like_host_cameras(rng):
    """DeviceCameras (matrices in device arrays, read by the projection kernel) render and
    differentiate like the same Cameras; invalid matrices raise ValueError."""
    from arc_warp import DeviceCameras

    scene = random_scene(rng, n=60, width=24, height=20, sh_degree=1)
    other = random_scene(rng, n=1, width=24, height=20)
    cams = [_camera(scene), _camera(other)]
    viewmats = wp.array(np.stack([c.world_to_camera for c in cams]).astype(np.float32), dtype=wp.mat44, device="cpu")
    ks = wp.array(np.stack([c.K for c in cams]).astype(np.float32), dtype=wp.mat33, device="cpu")
    device_cams = DeviceCameras(viewmats, ks, 24, 20)
    cot = wp.array(rng.normal(size=(20, 24, 3)), dtype=wp.vec3, device="cpu")
    ws = Workspace("cpu")
    for _ in range(2):
        outs = render_gaussians(*_arrays(scene), device_cams, workspace=ws)
        assert [o.camera_index for o in outs] == [0, 1]
        for out, cam in zip(outs, cams):
            ref = render_gaussians(*_arrays(scene), cam)
            np.testing.assert_allclose(out.color.numpy(), ref.color.numpy(), atol=1e-5)
            got = render_gaussians_backward(out, cot).colors.numpy()
            np.testing.assert_allclose(got, render_gaussians_backward(ref, cot).colors.numpy(), rtol=1e-4, atol=1e-5)
    bad = viewmats.numpy()
    bad[1, 0, 0] = np.nan
    with pytest.raises(ValueError, match="camera's viewmat/K"):
        render_gaussians(*_arrays(scene), DeviceCameras(wp.array(bad, dtype=wp.mat44, device="cpu"), ks, 24, 20))
    with pytest.raises(TypeError, match="intrinsics"):
        DeviceCameras(viewmats, viewmats, 24, 20)


def test_torch_retained_graph_keeps_its_frame(rng):
    """The frame of a render whose graph is retained is not handed to the next render
    (test_torch_repeated_step_allocates_nothing shows finished steps' frames are), and
    its second backward still works."""
    torch = pytest.importorskip("torch")
    from arc_warp_torch import RenderContext, rasterization

    scene = random_scene(rng, n=40, width=24, height=20, sh_degree=1)
    p = {k: torch.tensor(getattr(scene, k), requires_grad=True)
         for k in ("means", "quats", "scales", "opacities", "colors")}
    viewmats = torch.tensor(scene.world_to_camera[None], dtype=torch.float32)
    ks = torch.tensor([[[scene.fx, 0.0, scene.cx], [0.0, scene.fy, scene.cy], [0.0, 0.0, 1.0]]])
    ctx = RenderContext("cpu")
    colors, _, _ = rasterization(*p.values(), viewmats, ks, scene.width, scene.height, context=ctx)
    colors.square().sum().backward()
    counts = [ctx.workspace.allocations]
    for t in p.values():
        t.grad = None
    kept, _, _ = rasterization(*p.values(), viewmats, ks, scene.width, scene.height, context=ctx)
    kept.sum().backward(retain_graph=True)
    first = p["means"].grad.clone()
    again, _, _ = rasterization(*p.values(), viewmats, ks, scene.width, scene.height, context=ctx)
    assert ctx.workspace.allocations > counts[0]  # the retained graph's frame stays leased
    p["means"].grad = None
    kept.sum().backward()
    torch.testing.assert_close(p["means"].grad, first)
    del again
