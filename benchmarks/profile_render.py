"""Per-kernel GPU time (wp.timing_begin) and wall time per call of the forward and backward
at 1M Gaussians (the bench_splat scene), reduce="arc": python benchmarks/profile_render.py"""

import collections
import os
import sys
import time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import warp as wp  # noqa: E402

import arc_warp  # noqa: E402
from bench_splat import HEIGHT, WIDTH, make_scene, scene_arrays  # noqa: E402

wp.config.log_level = wp.LOG_WARNING
scene = make_scene(1_000_000)
dev = wp.get_device("cuda")
arrays = scene_arrays(scene, dev)
g = wp.array(np.random.default_rng(1).standard_normal((HEIGHT, WIDTH, 3)).astype(np.float32), dtype=wp.vec3, device=dev)
s = arc_warp.RenderSettings(reduce="arc")
for _ in range(3):
    out = arc_warp.render_gaussians(**arrays, camera=scene["camera"], settings=s)
    arc_warp.render_gaussians_backward(out, g)
wp.synchronize()
for what in ("forward", "backward"):
    wp.timing_begin()
    t0 = time.perf_counter()
    for _ in range(5):
        if what == "forward":
            out = arc_warp.render_gaussians(**arrays, camera=scene["camera"], settings=s)
        else:
            arc_warp.render_gaussians_backward(out, g)
    host = (time.perf_counter() - t0) / 5 * 1e3
    wp.synchronize()
    wall = (time.perf_counter() - t0) / 5 * 1e3
    res = wp.timing_end()
    agg = collections.defaultdict(float)
    for r in res:
        agg[r.name[:60]] += r.elapsed / 5
    print(f"== {what}: wall {wall:.3f} ms/call (host loop {host:.3f}), GPU sum {sum(agg.values()):.3f} ms")
    for k, v in sorted(agg.items(), key=lambda kv: -kv[1])[:14]:
        print(f"   {v:8.3f}  {k}")
