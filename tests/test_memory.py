"""Device memory a workspace keeps for a render + backward (Issue 11: peak memory per Gaussian).

``Workspace.memory_report`` lists every buffer; these tests hold the bytes that scale with
the number of Gaussians, and those that scale with the intersections, to a stated budget,
so a buffer added back (a per-Gaussian scratch array, headroom on the sort) fails here.
"""

import numpy as np
import pytest
import warp as wp

from arc_warp import Camera, GaussianGrads, RenderSettings, Workspace, render_gaussians, render_gaussians_backward
from arc_warp._src.splat.bin_ops import forward_scratch_bytes
from conftest import random_scene

# Bytes per Gaussian a workspace keeps for an SH render and its backward, with the outputs
# and the gradients (2D means' included) given by the caller (as the torch bridge does):
# the render frame's splats (32) and colours (12), and the shared scratch arena, whose
# largest stage here is the backward's packed rasteriser gradient (40; the SH stage's
# share of dL/dmeans goes into the mean gradient, which this backward writes); the
# forward's depth sort (28), whose keys the tile sort's take over, fits in it. Plus at
# most 4 alignment gaps.
BUDGET_PER_GAUSSIAN = 32 + 12 + 40
# Bytes per Gaussian of the backward's stage of the scratch arena: the packed rasteriser
# gradient, and beside it the SH share of dL/dmeans where the backward adds into the mean
# gradient (a backward that writes it holds the share there)
BACKWARD_STAGE = {"written": 40, "added": 40 + 12}
# Bytes per sorted entry: int32 Gaussian ids, twice the kept sort size (the radix sort's
# room), with no headroom past the kept size's own (the keys are scratch).
BYTES_PER_SORT_ENTRY = 2 * 4
SORT_BUFFERS = ("sort_ids",)


def _small_splats(rng):
    """A scene of small splats (a kept sort size of about 2.3 entries per Gaussian, as
    bench_train_step's 1M scene's), whose forward's stage of the scratch arena fits in the
    backward's."""
    return random_scene(rng, n=12000, width=128, height=96, sh_degree=3, size_px_range=(0.3, 1.5))


def _arrays(scene):
    return [wp.array(x, dtype=t, device="cpu") for x, t in
            ((scene.means, wp.vec3), (scene.quats, wp.vec4), (scene.scales, wp.vec3),
             (scene.opacities, wp.float32), (scene.colors, wp.vec3))]


def _camera(scene):
    return Camera(scene.fx, scene.fy, scene.cx, scene.cy, scene.width, scene.height,
                  world_to_camera=scene.world_to_camera)


def _step(scene, camera, settings, ws):
    """One render + backward into caller-owned outputs and gradients."""
    n, shape = scene.means.shape[0], (scene.height, scene.width)
    arrays = _arrays(scene)
    outputs = {"color": wp.empty(shape, wp.vec3), "alpha": wp.empty(shape, wp.float32),
               "depth": wp.empty(shape, wp.float32), "expected_depth": wp.empty(shape, wp.float32),
               "means2d": wp.empty(n, wp.vec2), "radii": wp.empty(n, wp.vec2i)}
    grads = GaussianGrads(*(wp.empty(a.shape, a.dtype) for a in arrays))
    out = render_gaussians(*arrays, camera, settings, ws, outputs)
    render_gaussians_backward(out, wp.ones(shape, wp.vec3), grads=grads, accumulate=False,
                              means2d_grad=wp.empty(n, wp.vec2))
    return out


def test_workspace_bytes_per_gaussian_within_budget(rng):
    scene = _small_splats(rng)
    n = scene.means.shape[0]
    camera = _camera(scene)
    ws = Workspace("cpu")
    for _ in range(3):
        out = _step(scene, camera, RenderSettings(), ws)
        del out  # a training loop's output is gone before the next render: one frame
    report = ws.memory_report()
    assert {b.frame for b in report} == {0, 1}
    assert ws.nbytes() == sum(b.nbytes for b in report)
    per_gaussian = sum(b.nbytes for b in report if b.name == "scratch" or (b.shape[0] % n == 0 and len(b.shape) == 1))
    assert per_gaussian <= BUDGET_PER_GAUSSIAN * n + 4 * 256, (
        f"{per_gaussian / n:.1f} bytes per Gaussian, budget {BUDGET_PER_GAUSSIAN}: "
        + ", ".join(f"{b.name} {b.nbytes / n:.1f}" for b in report))
    kept = ws.sort_size(((scene.width + 15) // 16, (scene.height + 15) // 16))
    sort_bytes = sum(b.nbytes for b in report if b.name in SORT_BUFFERS)
    assert kept is not None and sort_bytes <= BYTES_PER_SORT_ENTRY * kept


@pytest.mark.parametrize("size_px", [(0.3, 2.0), (6.0, 16.0)])
def test_workspace_holds_no_sort_keys_zero_images_or_unused_means2d_grad(rng, size_px):
    """The tile sort's keys are scratch of the forward's stage (the arena grows past the
    backward's stage only when the keys need more: large splats), a missing cotangent
    costs no zero image, and a render whose backward is given its 2D-mean gradient buffer
    keeps none: after the first step, the shared frame holds the arena alone, the steps
    allocate nothing more, and the images match a one-off render's."""
    n = 400
    scene = random_scene(rng, n=n, width=64, height=48, sh_degree=3, size_px_range=size_px)
    camera = _camera(scene)
    ws = Workspace("cpu")
    counts = []
    for _ in range(3):
        out = _step(scene, camera, RenderSettings(), ws)
        counts.append(ws.allocations)
        image = out.color.numpy()
        del out
    assert counts[2] == counts[1] == counts[0]
    np.testing.assert_array_equal(image, render_gaussians(*_arrays(scene), camera).color.numpy())
    report = ws.memory_report()
    names = {(b.frame, b.name) for b in report}
    assert {name for frame, name in names if frame == 0} == {"scratch"}, names
    assert (1, "means2d_grad") not in names, names
    kept = ws.sort_size(((scene.width + 15) // 16, (scene.height + 15) // 16))
    backward = n * BACKWARD_STAGE["written"]
    arena = next(b.nbytes for b in report if b.name == "scratch")
    assert arena == max(backward, forward_scratch_bytes(n, kept))
    if size_px[0] > 1.0:
        assert forward_scratch_bytes(n, kept) > backward  # the keys grew the arena


@pytest.mark.parametrize("accumulate", [False, True])
def test_backward_stage_holds_sh_share_only_when_adding(rng, accumulate):
    """A backward that writes dL/dmeans holds the SH stage's share of it in the mean
    gradient, not in the shared arena beside the rasteriser gradient (so the arena held
    with the caller's gradients is 12 bytes per Gaussian smaller); one that adds into
    dL/dmeans keeps the share in the arena, since the gradient holds earlier values."""
    scene = _small_splats(rng)
    n, camera, arrays, shape = scene.means.shape[0], _camera(scene), _arrays(scene), (scene.height, scene.width)
    ws = Workspace("cpu")
    grads = GaussianGrads(*(wp.zeros(a.shape, a.dtype) for a in arrays))
    for _ in range(2):
        out = render_gaussians(*arrays, camera, RenderSettings(), ws)
        render_gaussians_backward(out, wp.ones(shape, wp.vec3), grads=grads, accumulate=accumulate)
    kept = ws.sort_size(((scene.width + 15) // 16, (scene.height + 15) // 16))
    backward = n * BACKWARD_STAGE["added" if accumulate else "written"] + (256 if accumulate else 0)
    assert forward_scratch_bytes(n, kept) < n * BACKWARD_STAGE["written"]  # the backward's stage sizes the arena
    assert next(b.nbytes for b in ws.memory_report() if b.name == "scratch") == backward


def test_torch_backward_holds_no_sh_share_in_scratch(rng):
    """A one-camera torch backward writes its gradients (arc_warp_torch's gradient buffer),
    so its arena holds the rasteriser gradient alone."""
    scene = _small_splats(rng)
    n = scene.means.shape[0]
    render, context, _ = _torch_renderer(scene)
    for _ in range(2):
        render()[0].sum().backward()
    ws = context.workspace
    kept = ws.sort_size(((scene.width + 15) // 16, (scene.height + 15) // 16))
    assert forward_scratch_bytes(n, kept) < n * BACKWARD_STAGE["written"]
    assert next(b.nbytes for b in ws.memory_report() if b.name == "scratch") == n * BACKWARD_STAGE["written"]


@pytest.mark.parametrize("reduce,absgrad", [("arc", True), ("atomic", False), ("deterministic", True)])
def test_missing_cotangents_equal_zero_images(rng, reduce, absgrad):
    """A cotangent given as None (skipped by the rasteriser backward) gives the gradients
    of a zero image, bit for bit."""
    scene = random_scene(rng, n=60, width=24, height=20, sh_degree=1)
    arrays = _arrays(scene)
    shape = (scene.height, scene.width)
    given = [wp.array(rng.normal(size=(*shape, 3)), dtype=wp.vec3, device="cpu"),
             *(wp.array(rng.normal(size=shape), dtype=wp.float32, device="cpu") for _ in range(3))]
    zeros = [wp.zeros_like(g) for g in given]
    settings = RenderSettings(reduce=reduce, absgrad=absgrad)
    for missing in ((1, 3), (0, 2), (0, 1, 2, 3)):
        results = []
        for absent in ([None] * 4, zeros):
            cots = [absent[i] if i in missing else g for i, g in enumerate(given)]
            out = render_gaussians(*arrays, _camera(scene), settings)
            grads = render_gaussians_backward(out, *cots)
            results.append([g.numpy() for g in vars(grads).values()]
                           + [out.means2d_grad.numpy(), out.means2d_absgrad.numpy() if absgrad else None])
        for got, want in zip(*results):
            np.testing.assert_array_equal(got, want)


def _torch_renderer(scene):
    """``render()`` -> rasterization's (image, alphas, meta) of ``scene`` on the CPU through one
    RenderContext, with grad on the means; and that context."""
    torch = pytest.importorskip("torch")
    from arc_warp_torch import RenderContext, rasterization

    t = {k: torch.tensor(np.asarray(getattr(scene, k)), dtype=torch.float32)
         for k in ("means", "quats", "scales", "opacities", "colors")}
    t["means"].requires_grad_(True)
    viewmats = torch.tensor(scene.world_to_camera, dtype=torch.float32)[None]
    ks = torch.tensor([[[scene.fx, 0, scene.cx], [0, scene.fy, scene.cy], [0, 0, 1]]], dtype=torch.float32)
    context = RenderContext("cpu")

    def render():
        return rasterization(t["means"], t["quats"], t["scales"], t["opacities"], t["colors"], viewmats, ks,
                             scene.width, scene.height, context=context)

    return render, context, t["means"]


def test_torch_training_loop_holds_one_frame(rng):
    render, context, _ = _torch_renderer(random_scene(rng, n=500, width=40, height=32, sh_degree=1))
    img = None
    for _ in range(3):  # the previous image is still referenced while the next one renders
        img = render()[0]
        img.sum().backward()
    assert {b.frame for b in context.workspace.memory_report()} == {0, 1}


def test_torch_backward_drops_what_only_the_backward_needed(rng):
    """The radii returned are the caller's alone (the render node saves an alias of their
    memory, with the projected means', which its backward reads). After a backward without
    retain_graph the node holds neither those nor its outputs' frame (so the optimizer step
    that follows does not hold them), while the loss (and so the node) is still alive;
    with retain_graph it keeps them for a second backward, which then gives the same
    gradients."""
    import gc
    import weakref

    render_images, _, means = _torch_renderer(random_scene(rng, n=300, width=32, height=24, sh_degree=0))

    def render():
        img, _, meta = render_images()
        return img.sum(), weakref.ref(meta["radii"]), img.grad_fn

    loss, radii, node = render()
    gc.collect()
    assert radii() is None  # dropped by the caller
    loss.backward(retain_graph=True)
    gc.collect()
    assert node.outs is not None and len(node.saved_tensors) == 6  # a second backward may still run
    first = means.grad.clone()
    means.grad = None
    loss.backward()
    np.testing.assert_array_equal(means.grad.numpy(), first.numpy())
    gc.collect()
    assert loss.grad_fn is not None  # the graph's nodes are alive, their saved tensors freed
    assert node.outs is None
    with pytest.raises(RuntimeError, match="freed"):
        node.saved_tensors


def test_torch_dropped_means2d_is_not_held_nor_its_gradient_made(rng):
    """`meta["means2d"]` is held by nobody but the caller: dropped before the backward, it
    dies while the loss lives, and the backward makes no gradient for it (the means'
    gradient buffer holds the means' alone), with the same means gradient, bit for bit, as
    when it is kept. Kept, its .grad gets dL/dmeans2d, added to on a second backward."""
    import gc
    import weakref

    render, context, means = _torch_renderer(random_scene(rng, n=300, width=32, height=24, sh_degree=0))
    img, _, meta = render()
    kept = meta["means2d"]
    img.sum().backward(retain_graph=True)
    want, first = means.grad.clone(), kept.grad.clone()
    held = means.grad.untyped_storage().nbytes()  # the inputs' and means2d's gradients
    assert kept.grad.shape == kept.shape and first.abs().sum() > 0
    img.sum().backward()
    np.testing.assert_array_equal(kept.grad.numpy(), 2 * first.numpy())

    means.grad = None
    img, _, meta = render()
    loss = img.sum()
    dropped = weakref.ref(meta["means2d"])
    del meta
    gc.collect()
    assert dropped() is None and loss.grad_fn is not None
    loss.backward()
    np.testing.assert_array_equal(means.grad.numpy(), want.numpy())
    assert means.grad.untyped_storage().nbytes() == held - kept.numel() * 4  # none for means2d
    assert "means2d_grad" not in {b.name for b in context.workspace.memory_report()}  # nor in the workspace
