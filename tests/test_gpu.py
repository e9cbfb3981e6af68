"""GPU checks: CUDA results against the CPU (skipped without a CUDA device).

Run on a machine with a GPU: ``pytest -q -m gpu``. The CPU side is the reference the
rest of the suite validates against the dense float64 implementation.
"""

import numpy as np
import pytest
import warp as wp

import arc_warp

wp.config.log_level = wp.LOG_WARNING
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not wp.is_cuda_available(), reason="needs a CUDA device"),
]
MODES = ("atomic", "warp", "serial", "arc")


@pytest.mark.parametrize("threshold", [1, 4, 33])
def test_scatter_add_modes_match_numpy_on_gpu(threshold):
    rng = np.random.default_rng(threshold)
    m, n = 300, 200_000
    patterns = [np.full(n, 7), np.arange(n) % m, rng.integers(0, m, n), np.sort(rng.integers(0, m, n))]
    for idx in patterns:
        vals = rng.standard_normal((n, 3)).astype(np.float32)
        ref = np.zeros((m, 3))
        np.add.at(ref, idx, vals.astype(np.float64))
        for mode in MODES:
            dest = wp.zeros(m, dtype=wp.vec3, device="cuda")
            arc_warp.scatter_add(dest, wp.array(idx.astype(np.int32), device="cuda"),
                                 wp.array(vals, dtype=wp.vec3, device="cuda"), mode=mode, threshold=threshold)
            # float32 sums of up to 2e5 unit terms in any order: well inside 1e-5 of the largest sum.
            np.testing.assert_allclose(dest.numpy(), ref, atol=1e-5 * np.abs(ref).max(), err_msg=mode)


def _scene(device, n=400, seed=0):
    rng = np.random.default_rng(seed)
    z = rng.uniform(2.0, 6.0, n)
    means = np.stack([rng.uniform(-1, 1, n) * z * 0.5, rng.uniform(-1, 1, n) * z * 0.4, z], 1)
    q = rng.standard_normal((n, 4))
    arrays = dict(
        means=wp.array(means, dtype=wp.vec3, device=device),
        quats=wp.array(q / np.linalg.norm(q, axis=1, keepdims=True), dtype=wp.vec4, device=device),
        scales=wp.array(rng.uniform(0.02, 0.12, (n, 3)), dtype=wp.vec3, device=device),
        opacities=wp.array(rng.uniform(0.1, 0.95, n), dtype=float, device=device),
        colors=wp.array(rng.normal(0, 0.4, (n, 16, 3)), dtype=wp.vec3, device=device),
    )
    return arrays


def test_render_and_gradients_match_cpu_for_every_mode():
    cam = arc_warp.Camera.from_fov(60.0, 83, 61)
    cot = np.random.default_rng(5).standard_normal((61, 83, 3)).astype(np.float32)
    results = {}
    for device in ("cpu", "cuda"):
        arrays = _scene(device)
        for mode in MODES:
            out = arc_warp.render_gaussians(**arrays, camera=cam, settings=arc_warp.RenderSettings(reduce=mode))
            grads = arc_warp.render_gaussians_backward(out, wp.array(cot, dtype=wp.vec3, device=device))
            results[device, mode] = (out.color.numpy(), {k: getattr(grads, k).numpy() for k in arrays})
    ref_img, ref_grads = results["cpu", "atomic"]
    for mode in MODES:
        img, grads = results["cuda", mode]
        # float32 on both sides; exp/rcp differ slightly between the CPU and fast-math CUDA.
        np.testing.assert_allclose(img, ref_img, atol=1e-4)
        for k, g in grads.items():
            scale = np.abs(ref_grads[k]).max()
            np.testing.assert_allclose(g, ref_grads[k], atol=2e-3 * scale, err_msg=f"{mode} {k}")


def test_calibration_on_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("ARC_WARP_CACHE_DIR", str(tmp_path))
    cal = arc_warp.calibrate("cuda")
    assert 1 <= cal.threshold <= 33
    assert arc_warp.resolve_threshold("cuda") == cal.threshold
    assert (tmp_path / "calibration.json").exists()
