"""Renders, backpropagates and scatter-adds on CUDA with kernels compiled for one PTX target,
and saves the results: ``python arch_probe.py ARCH OUT.npz CACHE_DIR`` (ARCH ``default`` or
an sm number such as 75). Run by test_raster_portability in a fresh process, because Warp
keeps a module loaded for the arch it was first built for."""

import sys

import numpy as np
import warp as wp

arch, out_path, cache_dir = sys.argv[1], sys.argv[2], sys.argv[3]
wp.config.kernel_cache_dir = cache_dir
wp.config.log_level = wp.LOG_WARNING
if arch != "default":
    wp.config.cuda_output = "ptx"  # the H200 JIT-compiles the older PTX
    wp.config.ptx_target_arch = int(arch)

from arc_warp import MODES, RenderSettings, render_gaussians, render_gaussians_backward, scatter_add  # noqa: E402
from test_splat_pipeline import cotangents, random_scene  # noqa: E402

rng = np.random.default_rng(12)
arrays, cam = random_scene(rng, 3000, 160, 96, "cuda")
cots = cotangents(rng, 160, 96, "cuda")
results = {}
for mode in MODES:
    if mode == "floor":
        continue
    out = render_gaussians(*arrays, cam, RenderSettings(reduce=mode, threshold=4, absgrad=True))
    grads = render_gaussians_backward(out, *cots)
    results[f"{mode}/color"] = out.color.numpy()
    for name, g in vars(grads).items():
        results[f"{mode}/{name}"] = g.numpy()
    results[f"{mode}/means2d_absgrad"] = out.means2d_absgrad.numpy()
    # general indices: the accumulator's match-any path (uniform runs and scattered ones)
    idx = np.concatenate([np.repeat(np.arange(300), 20), rng.integers(0, 300, 4000)]).astype(np.int32)
    vals = rng.normal(size=(idx.size, 3)).astype(np.float32)
    dest = wp.zeros(300, dtype=wp.vec3, device="cuda")
    scatter_add(dest, wp.array(idx, device="cuda"), wp.array(vals, dtype=wp.vec3, device="cuda"), mode=mode, threshold=4)
    results[f"{mode}/scatter"] = dest.numpy()
np.savez(out_path, **results)
