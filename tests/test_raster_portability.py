"""The rasteriser and ARC kernels off the beaten path: concurrent CPU renders from
several Python threads, and CUDA code generated for an older GPU generation (sm_75)."""

import threading

import numpy as np
import pytest
import warp as wp

from arc_warp import RenderSettings, render_gaussians, render_gaussians_backward
from test_splat_pipeline import cotangents, random_scene


def _render_grads(arrays, cam, cots, reduce):
    out = render_gaussians(*arrays, cam, RenderSettings(reduce=reduce, background=(0.2, 0.3, 0.1)))
    grads = render_gaussians_backward(out, *cots)
    return [out.color.numpy()] + [g.numpy() for g in vars(grads).values()]


@pytest.mark.parametrize("reduce", ["arc", "deterministic"])
def test_concurrent_cpu_renders_match_a_lone_render(rng, reduce):
    # The CPU batch and warp-exchange buffers were C statics shared by every OS thread:
    # two renders at once read each other's splats. Blocks on, so the emulated 256-lane
    # blocks use those buffers; 48x32 = six tiles keeps a pass short.
    old = wp.config.enable_cpu_blocks
    wp.config.enable_cpu_blocks = True
    try:
        scenes = [random_scene(rng, 60, 48, 32, "cpu") for _ in range(2)]
        cots = [cotangents(rng, 48, 32, "cpu") for _ in range(2)]
        want = [_render_grads(a, c, t, reduce) for (a, c), t in zip(scenes, cots)]  # also compiles
        errors = []

        def worker(k):
            try:
                for _ in range(6):
                    got = _render_grads(*scenes[k], cots[k], reduce)
                    for w, g in zip(want[k], got):
                        np.testing.assert_array_equal(g, w)
            except AssertionError as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        wp.config.enable_cpu_blocks = old
    assert not errors, errors[0]
