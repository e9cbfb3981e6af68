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


def _nvrtc_archs() -> list:
    wp.init()
    return sorted(getattr(wp._src.context.runtime, "nvrtc_supported_archs", None) or [])


@pytest.mark.skipif(75 not in _nvrtc_archs(), reason="needs NVRTC with sm_75 (Warp's CUDA compiler)")
def test_kernels_compile_for_sm75(tmp_path):
    # NVRTC compiles without a GPU. sm_75 (Turing) has no __reduce_max_sync; sm_80 does.
    from arc_warp._src.arc.scatter_ops import _scatter_kernel
    from arc_warp._src.splat.raster_kernels import make_raster_bwd

    # raster_bwd takes a warp max (lockstep_max); serial and the scatter kernel match-any
    serial = make_raster_bwd("serial", True)
    builds = [(serial, 75), (make_raster_bwd("deterministic", False), 75), (_scatter_kernel(wp.vec3, "arc"), 75),
              (serial, 80)]
    for kernel, arch in builds:
        (path,) = wp.compile_aot_module(kernel.module, arch=arch, use_ptx=True, module_dir=tmp_path)
        ptx = path.read_text()
        assert f".target sm_{arch}" in ptx
        # the one-instruction warp max where it exists, a shuffle butterfly before
        assert ("redux.sync" in ptx) == (kernel is not builds[2][0] and arch >= 80), (kernel.key, arch)


@pytest.mark.gpu
@pytest.mark.skipif(not wp.is_cuda_available(), reason="needs a CUDA device")
def test_sm75_kernels_run_and_agree_with_the_default_build(tmp_path):
    import pathlib
    import subprocess
    import sys

    here = pathlib.Path(__file__).parent
    results = {}
    for arch in ("default", "75"):
        out, cache = tmp_path / f"{arch}.npz", tmp_path / f"cache_{arch}"
        subprocess.run([sys.executable, str(here / "arch_probe.py"), arch, str(out), str(cache)],
                       check=True, cwd=here, timeout=900)
        results[arch] = dict(np.load(out))
        if arch == "75":
            ptx = list(cache.rglob("*.sm75.ptx"))
            assert ptx and not any("redux.sync" in p.read_text() for p in ptx), "not built for sm_75"
    for key, want in results["default"].items():
        got = results["75"][key]
        # same sums, reordered by different code: float32 round-off of <= ~1e3 terms
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(want).max()), err_msg=key)
