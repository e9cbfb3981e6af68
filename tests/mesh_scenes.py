"""Small random mesh scenes and helpers shared by the mesh tests."""

import numpy as np
import pytest
import torch
import warp as wp

from conftest import cpu_blocks_enabled as cpu_blocks  # noqa: F401 (the mesh tests import it from here)

DEVICE = "cpu"

# (enable_cpu_blocks, mode, threshold): one-lane CPU warps run the atomic path of every
# mode, so they test atomic and arc; emulated 32-lane warps test the warp reductions,
# arc at T=6 mixing raw atomics (targets with < 6 lanes) and reductions.
REDUCE_CASES = [(False, "atomic", None), (False, "arc", None), (True, "warp", None), (True, "serial", None),
                (True, "arc", 6)]
REDUCE_IDS = ["atomic", "arc_lanes", "warp_emulated", "serial_emulated", "arc_emulated"]


def wa(x, dtype=wp.float32, requires_grad=False):
    """CPU wp.array of a numpy array (float32 or int32)."""
    return wp.array(np.ascontiguousarray(x), dtype=dtype, device=DEVICE, requires_grad=requires_grad)


def t64(a):
    """float64 torch tensor of a wp.array / numpy array."""
    return torch.from_numpy(np.asarray(a.numpy() if isinstance(a, wp.array) else a, np.float64))


def random_mesh(rng, batch=2, n_tri=12, n_vert=20, w_range=(0.6, 2.0), spread=1.1):
    """Clip-space positions [B, V, 4] (float32 values) with triangles [F, 3] of distinct vertices."""
    w = rng.uniform(*w_range, size=(batch, n_vert))
    xy = rng.uniform(-spread, spread, size=(batch, n_vert, 2)) * w[..., None]
    z = rng.uniform(-0.9, 0.9, size=(batch, n_vert)) * w
    pos = np.concatenate([xy, z[..., None], w[..., None]], -1).astype(np.float32)
    tri = np.stack([rng.choice(n_vert, 3, replace=False) for _ in range(n_tri)]).astype(np.int32)
    return pos, tri


def _nvrtc_archs() -> list:
    wp.init()
    return sorted(getattr(wp._src.context.runtime, "nvrtc_supported_archs", None) or [])


needs_sm90_nvrtc = pytest.mark.skipif(90 not in _nvrtc_archs(), reason="needs NVRTC with sm_90 (Warp's CUDA compiler)")


def sm90_ptx(kernel, directory) -> str:
    """The sm_90 PTX of ``kernel``'s module (NVRTC compiles without a GPU)."""
    (path,) = wp.compile_aot_module(kernel.module, arch=90, use_ptx=True, module_dir=directory / kernel.key)
    return path.read_bytes().replace(b"\0", b"").decode()
