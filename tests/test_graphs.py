"""CUDA graph replay of repeated renders and backwards (``Workspace(graphs=True)``, the
default on CUDA): the replayed work gives what kernel-by-kernel launches give, reads the
current values behind the same pointers, and a sort overflow still re-renders exactly."""

import numpy as np
import pytest
import warp as wp

from arc_warp import Camera, RenderSettings, Workspace, render_gaussians, render_gaussians_backward
from arc_warp._src.splat.render import _RenderPlan
from arc_warp._src.splat.workspace import Frame
from conftest import random_scene

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not wp.is_cuda_available(), reason="needs a CUDA device")]


def _camera(scene):
    return Camera(scene.fx, scene.fy, scene.cx, scene.cy, scene.width, scene.height,
                  world_to_camera=scene.world_to_camera)


def _upload(scene, arrays=None):
    """The scene's Gaussians in CUDA arrays (written into ``arrays`` if given: same pointers)."""
    values = [(scene.means, wp.vec3), (scene.quats, wp.vec4), (scene.scales, wp.vec3), (scene.opacities, wp.float32),
              (scene.colors, wp.vec3)]
    if arrays is None:
        return [wp.array(v, dtype=dt, device="cuda") for v, dt in values]
    for a, (v, dt) in zip(arrays, values):
        a.assign(wp.array(v, dtype=dt, device="cpu"))
    return arrays


def _step(arrays, camera, settings, ws, cotangent):
    out = render_gaussians(*arrays, camera, settings, ws)
    grads = render_gaussians_backward(out, cotangent)
    result = [out.color.numpy(), out.alpha.numpy(), out.radii.numpy(), grads.means.numpy(), grads.colors.numpy(),
              out.means2d_grad.numpy()]
    return result, out


@pytest.mark.parametrize("reduce", ["arc", "atomic"])
def test_replayed_graphs_match_kernel_launches(rng, reduce):
    scene = random_scene(rng, n=400, width=70, height=45, sh_degree=2)
    camera, settings = _camera(scene), RenderSettings(reduce=reduce)
    arrays = _upload(scene)
    cot = wp.array(rng.normal(size=(45, 70, 3)), dtype=wp.vec3, device="cuda")
    graphed, plain = Workspace("cuda"), Workspace("cuda", graphs=False)
    assert graphed.graphs and not plain.graphs
    for step in range(4):
        if step == 3:  # new values behind the same pointers: the graph reads them
            scene.means[:] += rng.normal(scale=0.02, size=scene.means.shape).astype(np.float32)
            scene.colors[:] *= 0.5
            _upload(scene, arrays)
        got, out = _step(arrays, camera, settings, graphed, cot)
        want, _ = _step(arrays, camera, settings, plain, cot)
        for g, w in zip(got[:3], want[:3]):  # images and radii: exact
            np.testing.assert_array_equal(g, w)
        for g, w in zip(got[3:], want[3:]):  # gradients: up to the order of float atomics
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
        if step >= 2:  # captured on the second repeat, replayed after
            assert len(out._frame._graphs) == 3  # the forward's two graphs (FORWARD_GRAPHS), the backward
        del out
    assert not any(f._graphs for f in plain._free)


def test_graph_replay_overflow_rerenders_exactly(rng):
    """A replayed render whose intersections outgrow the kept sort size is rendered again
    exactly, as without graphs."""
    small = random_scene(rng, n=3000, width=64, height=48, sh_degree=0)
    arrays = _upload(small)
    camera = _camera(small)
    ws = Workspace("cuda")
    for _ in range(4):  # each render's output is dropped before the next: one frame
        out = render_gaussians(*arrays, camera, workspace=ws)
        frame = out._frame
        del out
    kept = ws.sort_size((4, 3))
    assert len(frame._graphs) == 2  # the forward's two graphs, replayed since the third render
    small.scales[:] *= 8.0  # many more tiles per Gaussian, same pointers
    _upload(small, arrays)
    out = render_gaussians(*arrays, camera, workspace=ws)
    assert out._bins.n_isects > kept
    ref = render_gaussians(*arrays, camera, workspace=Workspace("cuda", graphs=False))
    np.testing.assert_array_equal(out.color.numpy(), ref.color.numpy())


@pytest.mark.parametrize("cameras", [1, 3])
def test_torch_training_loop_replays_graphs(rng, cameras):
    """A torch loop (L1 loss, in-place gradient steps on the leaf tensors it renders) with
    graphs gives the parameters that kernel-by-kernel launches give, and replays its
    renders and backwards as graphs once they repeat: the same graphs per step (the
    forward's two, the backward) whatever the number of cameras."""
    torch = pytest.importorskip("torch")
    from arc_warp_torch import RenderContext, rasterization

    scene = random_scene(rng, n=500, width=64, height=48, sh_degree=1)
    target = torch.rand(cameras, 48, 64, 3, device="cuda")
    viewmats = torch.tensor(scene.world_to_camera[None], dtype=torch.float32, device="cuda").repeat(cameras, 1, 1)
    # views of one scene that all see its Gaussians (principal points apart)
    ks = torch.tensor([[[scene.fx, 0.0, scene.cx + 3.0 * i], [0.0, scene.fy, scene.cy - 2.0 * i], [0.0, 0.0, 1.0]]
                       for i in range(cameras)], dtype=torch.float32, device="cuda")

    def train(ctx):
        p = [torch.tensor(getattr(scene, k), device="cuda", requires_grad=True)
             for k in ("means", "quats", "scales", "opacities", "colors")]
        for _ in range(12):  # the output pool's pointers repeat every few steps
            img, _, _ = rasterization(*p, viewmats, ks, 64, 48, context=ctx)
            loss = (img - target).abs().mean()
            loss.backward()
            with torch.no_grad():
                for t in p:
                    t -= 1e-3 * t.grad
                    t.grad = None
        return p

    graphed = RenderContext("cuda")
    launches = []
    replay, repeat = Frame.replay, _RenderPlan.repeat

    def counted(frame, key, queue):
        launches.append(key is not None and (key, frame._workspace.allocations) in frame._graphs)
        return replay(frame, key, queue)

    repeats = []

    def counted_repeat(plan, *args):  # a render repeated from its plan: one graph launch
        result = repeat(plan, *args)
        if result is not None:
            launches.append(True)
        repeats.append(result is not None)
        return result

    Frame.replay, _RenderPlan.repeat = counted, counted_repeat
    try:
        got = train(graphed)
    finally:
        Frame.replay, _RenderPlan.repeat = replay, repeat
    want = train(RenderContext("cuda", graphs=False))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    # per step, each for all cameras: the forward's two graphs (one entry when repeated
    # from the render plan) and the backward; the last two steps repeat and replay all
    assert launches[-4:] == [True] * 4, launches
    assert repeats.count(True) >= 6, repeats
    assert len(launches) <= 3 * 12, launches  # not per camera
