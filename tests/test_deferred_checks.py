"""Deferred checks in the torch bridge (``RenderContext(defer_checks=True)``, the default on
CUDA): a render whose inputs require grad returns without waiting for the device, and its
checks run in its backward, once the backward is queued. Bad inputs still raise, and a
render that overflowed the kept sort size is rendered again exactly, its backward redone,
with a warning. Compared against contexts that check before returning."""

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="arc_warp_torch needs torch")

import arc_warp._src.splat.workspace as workspace_module  # noqa: E402
from arc_warp_torch import RenderContext, rasterization  # noqa: E402
from conftest import random_scene  # noqa: E402
from test_torch_plugin import PARAMS, cameras_of, params_of  # noqa: E402


def _views(scene, count, device):
    """``count`` views of ``scene`` (principal points apart) as [C, 4, 4] and [C, 3, 3]."""
    vm, ks = cameras_of(*[scene] * count, device=device)
    ks[:, 0, 2] += torch.arange(count, device=device, dtype=torch.float32) * 2.0
    return vm, ks


def _step(p, scene, vm, ks, context, weights):
    """Render, a loss linear in the images (so its cotangent does not depend on them), and
    its backward; returns the images (as held after the backward) and the gradients."""
    colors, alphas, meta = rasterization(p["means"], p["quats"], p["scales"], p["opacities"], p["colors"], vm, ks,
                                         scene.width, scene.height, context=context)
    loss = (colors * weights).sum() + alphas.sum()
    loss.backward()
    grads = {k: p[k].grad.clone() for k in PARAMS}
    grads["means2d"] = meta["means2d"].grad.clone()
    for k in PARAMS:
        p[k].grad = None
    return colors.detach().clone(), grads


@pytest.mark.parametrize("count", [1, 2])
def test_an_overflow_found_in_the_backward_is_rendered_and_differentiated_again(rng, device, monkeypatch, count):
    """Small splats first (the kept sort size follows their totals), then the same tensors
    grown in place so that the next render, queued with that size, overflows: its images
    after the backward and its gradients are those of a context that checks at once."""
    monkeypatch.setattr(workspace_module, "SORT_SLACK", 0)  # a tiny scene overflows the 25% headroom
    scene = random_scene(rng, n=60, width=48, height=40, sh_degree=1, size_px_range=(0.3, 1.0))
    p = params_of(scene, device=device)
    vm, ks = _views(scene, count, device)
    weights = torch.tensor(rng.normal(size=(count, scene.height, scene.width, 3)), dtype=torch.float32, device=device)
    deferred = RenderContext(device, defer_checks=True)
    for _ in range(3):  # the first reads its total back; the others use the kept size
        _step(p, scene, vm, ks, deferred, weights)
    with torch.no_grad():
        p["scales"] *= 6.0  # same memory: the next render repeats the kept size
    with pytest.warns(RuntimeWarning, match="overflowed"):
        images, grads = _step(p, scene, vm, ks, deferred, weights)
    assert not deferred.workspace.deferred

    checked = RenderContext(device, defer_checks=False)
    want_images, want = _step(p, scene, vm, ks, checked, weights)
    torch.testing.assert_close(images, want_images, rtol=0, atol=0)
    for k in want:  # atomics add in another order on a GPU
        torch.testing.assert_close(grads[k], want[k], rtol=1e-5, atol=1e-5 * want[k].abs().max().item(), msg=k)


def _overflow_found_in_a_backward(rng, device, monkeypatch, step):
    """``step(context, render, weights, p)`` (``render(context)``: rasterization's outputs for
    one camera of the parameters ``p``; ``weights``: the colours' loss weights) three times on
    a deferring context, whose kept sort size then follows small splats; then the splats
    grown in place, so that the fourth step, queued with that size, overflows (found in its
    backward, with a RuntimeWarning). Returns the fourth's result and that of a context
    that checks at once."""
    monkeypatch.setattr(workspace_module, "SORT_SLACK", 0)
    scene = random_scene(rng, n=60, width=48, height=40, sh_degree=1, size_px_range=(0.3, 1.0))
    p = params_of(scene, device=device)
    vm, ks = _views(scene, 1, device)
    weights = torch.tensor(rng.normal(size=(1, scene.height, scene.width, 3)), dtype=torch.float32, device=device)

    def render(context):
        return rasterization(*(p[k] for k in PARAMS), vm, ks, scene.width, scene.height, context=context)

    def run(context):
        result = step(context, render, weights, p)
        for k in PARAMS:
            p[k].grad = None
        return result

    deferred = RenderContext(device, defer_checks=True)
    for _ in range(3):
        run(deferred)
    with torch.no_grad():
        p["scales"] *= 6.0
    with pytest.warns(RuntimeWarning, match="overflowed"):
        got = run(deferred)
    return got, run(RenderContext(device, defer_checks=False))


def test_images_the_loss_dropped_are_freed_before_the_backward_and_an_overflow_still_redone(rng, device,
                                                                                          monkeypatch):
    """The render node does not hold its images (its backward does not read them): a loss
    that drops them frees them before the backward makes the gradients. An overflow found
    then is rendered again into the frame's own images, and the gradients are those of a
    context that checks at once."""
    import gc
    import weakref

    def step(context, render, weights, p):
        colors, alphas, meta = render(context)
        loss = (colors * weights).sum() + alphas.sum()
        node, memory = colors.grad_fn, colors.untyped_storage().data_ptr()
        assert all(t.untyped_storage().data_ptr() != memory for t in node.saved_tensors)
        image = weakref.ref(colors._base)  # the block the images are views of
        del colors, alphas, node
        gc.collect()
        assert image() is None  # freed before the backward
        loss.backward()
        return {k: p[k].grad.clone() for k in PARAMS}

    grads, want = _overflow_found_in_a_backward(rng, device, monkeypatch, step)
    for k in want:
        torch.testing.assert_close(grads[k], want[k], rtol=1e-5, atol=1e-5 * want[k].abs().max().item(), msg=k)


def test_an_alpha_image_kept_without_its_colours_gets_the_render_redone(rng, device, monkeypatch):
    """The alpha image shares the projected means' memory, which the backward keeps alive,
    not the colours': a loop that drops the colours but keeps the alphas through the
    backward, where an overflow is found, gets the render redone into those alphas (the
    colours into the frame's own images), equal to a context that checks at once."""
    def step(context, render, weights, p):
        colors, alphas, _ = render(context)
        loss = (colors * weights).sum() + alphas.sum()
        del colors
        loss.backward()
        return alphas.detach().clone()

    alphas, want = _overflow_found_in_a_backward(rng, device, monkeypatch, step)
    torch.testing.assert_close(alphas, want, rtol=0, atol=0)


def test_a_render_with_grad_defers_its_checks_to_its_backward(rng):
    """With ``defer_checks`` the forward of a render that will be differentiated, of the
    same tensors as the previous render, keeps its checks (one per camera) and its
    backward runs them; a render without grad, or of new tensors, runs its own."""
    scene = random_scene(rng, n=40, width=32, height=24, sh_degree=1)
    p = params_of(scene)
    vm, ks = _views(scene, 2, "cpu")
    context = RenderContext("cpu", defer_checks=True)
    weights = torch.ones(2, scene.height, scene.width, 3)
    _step(p, scene, vm, ks, context, weights)  # reads its total back: nothing to defer
    colors, alphas, _ = rasterization(*(p[k] for k in PARAMS), vm, ks, scene.width, scene.height, context=context)
    assert len(context.workspace.deferred) == 2
    (colors.sum() + alphas.sum()).backward()
    assert not context.workspace.deferred
    with torch.no_grad():
        rasterization(*(p[k] for k in PARAMS), vm, ks, scene.width, scene.height, context=context)
    assert not context.workspace.deferred
    # new tensors (a densification's): checked in the forward, whose totals may have jumped
    q = {k: p[k].detach().clone().requires_grad_(True) for k in PARAMS}
    colors, alphas, _ = rasterization(*(q[k] for k in PARAMS), vm, ks, scene.width, scene.height, context=context)
    assert not context.workspace.deferred
    colors, alphas, _ = rasterization(*(q[k] for k in PARAMS), vm, ks, scene.width, scene.height, context=context)
    assert len(context.workspace.deferred) == 2


def test_a_bad_input_raises_in_the_backward_or_the_next_render(rng):
    """A non-finite mean written in place after the sort size is kept: the deferred render
    returns, and its backward raises the forward's ValueError; without a backward, the next
    render raises it. A context that checks at once raises in the forward."""
    scene = random_scene(rng, n=40, width=32, height=24, sh_degree=1)
    vm, ks = cameras_of(scene)
    for defer in (True, False):
        p = params_of(scene)
        context = RenderContext("cpu", defer_checks=defer)
        _step(p, scene, vm, ks, context, torch.ones(1, scene.height, scene.width, 3))
        with torch.no_grad():
            p["means"][3, 1] = float("nan")
        args = [p[k] for k in PARAMS] + [vm, ks, scene.width, scene.height]
        if not defer:
            with pytest.raises(ValueError, match="non-finite"):
                rasterization(*args, context=context)
            continue
        colors, _, _ = rasterization(*args, context=context)
        with pytest.raises(ValueError, match="non-finite"):
            colors.sum().backward()
        colors, _, _ = rasterization(*args, context=context)  # never differentiated
        with torch.no_grad():
            p["means"][3, 1] = 0.0
        with pytest.raises(ValueError, match="non-finite.*an earlier render"):
            rasterization(*args, context=context)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            colors, _, _ = rasterization(*args, context=context)  # checked: nothing left over
            colors.sum().backward()
        assert np.isfinite(p["means"].grad.numpy()).all()
