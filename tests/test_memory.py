"""Device memory a workspace keeps for a render + backward (Issue 11: peak memory per Gaussian).

``Workspace.memory_report`` lists every buffer; these tests hold the bytes that scale with
the number of Gaussians, and those that scale with the intersections, to a stated budget,
so a buffer added back (a per-Gaussian scratch array, headroom on the sort) fails here.
"""

import numpy as np
import pytest
import warp as wp

from arc_warp import Camera, GaussianGrads, RenderSettings, Workspace, render_gaussians, render_gaussians_backward
from conftest import random_scene

# Bytes per Gaussian a workspace keeps for an SH render and its backward, with the outputs
# and the gradients given by the caller (as the torch bridge does): the render frame's
# splats (32), colours (12) and 2D-mean gradient (8), and the shared scratch arena, whose
# largest stage is the backward's packed rasteriser gradient (40) and SH share of
# dL/dmeans (12); the forward's depth sort (28) fits in it. Plus at most 4 alignment gaps.
BUDGET_PER_GAUSSIAN = 32 + 12 + 8 + 40 + 12
# Bytes per sorted entry: int32 keys and Gaussian ids, twice the kept sort size each (the
# radix sort's room), with no headroom past the kept size's own.
BYTES_PER_SORT_ENTRY = 2 * 2 * 4
SORT_BUFFERS = ("sort_keys", "sort_ids")


def _step(scene, camera, settings, ws):
    """One render + backward into caller-owned outputs and gradients."""
    n, shape = scene.means.shape[0], (scene.height, scene.width)
    arrays = [wp.array(x, dtype=t, device="cpu") for x, t in
              ((scene.means, wp.vec3), (scene.quats, wp.vec4), (scene.scales, wp.vec3),
               (scene.opacities, wp.float32), (scene.colors, wp.vec3))]
    outputs = {"color": wp.empty(shape, wp.vec3), "alpha": wp.empty(shape, wp.float32),
               "depth": wp.empty(shape, wp.float32), "expected_depth": wp.empty(shape, wp.float32),
               "means2d": wp.empty(n, wp.vec2), "radii": wp.empty(n, wp.vec2i)}
    grads = GaussianGrads(*(wp.empty(a.shape, a.dtype) for a in arrays))
    out = render_gaussians(*arrays, camera, settings, ws, outputs)
    render_gaussians_backward(out, wp.ones(shape, wp.vec3), grads=grads, accumulate=False,
                              means2d_grad=wp.empty(n, wp.vec2))
    return out


def test_workspace_bytes_per_gaussian_within_budget(rng):
    n = 3000
    scene = random_scene(rng, n=n, width=64, height=48, sh_degree=3)
    camera = Camera(scene.fx, scene.fy, scene.cx, scene.cy, scene.width, scene.height,
                    world_to_camera=scene.world_to_camera)
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


def test_torch_training_loop_holds_one_frame(rng):
    torch = pytest.importorskip("torch")
    from arc_warp_torch import RenderContext, rasterization

    scene = random_scene(rng, n=500, width=40, height=32, sh_degree=1)
    t = {k: torch.tensor(np.asarray(getattr(scene, k)), dtype=torch.float32)
         for k in ("means", "quats", "scales", "opacities", "colors")}
    means = t["means"].clone().requires_grad_(True)
    viewmats = torch.tensor(scene.world_to_camera, dtype=torch.float32)[None]
    ks = torch.tensor([[[scene.fx, 0, scene.cx], [0, scene.fy, scene.cy], [0, 0, 1]]], dtype=torch.float32)
    context = RenderContext("cpu")
    img = None
    for _ in range(3):  # the previous image is still referenced while the next one renders
        img = rasterization(means, t["quats"], t["scales"], t["opacities"], t["colors"], viewmats, ks,
                            scene.width, scene.height, context=context)[0]
        img.sum().backward()
    assert {b.frame for b in context.workspace.memory_report()} == {0, 1}
