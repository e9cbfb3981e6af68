"""A workspace whose buffers come from an outside allocator (``Workspace(allocator=...)``,
the torch bridge's ``RenderContext(release_workspace=True)``) hands
their memory back once a render's backward can no longer run, and takes it back at the
next render. The allocator here poisons memory when it is handed back (NaN bytes, kept
allocated so nothing else lands there), so a kernel that read a buffer after its release,
or a replay that wrote to an old address, would show in the images and gradients, which
must equal those of a context that keeps its buffers."""

import numpy as np
import pytest
import warp as wp

torch = pytest.importorskip("torch", reason="arc_warp_torch needs torch")

import arc_warp._src.splat.workspace as workspace_module  # noqa: E402
from arc_warp_torch import RenderContext, rasterization  # noqa: E402
from conftest import random_scene  # noqa: E402
from test_deferred_checks import _step, _views  # noqa: E402
from test_torch_plugin import PARAMS, params_of  # noqa: E402


class PoisoningAllocator:
    """Host memory for a CPU workspace: ``nbytes -> (pointer, owner)``. When the owner is
    dropped, its bytes become NaN and stay allocated (``graveyard``). ``moving`` True
    never gives an address twice (every restore moves); False hands back the free block
    of that size at the lowest address, as torch's caching allocator picks among equal
    sizes."""

    def __init__(self, moving=False):
        self.moving = moving
        self.forbid = False  # set while an emulated capture runs: a CUDA capture cannot allocate
        self.live = 0
        self.graveyard = []
        self.free = {}  # nbytes -> [numpy arrays] (only when not moving)

    def __call__(self, nbytes):
        assert not self.forbid, "allocated inside a (emulated) graph capture"
        spare = self.free.get(nbytes)
        if spare and not self.moving:
            block = spare.pop(min(range(len(spare)), key=lambda i: spare[i].ctypes.data))
        else:
            block = np.empty(nbytes, dtype=np.uint8)
        self.live += 1
        return block.ctypes.data, _Owner(self, block)

    def give_back(self, block):
        self.live -= 1
        block.view(np.uint8)[:] = 0xFF  # NaN as float32, -1 as int32
        if self.moving:
            self.graveyard.append(block)
        else:
            self.free.setdefault(block.nbytes, []).append(block)


class _Owner:
    def __init__(self, allocator, block):
        self.allocator, self.block = allocator, block

    def __del__(self):
        self.allocator.give_back(self.block)


@pytest.fixture(autouse=True)
def _release_small_frames(request, monkeypatch):
    """These scenes are tiny: release their frames whatever their size (but in the test of
    that size limit)."""
    if "size_limit" not in request.node.name:
        monkeypatch.setattr(workspace_module, "RELEASE_MIN_BYTES", 0)


def test_frames_under_the_size_limit_are_kept(rng, monkeypatch):
    """A frame whose buffers sum to less than RELEASE_MIN_BYTES keeps them (small blocks
    rarely come back at their address from a caching allocator); over it, they go."""
    scene = random_scene(rng, n=30, width=24, height=20, sh_degree=0)
    vm, ks = _views(scene, 1, "cpu")
    allocator = PoisoningAllocator()
    context = _context(allocator)
    p = params_of(scene)
    colors = rasterization(*(p[k] for k in PARAMS), vm, ks, scene.width, scene.height, context=context)[0]
    colors.sum().backward()
    held = context.workspace.nbytes()
    assert 0 < held < workspace_module.RELEASE_MIN_BYTES and allocator.live > 0
    for limit, live in ((held + 1, True), (0, False)):
        monkeypatch.setattr(workspace_module, "RELEASE_MIN_BYTES", limit)
        colors = rasterization(*(p[k] for k in PARAMS), vm, ks, scene.width, scene.height, context=context)[0]
        colors.sum().backward()
        del colors
        assert (allocator.live > 0) == live, limit


def _context(allocator, defer=True):
    context = RenderContext("cpu", defer_checks=defer, release_workspace=allocator is not None)
    if allocator is not None:
        context.workspace.allocator = allocator
    return context


@pytest.mark.parametrize("moving", [False, True])
@pytest.mark.parametrize("count", [1, 2])
def test_a_training_loop_that_hands_its_buffers_back_computes_the_same(rng, moving, count):
    """Steps of render + backward (with an in-place update between them, and the previous
    images held while the next render runs, as a loop does) on a releasing context: the
    images and gradients equal a keeping context's bitwise, the memory is handed back
    after each backward, and a caching allocator (same addresses back) adds no
    allocations after the first steps while a moving one changes the allocation count."""
    scene = random_scene(rng, n=60, width=40, height=32, sh_degree=1)
    vm, ks = _views(scene, count, "cpu")
    weights = torch.tensor(rng.normal(size=(count, scene.height, scene.width, 3)), dtype=torch.float32)
    allocator = PoisoningAllocator(moving)
    results = {}
    for name, context in (("keep", _context(None)), ("release", _context(allocator))):
        p = params_of(scene)
        got, allocations = [], []
        for step in range(6):
            got.append(_step(p, scene, vm, ks, context, weights))
            if name == "release":
                # the backward ran: only the buffers kept for good (host flags) hold memory
                held = [b for b in context.workspace.memory_report() if b.name != "host_flags"]
                assert not held, held
                assert allocator.live == 0
                allocations.append(context.workspace.allocations)
            with torch.no_grad():
                p["means"] += 0.01
        results[name] = got
    for (img_k, g_k), (img_r, g_r) in zip(results["keep"], results["release"]):
        torch.testing.assert_close(img_r, img_k, rtol=0, atol=0)
        for k in g_k:
            torch.testing.assert_close(g_r[k], g_k[k], rtol=0, atol=0, msg=k)
    if moving:
        assert allocations[-1] > allocations[-2] > allocations[-3]
    else:
        assert allocations[-1] == allocations[-3]


@pytest.mark.parametrize("count", [1, 2])
def test_a_step_takes_its_memory_back_in_two_allocations_and_its_backward_holds_no_sort_keys(rng, count):
    """A steady step's render takes back its frames' and the backward scratch's memory in
    one allocator call and the forward's scratch arena (the sorts' keys) in another
    (``Workspace.restore``), not one per frame; the arena goes back when the render call
    returns (``Workspace.release_forward``), so the backward runs without it, on scratch of
    its own, which goes back with the frames after it."""
    scene = random_scene(rng, n=60, width=40, height=32, sh_degree=1)
    vm, ks = _views(scene, count, "cpu")
    weights = torch.tensor(rng.normal(size=(count, scene.height, scene.width, 3)), dtype=torch.float32)
    allocator = PoisoningAllocator()
    calls = []

    def counting(nbytes):
        calls.append(nbytes)
        return allocator(nbytes)

    context = _context(counting)
    p = params_of(scene)
    for _ in range(4):
        _step(p, scene, vm, ks, context, weights)
    calls.clear()
    colors, alphas, meta = rasterization(*(p[k] for k in PARAMS), vm, ks, scene.width, scene.height,
                                         context=context)
    held = {b.name for b in context.workspace.memory_report() if b.frame == 0}
    assert held == {"grad_scratch"}, held  # the forward's arena is back with the allocator
    assert len(calls) == 2, calls
    ((colors * weights).sum() + alphas.sum()).backward()
    assert len(calls) == 2, calls  # the backward found its scratch back
    assert allocator.live == 0


def test_a_render_finished_by_garbage_collection_mid_call_hands_back_after_it(rng, monkeypatch):
    """A render whose graph is only reachable through a reference cycle is finished by the
    garbage collector, which can run inside a later render or backward on the same
    workspace: its frames and the shared scratch (in use by that call) are handed back
    after the call, so the call computes what a keeping context computes."""
    import gc

    import arc_warp._src.splat.render as render_module

    scene = random_scene(rng, n=60, width=40, height=32, sh_degree=1)
    vm, ks = _views(scene, 1, "cpu")
    weights = torch.tensor(rng.normal(size=(1, scene.height, scene.width, 3)), dtype=torch.float32)
    allocator = PoisoningAllocator(moving=True)
    results = {}
    for name, context in (("keep", _context(None)), ("release", _context(allocator))):
        p = params_of(scene)
        _step(p, scene, vm, ks, context, weights)
        cycle = [rasterization(p["means"], p["quats"], p["scales"], p["opacities"], p["colors"], vm, ks,
                               scene.width, scene.height, context=context)]
        cycle.append(cycle)  # its node and frame now die only in a garbage collection
        del cycle
        sort, collected = render_module.sort_intersections, []

        def collecting(*args, **kwargs):  # the collector runs after the projection filled the scratch
            collected.append(gc.collect())
            return sort(*args, **kwargs)

        gc.disable()
        try:
            monkeypatch.setattr(render_module, "sort_intersections", collecting)
            results[name] = _step(p, scene, vm, ks, context, weights)
            monkeypatch.setattr(render_module, "sort_intersections", sort)
        finally:
            gc.enable()
        assert collected and collected[0] > 0
        if name == "release":
            assert allocator.live == 0  # handed back once the call ended
    (img_k, g_k), (img_r, g_r) = results["keep"], results["release"]
    torch.testing.assert_close(img_r, img_k, rtol=0, atol=0)
    for k in g_k:
        torch.testing.assert_close(g_r[k], g_k[k], rtol=0, atol=0, msg=k)


def test_a_densification_between_released_steps_computes_the_same(rng):
    """New, larger parameter tensors midway (a densification: every frame buffer changes
    size) on a releasing context: each step's images and gradients equal a keeping
    context's bitwise, and the memory is handed back after every backward."""
    scene = random_scene(rng, n=40, width=32, height=24, sh_degree=1)
    vm, ks = _views(scene, 1, "cpu")
    weights = torch.tensor(rng.normal(size=(1, scene.height, scene.width, 3)), dtype=torch.float32)
    allocator = PoisoningAllocator()
    results = {}
    for name, context in (("keep", _context(None)), ("release", _context(allocator))):
        got = []
        for step in range(6):
            p = params_of(scene)
            if step >= 3:  # 30 Gaussians cloned, moved a little
                with torch.no_grad():
                    p = {k: torch.cat([v, v[:30] + (0.02 if k == "means" else 0.0)]).requires_grad_()
                         for k, v in p.items()}
            got.append(_step(p, scene, vm, ks, context, weights))
            if name == "release":
                assert allocator.live == 0
        results[name] = got
    assert not torch.equal(results["keep"][2][0], results["keep"][3][0])  # the clones show
    for (img_k, g_k), (img_r, g_r) in zip(results["keep"], results["release"]):
        torch.testing.assert_close(img_r, img_k, rtol=0, atol=0)
        for k in g_k:
            torch.testing.assert_close(g_r[k], g_k[k], rtol=0, atol=0, msg=k)


def test_buffers_stay_while_a_retained_graph_can_run_again(rng):
    """With retain_graph=True the render's frame keeps its memory, so a second backward
    gives the first one's gradients; once the graph is dropped the memory goes back."""
    scene = random_scene(rng, n=50, width=32, height=24, sh_degree=1)
    vm, ks = _views(scene, 1, "cpu")
    allocator = PoisoningAllocator()
    context = _context(allocator)
    p = params_of(scene)
    colors, alphas, _ = rasterization(*(p[k] for k in PARAMS), vm, ks, scene.width, scene.height, context=context)
    loss = (colors * torch.linspace(0, 1, colors.numel()).view_as(colors)).sum() + alphas.sum()
    loss.backward(retain_graph=True)
    first = {k: p[k].grad.clone() for k in PARAMS}
    assert allocator.live > 0
    for k in PARAMS:
        p[k].grad = None
    loss.backward()
    for k in PARAMS:
        torch.testing.assert_close(p[k].grad, first[k], rtol=0, atol=0, msg=k)
    del loss, colors, alphas
    assert allocator.live == 0


def test_a_render_without_backward_hands_back_when_dropped(rng):
    """A render with grad whose output is dropped without a backward releases its memory,
    and the next render (whose deferred checks see nothing bad) still renders right."""
    scene = random_scene(rng, n=50, width=32, height=24, sh_degree=1)
    vm, ks = _views(scene, 1, "cpu")
    allocator = PoisoningAllocator()
    context = _context(allocator)
    keep = _context(None)
    p = params_of(scene)
    args = [p[k] for k in PARAMS] + [vm, ks, scene.width, scene.height]
    colors = rasterization(*args, context=context)[0]
    del colors
    assert allocator.live == 0
    with torch.no_grad():
        got = rasterization(*args, context=context)[0]
        want = rasterization(*args, context=keep)[0]
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def _warp_scene(rng, n, width, height):
    """(scene, its Camera, its five Warp input arrays on the CPU), SH degree 0."""
    from arc_warp import Camera

    scene = random_scene(rng, n=n, width=width, height=height, sh_degree=0)
    camera = Camera(scene.fx, scene.fy, scene.cx, scene.cy, scene.width, scene.height,
                    world_to_camera=scene.world_to_camera)
    arrays = [wp.array(getattr(scene, k), dtype=dt, device="cpu")
              for k, dt in zip(("means", "quats", "scales", "opacities", "colors"),
                               (wp.vec3, wp.vec4, wp.vec3, wp.float32, wp.vec3))]
    return scene, camera, arrays


def test_the_core_workspace_releases_and_restores_frames(rng):
    """Warp API: ``Workspace.release`` hands back a finished render's frame and the shared
    scratch; the next render on the same workspace restores them and matches a workspace
    without an allocator."""
    from arc_warp import RenderSettings, Workspace, render_gaussians

    _, camera, arrays = _warp_scene(rng, 40, 24, 20)
    settings = RenderSettings(reduce="atomic")
    allocator = PoisoningAllocator(moving=True)
    released, kept = Workspace("cpu", allocator=allocator), Workspace("cpu")
    for _ in range(3):
        out = render_gaussians(*arrays, camera, settings, released)
        want = render_gaussians(*arrays, camera, settings, kept)
        np.testing.assert_array_equal(out.color.numpy(), want.color.numpy())
        released.release([out._frame])
        assert allocator.live == 0
        del out, want


@pytest.mark.parametrize("moving", [False, True])
@pytest.mark.parametrize("count", [1, 2])
def test_emulated_graph_replays_follow_released_buffers(rng, monkeypatch, moving, count):
    """Warp API with graphs emulated on the CPU (test_graph_keys): renders of ``count``
    cameras and their backwards into fixed outputs (all of them given, as the torch
    bridge gives them), cotangents and gradients, the frames handed back after each
    backward. Replays run only where every buffer came back at its address (a caching
    allocator) and equal kernel-by-kernel launches on a keeping workspace; with a moving
    allocator nothing stale replays (its old buffers are NaN)."""
    from arc_warp import Camera, GaussianGrads, RenderSettings, Workspace, render_gaussians
    from arc_warp._src.splat.render import backwards_checked
    from arc_warp._src.splat.workspace import Frame
    from test_graph_keys import DTYPES, NAMES, _emulate

    scene = random_scene(rng, n=60, width=32, height=24, sh_degree=1)
    cameras = [Camera(scene.fx, scene.fy, scene.cx + 3.0 * i, scene.cy, scene.width, scene.height,
                      world_to_camera=scene.world_to_camera) for i in range(count)]
    h, w = scene.height, scene.width
    cots = [(wp.array(rng.normal(size=(h, w, 3)), dtype=wp.vec3, device="cpu"), None, None, None) for _ in cameras]

    def loop(ws):
        arrays = [wp.array(getattr(scene, k), dtype=dt, device="cpu") for k, dt in zip(NAMES, DTYPES)]
        outputs = [{"color": wp.zeros((h, w), dtype=wp.vec3, device="cpu"),
                    **{k: wp.zeros((h, w), dtype=float, device="cpu") for k in ("alpha", "depth", "expected_depth")},
                    "means2d": wp.zeros(scene.means.shape[0], dtype=wp.vec2, device="cpu"),
                    "radii": wp.zeros(scene.means.shape[0], dtype=wp.vec2i, device="cpu")} for _ in cameras]
        grads = GaussianGrads(*(wp.zeros_like(a) for a in arrays))
        results = []
        for _ in range(8):
            arrays[0].assign(arrays[0].numpy() + np.float32(0.01))  # new values, same pointers
            outs = render_gaussians(*arrays, cameras, RenderSettings(sh_degree=1, reduce="atomic"), ws,
                                    outputs=outputs)
            backwards_checked(outs, cots, grads, False, [None] * len(outs))
            # every frame used (replayed or not) has its memory back
            assert not any(o._frame._released for o in outs)
            results.append([o["color"].numpy().copy() for o in outputs] + [getattr(grads, k).numpy().copy()
                                                                            for k in NAMES])
            if ws.allocator is not None:
                ws.release([o._frame for o in outs])
            del outs
        return results

    keep = Workspace("cpu")
    want = loop(keep)
    replays = []
    repeats = _emulate(monkeypatch)
    allocator = PoisoningAllocator(moving)
    monkeypatch.setattr(Frame, "replay", _capturing_replay(replays, allocator))
    released = Workspace("cpu", allocator=allocator)
    released.graphs = True
    got = loop(released)
    for step, (g, w_) in enumerate(zip(got, want)):
        for i, (a, b) in enumerate(zip(g, w_)):
            np.testing.assert_array_equal(a, b, err_msg=f"step {step}, result {i}")
    if moving:
        assert not repeats.count(True), repeats
    else:
        # renders repeated from their plans (a forward replay) and backwards replayed; how
        # often depends on which block each frame gets back first (numpy's addresses)
        assert repeats.count(True) >= 1 and replays.count("backward") >= 1, (replays, repeats)
        assert replays.count("capture") >= 2, replays


def _capturing_replay(replays, allocator):
    """``Frame.replay`` emulated as on CUDA: a key's first call runs ``queue()``, its
    second runs it as the capture run does and keeps it, later calls re-run the kept one
    (a graph replays the captured work, pointers baked in). Captures and replays run with
    the allocator refusing: a CUDA capture would break on an allocation, and a graph
    replay cannot make one. ``replays`` gets "capture" or each replay's kind."""

    def replay(frame, key, queue):
        workspace = frame._workspace
        if key is None or not workspace.graphs:
            return queue()
        key = (key, workspace.allocations)
        entry = frame._graphs.get(key)
        if entry is not None:
            replays.append(key[0][0])
            return entry[0]()
        if key not in frame._seen:
            result = queue()
            if workspace.allocations == key[1]:
                frame._seen[key] = None
            return result
        replays.append("capture")
        result = unallocating(queue)()
        frame._graphs[key] = (unallocating(queue), result)
        return result

    def unallocating(queue):
        def run():
            allocator.forbid = True
            try:
                return queue()
            finally:
                allocator.forbid = False
        return run

    return replay


def test_mesh_state_in_the_shared_frame_survives_a_release(rng):
    """The mesh rasteriser leaves its depth keys cleared in the shared frame for the next
    call; a splat render's release hands back only the render scratch, so a mesh
    rasterised on the same workspace after it matches a fresh call."""
    import arc_warp.mesh as mesh
    from arc_warp import RenderSettings, Workspace, render_gaussians
    from mesh_scenes import random_mesh, wa

    _, camera, arrays = _warp_scene(rng, 30, 24, 20)
    pos, tri = random_mesh(rng, batch=1, n_tri=8, spread=0.5)
    allocator = PoisoningAllocator()
    ws = Workspace("cpu", allocator=allocator)
    want = mesh.rasterize(wa(pos), wa(tri, wp.int32), (20, 24))[0].numpy()
    assert (want[..., 3] > 0).any()
    for _ in range(3):
        got = mesh.rasterize(wa(pos), wa(tri, wp.int32), (20, 24), workspace=ws)[0].numpy()
        np.testing.assert_array_equal(got, want)
        out = render_gaussians(*arrays, camera, RenderSettings(reduce="atomic"), ws)
        ws.release([out._frame])
        del out


@pytest.mark.gpu
@pytest.mark.skipif(not wp.is_cuda_available(), reason="needs a CUDA device")
def test_cuda_training_loop_with_release_matches_keeping(rng):
    """CUDA, torch's allocator, graphs and deferred checks: a loop on a releasing context
    gives a keeping context's images and gradients (atomics add in another order) and
    hands its memory back after each backward. (Whether torch gives the same addresses
    back, so that graphs replay, depends on what else the loop allocates: not asserted.)"""
    scene = random_scene(rng, n=400, width=64, height=48, sh_degree=1)
    vm, ks = _views(scene, 2, "cuda")
    weights = torch.tensor(rng.normal(size=(2, scene.height, scene.width, 3)), dtype=torch.float32, device="cuda")
    results = {}
    for name, release in (("keep", False), ("release", True)):
        context = RenderContext("cuda", release_workspace=release)
        p = params_of(scene, device="cuda")
        got = []
        for _ in range(8):
            got.append(_step(p, scene, vm, ks, context, weights))
            if release:
                assert not [b for b in context.workspace.memory_report() if b.name != "host_flags"]
        results[name] = got
    for (img_k, g_k), (img_r, g_r) in zip(results["keep"], results["release"]):
        torch.testing.assert_close(img_r, img_k, rtol=0, atol=0)
        for k in g_k:
            torch.testing.assert_close(g_r[k], g_k[k], rtol=1e-5, atol=1e-5 * g_k[k].abs().max().item(), msg=k)
