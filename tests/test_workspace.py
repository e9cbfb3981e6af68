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

    # A loop that keeps the last outputs while rendering the next alternates two frames:
    # it allocates in its first two steps only.
    ctx, counts = RenderContext(device), []
    for _ in range(4):
        colors, _, meta = rasterization(*p.values(), viewmats, ks, scene.width, scene.height,
                                        context=ctx)
        colors.sum().backward()
        counts.append(ctx.workspace.allocations)
    assert counts[3] == counts[2] == counts[1] > counts[0]
