"""Graph keys on the CPU: ``Frame.replay`` emulated so that a key seen before re-runs the
work queued by its first call (as a CUDA graph replays the launches it captured, with
their pointers baked in) instead of the current call's. A key that missed a pointer or
value a render or backward uses would then replay stale work, and the results below
would differ from kernel-by-kernel launches."""

import numpy as np
import pytest
import warp as wp

from arc_warp import Camera, GaussianGrads, RenderSettings, Workspace, render_gaussians, render_gaussians_backward
import arc_warp._src.splat.render as render_module
import arc_warp._src.splat.workspace as workspace_module
from arc_warp._src.splat.render import _RenderPlan, backwards_checked
from arc_warp._src.splat.workspace import Frame
from conftest import random_scene

DTYPES = (wp.vec3, wp.vec4, wp.vec3, wp.float32, wp.vec3)
NAMES = ("means", "quats", "scales", "opacities", "colors")


def emulate_graphs(monkeypatch, replays: list) -> None:
    """Patch ``Frame`` so that graphs are emulated (see the module notes); the kind of each
    replayed key ("forward" / "backward") is appended to ``replays``."""
    monkeypatch.setattr(Frame, "replay", _emulated_replay(replays))
    monkeypatch.setattr(Frame, "launch_graph", lambda frame, graph, stream=None: graph())


def _emulated_replay(replays):
    def replay(frame, key, queue):
        if key is None or not frame._workspace.graphs:
            return queue()
        key = (key, frame._workspace.allocations)
        entry = frame._graphs.get(key)
        if entry is not None:
            frame.launch_graph(entry[0])
            return entry[1]
        result = queue()
        if frame._workspace.allocations == key[1]:
            kind = key[0][0]
            # the first call's work, as a graph of it would run (Frame.launch_graph calls it)
            frame._graphs[key] = (lambda: (replays.append(kind), queue()), result)
        return result

    return replay


def _loop(scene, cameras, graphs, rng_seed):
    """Twelve renders + backwards of the cameras into fixed outputs, cotangents and grads,
    changing between steps what a replay must follow; returns every step's results."""
    rng = np.random.default_rng(rng_seed)
    ws = Workspace("cpu")
    ws.graphs = graphs  # keys made and replayed as on CUDA
    settings = RenderSettings(sh_degree=1, reduce="atomic")
    n, h, w = scene.means.shape[0], cameras[0].height, cameras[0].width
    arrays = [wp.array(getattr(scene, k), dtype=dt, device="cpu") for k, dt in zip(NAMES, DTYPES)]
    kept = [arrays]
    outputs = [{"color": wp.zeros((h, w), dtype=wp.vec3, device="cpu")} for _ in cameras]
    cots = [(wp.array(rng.normal(size=(h, w, 3)), dtype=wp.vec3, device="cpu"), None, None,
             wp.array(rng.normal(size=(h, w)), dtype=wp.float32, device="cpu")) for _ in cameras]
    grads = GaussianGrads(*(wp.zeros_like(a) for a in arrays))
    results = []
    for step in range(12):  # a change every third step, then two steps that repeat it
        if step == 3:  # new values behind the same pointers
            arrays[0].assign(arrays[0].numpy() + rng.normal(scale=0.01, size=(n, 3)).astype(np.float32))
        if step == 5:  # new inputs (new pointers; the old stay alive, so they are not reused)
            arrays = [wp.clone(a) for a in arrays]
            arrays[0].assign(arrays[0].numpy() + rng.normal(scale=0.01, size=(n, 3)).astype(np.float32))
            kept.append(arrays)
        if step == 7:  # the last camera's output elsewhere
            outputs[-1] = {"color": wp.zeros((h, w), dtype=wp.vec3, device="cpu")}
        if step == 9:  # the first camera's cotangent elsewhere
            cots[0] = (wp.array(rng.normal(size=(h, w, 3)), dtype=wp.vec3, device="cpu"), *cots[0][1:])
        outs = render_gaussians(*arrays, cameras, settings, ws, outputs=outputs)
        backwards_checked(outs, cots, grads, False, [None] * len(outs))
        assert all(o.color is out["color"] for o, out in zip(outs, outputs))
        # the images read from the caller's arrays: a repeat that wrote elsewhere would show
        results.append([out["color"].numpy().copy() for out in outputs] + [o.means2d_grad.numpy().copy() for o in outs]
                       + [getattr(grads, k).numpy().copy() for k in NAMES])
        del outs
    return results


@pytest.mark.parametrize("count", [1, 3])
def test_emulated_graph_replay_matches_kernel_launches(rng, monkeypatch, count):
    """C cameras' renders and backwards (replayed together for C > 1) into fixed arrays,
    with values, inputs, an output and a cotangent changed between steps: the emulated
    replays give what kernel-by-kernel launches give, and replays take place."""
    s = random_scene(rng, n=80, width=40, height=30, sh_degree=1)
    # views of one scene that all see its Gaussians (principal points apart)
    cameras = [Camera(s.fx, s.fy, s.cx + 3.0 * i, s.cy - 2.0 * i, s.width, s.height, world_to_camera=s.world_to_camera)
               for i in range(count)]
    want = _loop(s, cameras, False, 7)
    assert all(np.abs(image).max() > 0 for image in want[-1][:count])
    replays = []
    repeats = _emulate(monkeypatch, replays)
    got = _loop(s, cameras, True, 7)
    # replayed: all but the first keyed step (the first render reads its total back) and
    # the steps that change what the keys hold; renders repeated from their plan in the
    # steps that change nothing or only values
    assert replays.count("forward") >= 6 and replays.count("backward") >= 6, replays
    assert repeats.count(True) >= 4, repeats
    for step, (g, w) in enumerate(zip(got, want)):
        for i, (a, b) in enumerate(zip(g, w)):
            np.testing.assert_array_equal(a, b, err_msg=f"step {step}, result {i}")


def _emulate(monkeypatch, replays=None):
    """Emulated graphs (see the module notes, and `emulate_graphs` for ``replays``);
    returns the list of repeat outcomes (True: a call repeated from its plan, False: a
    plan that matched but could not)."""
    repeats = []
    emulate_graphs(monkeypatch, [] if replays is None else replays)
    repeat = _RenderPlan.repeat

    def counted(plan, *args):
        outs = repeat(plan, *args)
        repeats.append(outs is not None)
        return outs

    monkeypatch.setattr(_RenderPlan, "repeat", counted)
    return repeats


def test_repeats_keep_the_previous_render_intact(rng, monkeypatch):
    """A loop that holds the previous step's output while rendering the next (the Warp
    API's `out = render_gaussians(...)`) alternates two frames: repeats never take the
    frame of the render still held, whose images and gradients stay those of its inputs.
    Two sets of inputs take turns (the held render's are left unchanged), each with new
    values behind the same pointers at every turn."""
    repeats = _emulate(monkeypatch)
    s = random_scene(rng, n=80, width=40, height=30, sh_degree=1)
    cam = Camera(s.fx, s.fy, s.cx, s.cy, s.width, s.height, world_to_camera=s.world_to_camera)
    settings = RenderSettings(sh_degree=1, reduce="atomic")
    sets = [[wp.array(getattr(s, k), dtype=dt, device="cpu") for k, dt in zip(NAMES, DTYPES)] for _ in range(2)]
    reference = Workspace("cpu")
    ws = Workspace("cpu")
    ws.graphs = True
    cot = wp.array(rng.normal(size=(s.height, s.width, 3)), dtype=wp.vec3, device="cpu")
    previous = None
    for step in range(12):
        arrays = sets[step % 2]
        arrays[0].assign(arrays[0].numpy() + rng.normal(scale=0.01, size=(s.means.shape[0], 3)).astype(np.float32))
        out = render_gaussians(*arrays, cam, settings, ws)
        want = render_gaussians(*arrays, cam, settings, reference)
        np.testing.assert_array_equal(out.color.numpy(), want.color.numpy(), err_msg=f"step {step}")
        if previous is not None:  # the render still held kept its own images and backward
            np.testing.assert_array_equal(previous[0].color.numpy(), previous[1], err_msg=f"step {step}")
            grads = GaussianGrads(*(wp.zeros_like(a) for a in arrays))
            got = render_gaussians_backward(previous[0], cot, grads=grads).means.numpy()
            np.testing.assert_array_equal(got, previous[2], err_msg=f"step {step}")
            # added into a 2D-mean gradient that starts at zero for each render
            np.testing.assert_array_equal(previous[0].means2d_grad.numpy(), previous[3], err_msg=f"step {step}")
        grads = GaussianGrads(*(wp.zeros_like(a) for a in arrays))
        previous = (out, want.color.numpy().copy(), render_gaussians_backward(want, cot, grads=grads).means.numpy().copy(),
                    want.means2d_grad.numpy().copy())
    assert repeats.count(True) >= 5, repeats
    # the same call again while its output is held: prepared on another frame, not repeated
    again = render_gaussians(*arrays, cam, settings, ws)
    assert again._frame is not out._frame
    np.testing.assert_array_equal(again.color.numpy(), previous[1])


def test_a_grown_sort_size_is_not_repeated(rng, monkeypatch):
    """When a render overflows the kept sort size (re-rendered with its total read back),
    the size grows and the next call is prepared anew with it, not repeated with the old
    size (which would overflow and re-render at every step)."""
    repeats = _emulate(monkeypatch)
    monkeypatch.setattr(workspace_module, "SORT_SLACK", 0)  # kept sizes of a small scene, unpadded
    exact = []
    render_exact = render_module._render_exact
    monkeypatch.setattr(render_module, "_render_exact", lambda *a: (exact.append(True), render_exact(*a))[1])
    s = random_scene(rng, n=80, width=40, height=30, sh_degree=1, size_px_range=(0.3, 1.5))
    cam = Camera(s.fx, s.fy, s.cx, s.cy, s.width, s.height, world_to_camera=s.world_to_camera)
    settings = RenderSettings(sh_degree=1, reduce="atomic")
    arrays = [wp.array(getattr(s, k), dtype=dt, device="cpu") for k, dt in zip(NAMES, DTYPES)]
    ws = Workspace("cpu")
    ws.graphs = True
    for _ in range(4):
        render_gaussians(*arrays, cam, settings, ws)
    assert repeats and repeats[-1], repeats
    before = len(repeats)
    arrays[2].assign(arrays[2].numpy() * 30.0)  # far larger footprints, same pointers
    for _ in range(3):
        render_gaussians(*arrays, cam, settings, ws)
    assert exact.count(True) == 1, exact  # the overflow, once
    # repeated, overflowed (re-rendered, its sort buffers grown: allocated), then not
    # repeated: the kept graph's buffers have moved
    assert repeats[before:before + 2] == [True, False], repeats


def test_alternating_outputs_are_repeated(rng, monkeypatch):
    """Renders into two output arrays in turn on one frame (the torch bridge's output pool
    while the previous image is held) are both repeated from their plans, into the
    right array."""
    repeats = _emulate(monkeypatch)
    s = random_scene(rng, n=80, width=40, height=30, sh_degree=1)
    cam = Camera(s.fx, s.fy, s.cx, s.cy, s.width, s.height, world_to_camera=s.world_to_camera)
    settings = RenderSettings(sh_degree=1, reduce="atomic")
    arrays = [wp.array(getattr(s, k), dtype=dt, device="cpu") for k, dt in zip(NAMES, DTYPES)]
    ws, reference = Workspace("cpu"), Workspace("cpu")
    ws.graphs = True
    outputs = [{"color": wp.zeros((s.height, s.width), dtype=wp.vec3, device="cpu")} for _ in range(2)]
    for step in range(12):
        arrays[0].assign(arrays[0].numpy() + rng.normal(scale=0.01, size=(s.means.shape[0], 3)).astype(np.float32))
        out = render_gaussians(*arrays, cam, settings, ws, outputs=outputs[step % 2])
        want = render_gaussians(*arrays, cam, settings, reference)
        np.testing.assert_array_equal(outputs[step % 2]["color"].numpy(), want.color.numpy(), err_msg=f"step {step}")
        del out
    assert repeats.count(True) >= 6, repeats


def _one_view(rng, **scene):
    s = random_scene(rng, n=80, width=40, height=30, sh_degree=1, **scene)
    cam = Camera(s.fx, s.fy, s.cx, s.cy, s.width, s.height, world_to_camera=s.world_to_camera)
    arrays = [wp.array(getattr(s, k), dtype=dt, device="cpu") for k, dt in zip(NAMES, DTYPES)]
    return s, cam, arrays


def test_a_plan_is_not_repeated_after_the_workspace_allocates(rng, monkeypatch):
    """A render of another size grows the workspace's shared buffers (it allocates), so a
    kept graph of the first size may point at freed memory: its plan is not repeated, and
    the call is prepared (and captured) anew."""
    repeats = _emulate(monkeypatch)
    settings = RenderSettings(sh_degree=1, reduce="atomic")
    s, cam, arrays = _one_view(rng)
    big = Camera(s.fx * 4, s.fy * 4, s.cx * 4, s.cy * 4, s.width * 4, s.height * 4, world_to_camera=s.world_to_camera)
    ws = Workspace("cpu")
    ws.graphs = True
    for _ in range(4):
        render_gaussians(*arrays, cam, settings, ws)
    assert repeats and all(repeats), repeats
    allocations = ws.allocations
    render_gaussians(*arrays, big, settings, ws)
    assert ws.allocations > allocations
    out = render_gaussians(*arrays, cam, settings, ws)
    assert repeats[-1] is False, repeats
    np.testing.assert_array_equal(out.color.numpy(), render_gaussians(*arrays, cam, settings, Workspace("cpu")).color.numpy())


def test_a_plan_is_not_repeated_with_a_changed_sort_size(rng, monkeypatch):
    """Once the kept sort size shrinks (recent totals far below it; no allocation), calls
    are prepared with the new size rather than repeated with the old one."""
    repeats = _emulate(monkeypatch)
    monkeypatch.setattr(workspace_module, "SORT_SLACK", 0)
    monkeypatch.setattr(workspace_module, "SORT_HISTORY", 2)  # the size follows the last two totals
    settings = RenderSettings(sh_degree=1, reduce="atomic")
    s, cam, arrays = _one_view(rng, size_px_range=(3.0, 8.0))
    ws = Workspace("cpu")
    ws.graphs = True
    for _ in range(4):
        render_gaussians(*arrays, cam, settings, ws)
    grid = ((s.width + 15) // 16, (s.height + 15) // 16)
    kept, allocations = ws.sort_size(grid), ws.allocations
    arrays[2].assign(arrays[2].numpy() * 0.05)  # far smaller footprints, same pointers
    for _ in range(4):
        render_gaussians(*arrays, cam, settings, ws)
    assert ws.sort_size(grid) < kept and ws.allocations == allocations
    assert False in repeats[1:], repeats


def test_a_backward_without_intersections_is_not_replayed_for_one_with(rng, monkeypatch):
    """A render with no intersection skips the rasteriser backward; a later render of the
    same key (same pointers and kept sort size, new values) that has intersections must
    not replay that backward: its gradients are those of kernel-by-kernel launches."""
    replays = []
    emulate_graphs(monkeypatch, replays)
    settings = RenderSettings(sh_degree=1, reduce="atomic")
    s, cam, arrays = _one_view(rng)
    opacities = arrays[3].numpy().copy()
    cot = wp.array(rng.normal(size=(s.height, s.width, 3)), dtype=wp.vec3, device="cpu")
    ws = Workspace("cpu")
    ws.graphs = True
    render_gaussians(*arrays, cam, settings, ws)  # reads its total back: the kept sort size
    arrays[3].zero_()  # every Gaussian culled: no intersection, the same keys
    for _ in range(3):
        out = render_gaussians(*arrays, cam, settings, ws)
        assert out._bins.n_isects == 0
        render_gaussians_backward(out, cot)
        del out  # one frame, whose graphs the next step replays
    assert "backward" in replays, replays
    arrays[3].assign(opacities)
    out = render_gaussians(*arrays, cam, settings, ws)
    assert out._bins.n_isects > 0
    got = render_gaussians_backward(out, cot)
    want = render_gaussians_backward(render_gaussians(*arrays, cam, settings, Workspace("cpu")), cot)
    for name in NAMES:
        np.testing.assert_array_equal(getattr(got, name).numpy(), getattr(want, name).numpy(), err_msg=name)
