"""Device memory of a render and its backward: what a RenderState keeps for the backward
and what a call's scratch takes, held to a stated budget per Gaussian, pixel and sort
entry (so a buffer added back, a per-Gaussian scratch array or headroom on the sort,
fails here); cotangents not given cost nothing and equal zero images; the torch bridge
frees what only the backward read once it has run."""

import numpy as np
import pytest
import warp as wp

from arc_warp import (Camera, GaussianGrads, GaussianRenderer, ImageGrads, RenderImages, RenderSettings,
                      check_gaussians, render_gaussians, render_gaussians_backward)
from arc_warp._src.splat.renderer import ALIGN
from conftest import random_scene

# Bytes a RenderState keeps per camera, for the backward: per Gaussian the projected
# splats (32) and SH colours (12); per pixel the final transmittance and last contributor
# (8); per sorted entry the Gaussian ids, twice the capacity (the radix sort's room).
STATE_PER_GAUSSIAN, STATE_PER_PIXEL, STATE_PER_SORT_ENTRY = 32 + 12, 8, 2 * 4
# A forward's scratch per Gaussian: tile counts (4), depth order (8: the sort's room), scan
# (8); then keys, shared by the depth sort (8 per Gaussian) and the tile sort (8 per entry).
FORWARD_PER_GAUSSIAN, KEYS_PER_ENTRY = 4 + 8 + 8, 2 * 4
# A backward's scratch per Gaussian: the packed rasteriser gradient (40) and the SH
# stage's share of dL/dmeans (12).
BACKWARD_PER_GAUSSIAN = 40 + 12


def _arrays(scene):
    return (wp.array(scene.means, dtype=wp.vec3), wp.array(scene.quats, dtype=wp.vec4),
            wp.array(scene.scales, dtype=wp.vec3), wp.array(scene.opacities, dtype=wp.float32),
            wp.array(scene.colors, dtype=wp.vec3))


def _camera(scene):
    return Camera(scene.fx, scene.fy, scene.cx, scene.cy, scene.width, scene.height,
                  world_to_camera=scene.world_to_camera)


def test_state_and_scratch_within_budget(rng):
    scene = random_scene(rng, n=12000, width=128, height=96, sh_degree=3, size_px_range=(0.3, 1.5))
    n, h, w = 12000, scene.height, scene.width
    g = check_gaussians(*_arrays(scene))
    renderer = GaussianRenderer(w, h, n, 1, g.sh_coeffs)
    state = renderer.new_state()
    images = RenderImages(wp.empty((1, h, w), dtype=wp.vec3), *(wp.empty((1, h, w)) for _ in range(3)),
                          wp.empty((1, n), dtype=wp.vec2), wp.empty((1, n), dtype=wp.vec2i))
    renderer.forward(g, [_camera(scene)], state, images)
    renderer.backward(state, [ImageGrads(wp.ones((h, w), dtype=wp.vec3))],
                      GaussianGrads(*(wp.empty_like(a) for a in g.arrays)))
    cap = renderer.capacity
    gaps = 16 * ALIGN  # every part's alignment
    held = sum(o.capacity for o in state.owners)
    assert held <= STATE_PER_GAUSSIAN * n + STATE_PER_PIXEL * h * w + STATE_PER_SORT_ENTRY * cap + 8 * 256 + gaps
    forward = renderer._forward_scratch.owner.capacity
    assert forward <= FORWARD_PER_GAUSSIAN * n + KEYS_PER_ENTRY * max(n, cap) + gaps
    assert renderer._backward_scratch.owner.capacity <= BACKWARD_PER_GAUSSIAN * n + gaps


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


def test_torch_backward_drops_what_only_the_backward_needed(rng):
    """The radii returned are the caller's alone (the render node saves an alias of their
    memory, with the projected means' and its state's, which its backward reads). After a
    backward without retain_graph torch has freed them (so the optimizer step that follows
    does not hold them), while the loss (and so the node) is still alive; with
    retain_graph it keeps them for a second backward, which then gives the same
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
    assert len(node.saved_tensors) == 8  # a second backward may still run: inputs, radii, state (2)
    first = means.grad.clone()
    means.grad = None
    loss.backward()
    np.testing.assert_array_equal(means.grad.numpy(), first.numpy())
    gc.collect()
    assert loss.grad_fn is not None  # the graph's nodes are alive, their saved tensors freed
    with pytest.raises(RuntimeError, match="freed"):
        node.saved_tensors


def test_torch_dropped_means2d_is_not_held_nor_its_gradient_made(rng):
    """`meta["means2d"]` is held by nobody but the caller: dropped before the backward, it
    dies while the loss lives, and the backward makes no gradient for it (the means'
    gradient is a buffer of its own), with the same means gradient, bit for bit, as
    when it is kept. Kept, its .grad gets dL/dmeans2d, added to on a second backward."""
    import gc
    import weakref

    render, context, means = _torch_renderer(random_scene(rng, n=300, width=32, height=24, sh_degree=0))
    img, _, meta = render()
    kept = meta["means2d"]
    img.sum().backward(retain_graph=True)
    want, first = means.grad.clone(), kept.grad.clone()
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
    assert means.grad.untyped_storage().nbytes() == means.numel() * 4  # a buffer of its own
