"""GPU checks (skipped without a CUDA device): ``pytest -q -m gpu`` on the accelerator.

The float64 reference comparisons of test_splat_reference.py also run on CUDA through
the ``device`` fixture; the checks here need no CPU Warp (the accelerator's Warp build
has no CPU backend).
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
            # float32 accumulation of up to 2e5 unit terms into one address (atomic mode,
            # sequentially): round-off reaches ~1e-5 of the sum, so allow 1e-4.
            np.testing.assert_allclose(dest.numpy(), ref, atol=1e-4 * np.abs(ref).max(), err_msg=mode)


def test_render_modes_agree_on_gpu():
    # The CUDA renderer against the dense float64 reference is covered by the
    # device-parametrised tests in test_splat_reference.py; here every reduce mode must
    # give atomic's gradients on a 1080p-like tile load.
    rng = np.random.default_rng(0)
    n = 20_000
    z = rng.uniform(2.0, 8.0, n)
    means = np.stack([rng.uniform(-1, 1, n) * z * 0.6, rng.uniform(-1, 1, n) * z * 0.35, z], 1)
    q = rng.standard_normal((n, 4))
    arrays = dict(
        means=wp.array(means, dtype=wp.vec3, device="cuda"),
        quats=wp.array(q, dtype=wp.vec4, device="cuda"),
        scales=wp.array(rng.uniform(0.005, 0.05, (n, 3)), dtype=wp.vec3, device="cuda"),
        opacities=wp.array(rng.uniform(0.1, 0.95, n), dtype=float, device="cuda"),
        colors=wp.array(rng.normal(0, 0.4, (n, 16, 3)), dtype=wp.vec3, device="cuda"),
    )
    cam = arc_warp.Camera.from_fov(60.0, 640, 360)
    cot = wp.array(rng.standard_normal((360, 640, 3)), dtype=wp.vec3, device="cuda")
    grads = {}
    for mode in MODES:
        out = arc_warp.render_gaussians(**arrays, camera=cam, settings=arc_warp.RenderSettings(reduce=mode))
        g = arc_warp.render_gaussians_backward(out, cot)
        grads[mode] = {k: getattr(g, k).numpy() for k in arrays}
    for mode in MODES:
        for k, g in grads[mode].items():
            ref = grads["atomic"][k]
            # Same float32 terms summed in another order: round-off relative to the largest.
            np.testing.assert_allclose(g, ref, atol=1e-4 * np.abs(ref).max(), err_msg=f"{mode} {k}")


def test_calibration_on_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("ARC_WARP_CACHE_DIR", str(tmp_path))
    cal = arc_warp.calibrate("cuda")
    assert 1 <= cal.threshold <= 33 and 1 <= cal.keyed_threshold <= 33
    assert arc_warp.resolve_threshold("cuda") == cal.threshold
    assert arc_warp.resolve_threshold("cuda", keyed=True) == cal.keyed_threshold
    assert len(cal.keyed_arc_ms) == len(cal.keyed_candidates) and len(cal.keyed_atomic_ms) == len(cal.keyed_groups)
    assert (tmp_path / "calibration.json").exists()
