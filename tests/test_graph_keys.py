"""Graph keys on the CPU: ``Frame.replay`` emulated so that a key seen before re-runs the
work queued by its first call (as a CUDA graph replays the launches it captured, with
their pointers baked in) instead of the current call's. A key that missed a pointer or
value a render or backward uses would then replay stale work, and the results below
would differ from kernel-by-kernel launches."""

import numpy as np
import pytest
import warp as wp

from arc_warp import Camera, GaussianGrads, RenderSettings, Workspace, render_gaussians
from arc_warp._src.splat.render import backwards_checked
from arc_warp._src.splat.workspace import Frame
from conftest import random_scene

DTYPES = (wp.vec3, wp.vec4, wp.vec3, wp.float32, wp.vec3)
NAMES = ("means", "quats", "scales", "opacities", "colors")


def _emulated_replay(replays):
    def replay(frame, key, queue):
        if key is None or not frame._workspace.graphs:
            return queue()
        key = (key, frame._workspace.allocations)
        entry = frame._graphs.get(key)
        if entry is not None:
            replays.append(key[0][0])
            entry[0]()  # the first call's work, as a graph of it would run
            return entry[1]
        result = queue()
        if frame._workspace.allocations == key[1]:
            frame._graphs[key] = (queue, result)
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
        results.append([o.color.numpy().copy() for o in outs] + [o.means2d_grad.numpy().copy() for o in outs]
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
    monkeypatch.setattr(Frame, "replay", _emulated_replay(replays))
    got = _loop(s, cameras, True, 7)
    # replayed: all but the first keyed step (the first render reads its total back) and
    # the steps that change what the keys hold
    assert replays.count("forward") >= 6 and replays.count("backward") >= 6, replays
    for step, (g, w) in enumerate(zip(got, want)):
        for i, (a, b) in enumerate(zip(g, w)):
            np.testing.assert_array_equal(a, b, err_msg=f"step {step}, result {i}")
