"""Renders captured into a caller's CUDA graph (`arc_warp_torch.capture_step` inside
`torch.cuda.graph`): while a capture records them, the renderers leave their checks for
`check()` after the replays, read earlier renders' status without a wait, and refuse what
would wait; an overflow in a replay is a device flag the captured optimizer step reads.

The CPU tests enter `capture_step`'s renderer mode without a CUDA capture (the renders run
at once); the real capture runs on the GPU (``-m gpu``)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="arc_warp_torch needs torch")

import arc_warp._src.splat.renderer as renderer_module  # noqa: E402
from arc_warp_torch import RenderContext, SparseGaussianAdam, capture_step, rasterization  # noqa: E402
from conftest import random_scene  # noqa: E402
from test_torch_plugin import PARAMS, cameras_of, params_of  # noqa: E402


def _setup(rng, device, n=60, size_px_range=(0.3, 1.5)):
    scene = random_scene(rng, n=n, width=48, height=40, sh_degree=1, size_px_range=size_px_range)
    p = params_of(scene, device=device)
    vm, ks = cameras_of(scene, device=device)
    weights = torch.tensor(rng.normal(size=(1, scene.height, scene.width, 3)), dtype=torch.float32, device=device)

    def step(context, optimizer=None):
        """Render, a loss linear in the images, its backward (and an optimizer step that
        skips on the render's status); the images and gradients."""
        colors, alphas, meta = rasterization(*(p[k] for k in PARAMS), vm, ks, scene.width, scene.height,
                                             context=context)
        ((colors * weights).sum() + alphas.sum()).backward()
        grads = {k: p[k].grad.clone() for k in PARAMS}
        if optimizer is not None:
            optimizer.step(skip=meta["status"])
        for k in PARAMS:
            p[k].grad = None
        return colors.detach().clone(), grads

    def forward(context):
        """The render alone (its checks stay on the device: no backward runs)."""
        return rasterization(*(p[k] for k in PARAMS), vm, ks, scene.width, scene.height, context=context)[0]

    step.forward = forward
    return p, step


def test_capture_step_needs_a_cuda_context_inside_a_capture():
    with pytest.raises(ValueError, match="CUDA RenderContext"):
        capture_step(RenderContext("cpu"))


def test_a_capturing_renderer_leaves_its_checks_and_reads_earlier_ones_without_a_wait(rng, monkeypatch):
    """The capture mode capture_step puts a context's renderers in, on the CPU: renders
    leave their status to the caller, a status left from before is read without waiting,
    and check()'s reading reports a replay's overflow."""
    monkeypatch.setattr(renderer_module, "SORT_SLACK", 0)  # a tiny scene overflows the 25% headroom
    p, step = _setup(rng, "cpu", size_px_range=(0.3, 1.0))
    context = RenderContext("cpu", check=False)
    step(context)
    renderer = context.workspace.renderers()[0]
    assert renderer._pending is not None  # left for the next render
    renderer.capturing = True
    pending = renderer._pending
    waited = []
    monkeypatch.setattr(renderer_module.wp, "synchronize_event", lambda e: waited.append(e))
    step(context)
    assert pending.is_read and waited == []
    renderer.host_status(renderer._pending.capacity).check()  # what check() reads after a replay
    with torch.no_grad():
        p["scales"] *= 6.0
    step(context)
    with pytest.raises(RuntimeError, match="left out of their images"):
        renderer.host_status(renderer._pending.capacity).check("captured render")
    renderer.capturing = False


def _warm_up_on_a_side_stream(*calls):
    """Runs ``calls`` on a side stream, as torch's CUDA graph notes advise before a capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_step_captured_in_torch_cuda_graph_replays_as_eager_renders(monkeypatch):
    """A forward + backward captured with torch.cuda.graph, replayed after the parameters
    change in place, gives an eager render's images and gradients; an overflow in a
    replay is reported by check(); the context still renders outside the graph."""
    monkeypatch.setattr(renderer_module, "SORT_SLACK", 0)  # the small scene overflows the 25% headroom
    rng = np.random.default_rng(7)
    p, step = _setup(rng, "cuda", n=400)
    context = RenderContext("cuda")
    _warm_up_on_a_side_stream(*[lambda: step(context)] * 3)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), capture_step(context) as captured:
        images, grads = step(context)  # static outputs: clones made inside the graph
    with torch.no_grad():
        for k in PARAMS:
            p[k] += 0.01 * torch.randn_like(p[k]) * p[k].abs().mean()
    graph.replay()
    captured.check()
    want_images, want = step(RenderContext("cuda", check=True))
    torch.testing.assert_close(images, want_images, rtol=1e-5, atol=1e-5)
    for k in want:
        torch.testing.assert_close(grads[k], want[k], rtol=1e-4, atol=1e-4 * want[k].abs().max().item(), msg=k)

    with torch.no_grad():
        p["scales"] *= 8.0
    graph.replay()
    with pytest.raises(RuntimeError, match="left out of their images"):
        captured.check()
    with torch.no_grad():
        p["scales"] /= 8.0
    step(context)  # the context renders outside the graph too


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_forward_captured_after_forward_only_warm_ups_replays_as_an_eager_render():
    """Warm-up renders without a backward leave their status unread; capture_step reads it
    inside torch.cuda.graph without waiting (which would invalidate the capture), and the
    captured forward replays as an eager render of the changed parameters."""
    rng = np.random.default_rng(9)
    p, step = _setup(rng, "cuda", n=400)
    context = RenderContext("cuda")
    _warm_up_on_a_side_stream(lambda: step(context), *[lambda: step.forward(context)] * 2)
    assert any(r._pending is not None for r in context.workspace.renderers())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), capture_step(context) as captured:
        image = step.forward(context)
    with torch.no_grad():
        for k in PARAMS:
            p[k] += 0.01 * torch.randn_like(p[k]) * p[k].abs().mean()
    graph.replay()
    captured.check()
    want, _ = step(RenderContext("cuda", check=True))
    torch.testing.assert_close(image.detach(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("optimizer_kind", ["torch_adam", "sparse_gaussian_adam"])
def test_a_captured_training_step_with_capturable_adam_lowers_the_loss(optimizer_kind):
    rng = np.random.default_rng(8)
    scene = random_scene(rng, n=300, width=64, height=48, sh_degree=1)
    p = params_of(scene, device="cuda")
    vm, ks = cameras_of(scene, device="cuda")
    target = torch.rand(1, scene.height, scene.width, 3, device="cuda")
    context = RenderContext("cuda")
    if optimizer_kind == "torch_adam":
        optimizer = torch.optim.Adam([p[k] for k in PARAMS], lr=1e-2, capturable=True)
    else:
        optimizer = SparseGaussianAdam([p[k] for k in PARAMS], lr=1e-2, eps=1e-8, bias_correction=True,
                                       capturable=True, context=context)

    def train_step():
        colors, _, meta = rasterization(*(p[k] for k in PARAMS), vm, ks, scene.width, scene.height, context=context)
        loss = (colors - target).abs().mean()
        loss.backward()
        optimizer.step() if optimizer_kind == "torch_adam" else optimizer.step(skip=meta["status"])
        return loss

    losses = []

    def warm_up():
        optimizer.zero_grad(set_to_none=True)
        losses.append(train_step().item())

    _warm_up_on_a_side_stream(*[warm_up] * 3)
    first = losses[-1]
    optimizer.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), capture_step(context) as captured:
        loss = train_step()
    for _ in range(50):
        graph.replay()
    captured.check()
    assert loss.item() < 0.9 * first


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")  # the capture that raises records nothing
def test_a_captured_sparse_gaussian_adam_step_counts_each_replay(sparse):
    """SparseGaussianAdam(capturable=True) captured alone and replayed five times makes
    the five steps of the same optimizer run eagerly with host step counts (the bias
    corrections advance with each replay); with host counts, capturing it raises."""
    gen = torch.Generator("cuda").manual_seed(3)
    shapes = [(500, 3), (500, 4), (500,), (500, 16, 3)]
    params = [torch.randn(s, device="cuda", generator=gen).requires_grad_(True) for s in shapes]
    grads = [torch.randn(s, device="cuda", generator=gen) for s in shapes]
    visible = torch.rand(500, device="cuda", generator=gen) < 0.6 if sparse else None
    twins = [q.detach().clone().requires_grad_(True) for q in params]
    captured = SparseGaussianAdam(params, lr=1e-2, eps=1e-8, bias_correction=True, capturable=True)
    eager = SparseGaussianAdam(twins, lr=1e-2, eps=1e-8, bias_correction=True)
    for q, t, g in zip(params, twins, grads):
        q.grad, t.grad = g, g.clone()  # the same gradient every step; the graph reads q.grad's memory

    def step(optimizer):
        optimizer.step(visible, 500) if sparse else optimizer.step()

    _warm_up_on_a_side_stream(lambda: step(captured))  # the state, and the kernel's module, before the capture
    step(eager)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(captured)
    for _ in range(5):
        graph.replay()
        step(eager)
    torch.cuda.synchronize()
    for k, (q, t) in enumerate(zip(params, twins)):
        # float32 bias corrections on the device against float64 on the host
        torch.testing.assert_close(q, t, rtol=2e-6, atol=5e-6, msg=f"parameter {k}")
        assert float(captured.state[q]["step"]) == 6
    with pytest.raises(RuntimeError, match="capturable=True"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            step(eager)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_replay_that_overflowed_skips_the_captured_optimizer_step(monkeypatch):
    """The captured SparseGaussianAdam reads the render's status inside the graph: a replay
    whose render overflowed its captured sort leaves the parameters and counts as they
    were (GradScaler's rule), and the next one that fits steps again."""
    monkeypatch.setattr(renderer_module, "SORT_SLACK", 0)
    rng = np.random.default_rng(11)
    p, step = _setup(rng, "cuda", n=400)
    context = RenderContext("cuda")
    optimizer = SparseGaussianAdam([p[k] for k in PARAMS], lr=1e-3, eps=1e-8, capturable=True, context=context)
    _warm_up_on_a_side_stream(*[lambda: step(context, optimizer)] * 3)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), capture_step(context) as captured:
        step(context, optimizer)
    with torch.no_grad():
        p["scales"] *= 8.0
    before = {k: p[k].detach().clone() for k in PARAMS}
    count = float(optimizer.state[p["means"]]["step"])
    graph.replay()
    with pytest.raises(RuntimeError, match="left out of their images"):
        captured.check()
    for k in PARAMS:
        torch.testing.assert_close(p[k].detach(), before[k], rtol=0, atol=0, msg=k)
    assert float(optimizer.state[p["means"]]["step"]) == count
    with torch.no_grad():
        p["scales"] /= 8.0
    graph.replay()
    captured.check()
    assert float(optimizer.state[p["means"]]["step"]) == count + 1
