"""Renders captured into a caller's CUDA graph (`arc_warp._src.splat.capture.CapturedRenders`,
`arc_warp_torch.capture_step`): while a capture records them, their checks wait for
`check()` after the replays instead of running in the backward, and a render that would
have to wait for the device raises before it queues anything.

On the CPU, `CapturedRenders` is entered without a CUDA capture around it: the renders
run at once, so its checks see what a replay would have left in the flags. The real
capture in ``torch.cuda.graph`` runs on the GPU (``-m gpu``)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="arc_warp_torch needs torch")

import arc_warp._src.splat.workspace as workspace_module  # noqa: E402
from arc_warp import Workspace  # noqa: E402
from arc_warp._src.splat.capture import CapturedRenders  # noqa: E402
from arc_warp_torch import RenderContext, SparseGaussianAdam, capture_step, rasterization  # noqa: E402
from conftest import random_scene  # noqa: E402
from test_torch_plugin import PARAMS, cameras_of, params_of  # noqa: E402


def _setup(rng, device, n=60, size_px_range=(0.3, 1.5)):
    scene = random_scene(rng, n=n, width=48, height=40, sh_degree=1, size_px_range=size_px_range)
    p = params_of(scene, device=device)
    vm, ks = cameras_of(scene, device=device)
    weights = torch.tensor(rng.normal(size=(1, scene.height, scene.width, 3)), dtype=torch.float32, device=device)

    def step(context):
        """Render, a loss linear in the images, its backward; the images and gradients."""
        colors, alphas, _ = rasterization(*(p[k] for k in PARAMS), vm, ks, scene.width, scene.height,
                                          context=context)
        ((colors * weights).sum() + alphas.sum()).backward()
        grads = {k: p[k].grad.clone() for k in PARAMS}
        for k in PARAMS:
            p[k].grad = None
        return colors.detach().clone(), grads

    def forward(context):
        """The render alone (its checks stay deferred: no backward runs)."""
        return rasterization(*(p[k] for k in PARAMS), vm, ks, scene.width, scene.height, context=context)[0]

    step.forward = forward
    return p, step


def _capturing_context(device):
    return RenderContext(device, graphs=False, release_workspace=False, defer_checks=True)


def _warm_up_on_a_side_stream(*calls):
    """Runs ``calls`` on a side stream, as torch's CUDA graph notes advise before a capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)


def _warmed_up_small_splats(rng, device, monkeypatch, steps):
    """(params, step, context) after ``steps`` warm-up steps of a scene whose intersections
    overflow the kept sort size once its scales grow (no constant slack)."""
    monkeypatch.setattr(workspace_module, "SORT_SLACK", 0)  # a tiny scene overflows the 25% headroom
    p, step = _setup(rng, device, size_px_range=(0.3, 1.0))
    context = _capturing_context(device)
    for _ in range(steps):
        step(context)
    return p, step, context


def test_captured_renders_keep_their_checks_for_after_the_replay(rng, device):
    """The captured step's images and gradients are a checked context's; its check waits
    in ``pending`` (not run, not left to the next render) and passes."""
    p, step = _setup(rng, device)
    context = _capturing_context(device)
    for _ in range(2):  # warm-up: the kept sort size, the buffers
        step(context)
    with CapturedRenders(context.workspace) as renders:
        images, grads = step(context)
    assert len(renders.pending) == 1 and not context.workspace.deferred
    renders.check()
    want_images, want = step(RenderContext(device, defer_checks=False))
    torch.testing.assert_close(images, want_images, rtol=0, atol=0)
    for k in want:
        torch.testing.assert_close(grads[k], want[k], rtol=1e-5, atol=1e-5 * want[k].abs().max().item(), msg=k)


def test_check_reports_a_replay_that_overflowed_its_captured_sort(rng, device, monkeypatch):
    """Splats grown in place after the warm-up overflow the kept sort size: the captured
    render is not redone (nothing may wait inside a capture), and check() says so."""
    p, step, context = _warmed_up_small_splats(rng, device, monkeypatch, 3)
    with torch.no_grad():
        p["scales"] *= 6.0
    with CapturedRenders(context.workspace) as renders:
        step(context)
    with pytest.raises(RuntimeError, match="left out of its images"):
        renders.check()


def test_check_reports_bad_inputs_of_a_replay(rng, device):
    p, step = _setup(rng, device)
    context = _capturing_context(device)
    for _ in range(2):
        step(context)
    with torch.no_grad():
        p["means"][3, 1] = float("nan")
    with CapturedRenders(context.workspace) as renders:
        step(context)
    with pytest.raises(ValueError, match="non-finite"):
        renders.check()


@pytest.mark.parametrize("case", ["clean", "non_finite", "overflow"])
def test_renders_left_unchecked_before_a_synchronised_capture_are_checked_without_a_wait(rng, device, monkeypatch,
                                                                                         case):
    """Forward-only renders before the capture (a warm-up of a captured forward) leave
    their checks deferred. Entered with ``synchronized=True`` (torch.cuda.graph syncs the
    device before its capture), CapturedRenders checks them without waiting for the
    device, which a capture forbids: bad inputs raise ValueError, and an overflow, which
    cannot be rendered again inside a capture, RuntimeError."""
    import warp as wp

    p, step, context = _warmed_up_small_splats(rng, device, monkeypatch, 2)
    with torch.no_grad():
        if case == "non_finite":
            p["means"][3, 1] = float("nan")
        elif case == "overflow":
            p["scales"] *= 6.0
    image = step.forward(context)
    assert context.workspace.deferred
    if device == "cuda":
        torch.cuda.synchronize()  # what torch.cuda.graph does before its capture begins

    def no_wait(event):
        raise AssertionError("waited for the device")

    monkeypatch.setattr(wp, "synchronize_event", no_wait)
    want = {"clean": None, "non_finite": (ValueError, "non-finite"), "overflow": (RuntimeError, "before the capture")}
    renders = CapturedRenders(context.workspace, synchronized=True)
    if want[case] is None:
        with renders:
            pass
    else:
        with pytest.raises(want[case][0], match=want[case][1]):
            renders.__enter__()
    assert not context.workspace.deferred and not context.workspace.capturing
    del image


def test_a_render_that_would_wait_raises_inside_a_capture(rng, device):
    """New tensors (their checks cannot be deferred), and the same tensors on an image size
    not rendered before (its sort size unknown), raise before anything is deferred."""
    p, step = _setup(rng, device)
    context = _capturing_context(device)
    with CapturedRenders(context.workspace), pytest.raises(RuntimeError, match="cannot wait for the device"):
        step(context)  # no warm-up
    assert not context.workspace.deferred and not context.workspace.capturing

    step(context)
    vm, ks = cameras_of(random_scene(rng, n=4, width=64, height=40), device=device)
    with CapturedRenders(context.workspace), pytest.raises(RuntimeError, match="not rendered before"):
        rasterization(*(p[k] for k in PARAMS), vm, ks, 64, 40, context=context)


def test_a_capture_that_allocated_raises_on_exit(rng, device):
    p, step = _setup(rng, device)
    context = _capturing_context(device)
    step(context)
    with pytest.raises(RuntimeError, match="allocated 1 buffer"):
        with CapturedRenders(context.workspace):
            context.workspace.allocations += 1  # what growing a buffer does


def test_workspaces_that_cannot_be_captured_are_refused():
    graphs = Workspace("cpu")
    graphs.graphs = True  # as on CUDA with graphs=True
    with pytest.raises(ValueError, match="graphs=False"):
        CapturedRenders(graphs)
    with pytest.raises(ValueError, match="release_workspace=False"):
        CapturedRenders(Workspace("cpu", allocator=lambda nbytes: (0, None)))
    with pytest.raises(ValueError, match="CUDA RenderContext"):
        capture_step(RenderContext("cpu"))


def test_a_context_held_by_a_captured_graph_refuses_other_renders(rng):
    p, step = _setup(rng, "cpu")
    context = _capturing_context("cpu")
    context.captured = object()  # what CapturedStep's exit sets
    with pytest.raises(RuntimeError, match="belongs to a captured CUDA graph"):
        step(context)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_step_captured_in_torch_cuda_graph_replays_as_eager_renders(monkeypatch):
    """A forward + backward captured with torch.cuda.graph, replayed after the parameters
    change in place, gives an eager render's images and gradients; an overflow in a
    replay is reported by check(); the context refuses other renders until release()."""
    monkeypatch.setattr(workspace_module, "SORT_SLACK", 0)  # the small scene overflows the 25% headroom
    rng = np.random.default_rng(7)
    p, step = _setup(rng, "cuda", n=400)
    context = _capturing_context("cuda")
    _warm_up_on_a_side_stream(*[lambda: step(context)] * 3)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), capture_step(context) as captured:
        images, grads = step(context)  # static outputs: clones made inside the graph
    with pytest.raises(RuntimeError, match="belongs to a captured CUDA graph"):
        step(context)
    with torch.no_grad():
        for k in PARAMS:
            p[k] += 0.01 * torch.randn_like(p[k]) * p[k].abs().mean()
    graph.replay()
    captured.check()
    want_images, want = step(RenderContext("cuda", defer_checks=False))
    torch.testing.assert_close(images, want_images, rtol=1e-5, atol=1e-5)
    for k in want:
        torch.testing.assert_close(grads[k], want[k], rtol=1e-4, atol=1e-4 * want[k].abs().max().item(), msg=k)

    with torch.no_grad():
        p["scales"] *= 8.0
    graph.replay()
    with pytest.raises(RuntimeError, match="left out of its images"):
        captured.check()
    captured.release()
    with torch.no_grad():
        p["scales"] /= 8.0
    step(context)  # the context renders again


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_forward_captured_after_forward_only_warm_ups_replays_as_an_eager_render():
    """Warm-up renders without a backward leave their checks deferred; capture_step checks
    them inside torch.cuda.graph without waiting (which would invalidate the capture), and
    the captured forward replays as an eager render of the changed parameters."""
    rng = np.random.default_rng(9)
    p, step = _setup(rng, "cuda", n=400)
    context = _capturing_context("cuda")
    _warm_up_on_a_side_stream(lambda: step(context), *[lambda: step.forward(context)] * 2)
    assert context.workspace.deferred
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), capture_step(context) as captured:
        image = step.forward(context)
    with torch.no_grad():
        for k in PARAMS:
            p[k] += 0.01 * torch.randn_like(p[k]) * p[k].abs().mean()
    graph.replay()
    captured.check()
    captured.release()
    want, _ = step(RenderContext("cuda", defer_checks=False))
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
    context = _capturing_context("cuda")
    if optimizer_kind == "torch_adam":
        optimizer = torch.optim.Adam([p[k] for k in PARAMS], lr=1e-2, capturable=True)
    else:
        optimizer = SparseGaussianAdam([p[k] for k in PARAMS], lr=1e-2, eps=1e-8, bias_correction=True,
                                       capturable=True, context=context)

    def train_step():
        colors = rasterization(*(p[k] for k in PARAMS), vm, ks, scene.width, scene.height, context=context)[0]
        loss = (colors - target).abs().mean()
        loss.backward()
        optimizer.step()
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
