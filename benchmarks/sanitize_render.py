"""One forward + backward (arc and deterministic) of the bench_splat scene, for compute-sanitizer.

    compute-sanitizer --tool memcheck python benchmarks/sanitize_render.py 1000000
"""

import os
import sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import warp as wp  # noqa: E402

import arc_warp  # noqa: E402
from bench_splat import HEIGHT, WIDTH, make_scene, scene_arrays  # noqa: E402

wp.config.log_level = wp.LOG_WARNING
n = int(sys.argv[1])
scene = make_scene(n)
dev = wp.get_device("cuda")
arrays = scene_arrays(scene, dev)
g = wp.array(np.random.default_rng(1).standard_normal((HEIGHT, WIDTH, 3)).astype(np.float32), dtype=wp.vec3, device=dev)
for mode in ("arc", "deterministic"):
    out = arc_warp.render_gaussians(**arrays, camera=scene["camera"], settings=arc_warp.RenderSettings(reduce=mode))
    grads = arc_warp.render_gaussians_backward(out, g)
    wp.synchronize()
    print(mode, "n_isects", out._bins.n_isects, "grad norm", float(np.linalg.norm(grads.means.numpy())))
