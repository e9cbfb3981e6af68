"""Device-side input checks name what is actually wrong (zero quaternions are not NaN/Inf)."""

import numpy as np
import pytest
import warp as wp

from arc_warp import Camera, render_gaussians


def scene(n=6):
    rng = np.random.default_rng(0)
    means = np.c_[rng.uniform(-0.5, 0.5, (n, 2)), rng.uniform(3.0, 4.0, n)]
    quats = np.tile([1.0, 0.0, 0.0, 0.0], (n, 1))
    arrays = dict(means=means, quats=quats, scales=np.full((n, 3), 0.2), opacities=np.full(n, 0.5),
                  colors=rng.uniform(size=(n, 3)))
    return {k: v.astype(np.float32) for k, v in arrays.items()}, Camera(20.0, 20.0, 8.0, 8.0, 16, 16)


def render(arrays, cam, device):
    types = dict(means=wp.vec3, quats=wp.vec4, scales=wp.vec3, opacities=wp.float32, colors=wp.vec3)
    return render_gaussians(*(wp.array(v, dtype=types[k], device=device) for k, v in arrays.items()), cam)


def test_zero_quaternion_says_zero_norm_not_non_finite(device):
    arrays, cam = scene()
    arrays["quats"][3] = 0.0
    with pytest.raises(ValueError) as err:
        render(arrays, cam, device)
    msg = str(err.value)
    assert "quats has quaternions of zero norm" in msg and "cannot be normalised" in msg
    assert "non-finite" not in msg


def test_zero_and_non_finite_quaternions_are_both_reported(device):
    arrays, cam = scene()
    arrays["quats"][1] = 0.0
    arrays["means"][4, 0] = np.nan
    with pytest.raises(ValueError) as err:
        render(arrays, cam, device)
    msg = str(err.value)
    assert "non-finite (NaN/Inf) values in means" in msg
    assert "quats (zero norm)" not in msg and "quats has quaternions of zero norm" in msg


def test_nan_quaternion_is_non_finite(device):
    arrays, cam = scene()
    arrays["quats"][2, 1] = np.nan
    with pytest.raises(ValueError, match=r"non-finite \(NaN/Inf\) values in quats$"):
        render(arrays, cam, device)


def test_camera_matrix_errors_and_center():
    """Camera checks its world_to_camera (finite 4x4, last row (0, 0, 0, 1), invertible) and
    places itself at the inverse's translation, which the SH view directions read."""
    rng = np.random.default_rng(5)
    q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    w2c = np.eye(4)
    w2c[:3, :3], w2c[:3, 3] = q * np.array([1.0, 2.0, 0.5]), rng.normal(size=3)  # affine, not only rigid
    cam = Camera(20.0, 20.0, 8.0, 8.0, 16, 16, world_to_camera=w2c)
    np.testing.assert_allclose(cam.center, np.linalg.inv(w2c)[:3, 3], rtol=1e-12, atol=1e-12)
    bad = {"finite": w2c.copy(), "last row": w2c.copy(), "singular": w2c.copy()}
    bad["finite"][1, 2] = np.nan
    bad["last row"][3, 0] = 0.5
    bad["singular"][2, :3] = 0.0
    for match, matrix in bad.items():
        with pytest.raises(ValueError, match=match):
            Camera(20.0, 20.0, 8.0, 8.0, 16, 16, world_to_camera=matrix)
