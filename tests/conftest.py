"""Shared pytest fixtures: CPU device, per-test seeding, CPU-block toggling, small random
Gaussian scenes."""

import contextlib
import zlib
from dataclasses import dataclass

import numpy as np
import pytest
import warp as wp


@dataclass
class RandomScene:
    """Random Gaussians (float32 numpy) seen by one pinhole camera (float64 numpy).

    means (N,3) world units; quats (N,4) wxyz, not normalised; scales (N,3) linear std-devs;
    opacities (N,) in [0,1]; colors (N,3) RGB or (N,(d+1)^2,3) SH coefficients.
    The camera is OpenCV-style: fx, fy, cx, cy in pixels, world_to_camera (4,4).
    """

    means: np.ndarray
    quats: np.ndarray
    scales: np.ndarray
    opacities: np.ndarray
    colors: np.ndarray
    sh_degree: object
    fx: float
    fy: float
    cx: float
    cy: float
    width: int
    height: int
    world_to_camera: np.ndarray
    near: float = 0.01
    far: float = 1e10


def _random_rotation(rng) -> np.ndarray:
    q = rng.normal(size=4)
    w, x, y, z = q / np.linalg.norm(q)
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ])


def random_scene(rng, n=64, width=37, height=29, sh_degree=None, opacity_range=(0.05, 0.95),
                 size_px_range=(0.3, 5.0), depth_range=(1.5, 5.0), border_px=6.0,
                 fov_x_deg=55.0) -> RandomScene:
    """Draw a scene of `n` Gaussians whose centres project into the image widened by
    `border_px` pixels, at camera depths in `depth_range`, with per-axis std-devs of
    `size_px_range` pixels (log-uniform) at their depth. The camera pose is random; all
    camera values are float32-representable so a float32 renderer sees the same camera."""
    fx = round(0.5 * width / np.tan(np.radians(0.5 * fov_x_deg)) * 8) / 8
    fy = fx * 1.0625
    cx, cy = 0.5 * width + 0.375, 0.5 * height - 0.25
    view = np.eye(4)
    view[:3, :3] = _random_rotation(rng)
    view[:3, 3] = rng.uniform(-1.0, 1.0, size=3)
    view = view.astype(np.float32).astype(np.float64)

    z = rng.uniform(*depth_range, size=n)
    u = rng.uniform(-border_px, width + border_px, size=n)
    v = rng.uniform(-border_px, height + border_px, size=n)
    cam_pts = np.stack([(u - cx) * z / fx, (v - cy) * z / fy, z], axis=-1)
    world = (cam_pts - view[:3, 3]) @ np.linalg.inv(view[:3, :3]).T
    size_px = np.exp(rng.uniform(*np.log(size_px_range), size=(n, 3)))
    scales = size_px * z[:, None] / fx
    quats = rng.normal(size=(n, 4)) * rng.uniform(0.5, 2.0, size=(n, 1))
    opacities = rng.uniform(*opacity_range, size=n)
    if sh_degree is None:
        colors = rng.uniform(0.0, 1.0, size=(n, 3))
    else:
        colors = rng.normal(scale=0.4, size=(n, (sh_degree + 1) ** 2, 3))
        colors[:, 0, :] += rng.uniform(0.0, 1.5, size=(n, 3))
    f32 = np.float32
    return RandomScene(world.astype(f32), quats.astype(f32), scales.astype(f32),
                       opacities.astype(f32), colors.astype(f32), sh_degree,
                       fx, fy, cx, cy, width, height, view)


@pytest.fixture(params=[
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not wp.is_cuda_available(), reason="needs a CUDA device")]),
])
def device(request):
    """Every device-parametrised test runs on the CPU, and on CUDA where there is a GPU
    (select those with ``pytest -m gpu`` on the accelerator)."""
    return request.param


# GPU tests that compare with Warp's CPU kernels (the accelerator's Warp may lack the CPU backend)
needs_cpu_kernels = pytest.mark.skipif(not wp.is_cpu_available(), reason="this Warp has no CPU (LLVM) backend")


@pytest.fixture
def rng(request):
    """numpy Generator seeded from the test id, so every test is reproducible alone."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def make_scene():
    """The `random_scene(rng, n, width, height, sh_degree, ...)` generator."""
    return random_scene


@contextlib.contextmanager
def cpu_blocks_enabled(enabled: bool):
    """``wp.config.enable_cpu_blocks`` set to ``enabled`` inside the block, restored after."""
    saved = wp.config.enable_cpu_blocks
    wp.config.enable_cpu_blocks = enabled
    try:
        yield enabled
    finally:
        wp.config.enable_cpu_blocks = saved


@pytest.fixture(params=[False, True], ids=["threads", "cpu_blocks"])
def cpu_blocks(request):
    """Runs the test with wp.config.enable_cpu_blocks off and on (restored afterwards); with
    it on, CPU launches with block_dim > 1 emulate GPU blocks with fibers, so keep them tiny."""
    with cpu_blocks_enabled(request.param):
        yield request.param


@dataclass
class Bins:
    """What one camera's render left in its RenderState, for white-box tests: the tile
    grid, the intersection total, the sorted Gaussian ids with each tile's range, and the
    projected splats."""

    tiles_x: int
    tiles_y: int
    n_isects: int
    gauss_ids: object
    tile_ranges: object
    splats: object


def bins_of(out) -> Bins:
    """The :class:`Bins` of a ``render_gaussians`` output."""
    renderer, cs = out._renderer, out._state.cameras[out._index]
    return Bins(renderer.tiles_x, renderer.tiles_y, out.status.totals[out._index], cs.sort_ids, cs.ranges,
                cs.splats)
