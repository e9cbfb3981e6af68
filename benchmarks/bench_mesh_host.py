"""Host (Python) time of the nvdiffrast drop-in chain (`arc_warp_torch.mesh`: rasterize ->
interpolate -> texture -> antialias, forward and backward through torch autograd), with
the kernels made no-ops: what a step costs the CPU before any device work, measured on
the CPU with torch CPU tensors. Compare source trees in one run (alternating subprocesses):

    python benchmarks/bench_mesh_host.py --trees /path/to/old/checkout . --reps 300

Each tree's package and plugins are imported from the tree (PYTHONPATH). The scene: a
[B, V, 4] clip-space mesh of F triangles (a jittered grid) seen by B cameras at W x H,
per-vertex uvs interpolated with their pixel derivatives, a trainable texture sampled
'linear-mipmap-linear' (its mip stack built in each call), and antialiased with a
topology hash built once. Reported: the median microseconds per chain forward (the four
ops' calls), per `loss.backward()` and per chain (their sum), over `--rounds`
alternations of `--reps` chains; the spread is the smallest and largest round median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time
import numpy as np
import torch
import warp as wp
import warp.utils

wp.config.log_level = 0
wp.init()
# kernels become no-ops: the host's own work is what is left (fills and copies stay real)
wp.Launch.launch = lambda self, *a, **k: None
_launch = wp.launch
wp.launch = lambda *a, **k: None if not k.get("record_cmd") else _launch(*a, **k)
import arc_warp_torch.mesh as dr

# torch's parallel fills (the gradients' zeros) wait milliseconds for a second OpenMP thread
# on a loaded machine: one thread keeps the figure the Python's own
torch.set_num_threads(1)

batch, w, h, grid, reps = (int(v) for v in sys.argv[1:6])
rng = np.random.default_rng(0)
# a grid of (grid + 1)^2 vertices, 2 grid^2 triangles, jittered per camera
xs = np.linspace(-0.8, 0.8, grid + 1)
xy = np.stack(np.meshgrid(xs, xs), -1).reshape(-1, 2)
v = len(xy)
pos = np.concatenate([xy, np.full((v, 1), 0.5), np.ones((v, 1))], 1)[None].repeat(batch, 0)
pos[..., :2] += rng.normal(scale=0.01, size=(batch, v, 2))
i = np.arange(grid)[:, None] * (grid + 1) + np.arange(grid)[None]
i = i.reshape(-1)
tri = np.concatenate([np.stack([i, i + 1, i + grid + 2], 1), np.stack([i, i + grid + 2, i + grid + 1], 1)])
pos = torch.tensor(pos, dtype=torch.float32, requires_grad=True)
tri = torch.tensor(tri, dtype=torch.int32)
uv = torch.tensor((xy + 1) / 2, dtype=torch.float32, requires_grad=True)
tex = torch.tensor(rng.uniform(size=(1, 32, 32, 3)), dtype=torch.float32, requires_grad=True)
glctx = dr.RasterizeCudaContext()
topology = dr.antialias_construct_topology_hash(tri)
fwd, bwd = [], []
for step in range(reps + 20):
    for t in (pos, uv, tex):
        t.grad = None
    t0 = time.perf_counter()
    rast, rast_db = dr.rasterize(glctx, pos, tri, resolution=[h, w])
    texc, texd = dr.interpolate(uv, rast, tri, rast_db=rast_db, diff_attrs="all")
    color = dr.texture(tex, texc, texd, filter_mode="linear-mipmap-linear")
    color = dr.antialias(color, rast, pos, tri, topology_hash=topology)
    t1 = time.perf_counter()
    loss = color.sum()
    t2 = time.perf_counter()
    loss.backward()
    t3 = time.perf_counter()
    if step >= 20:
        fwd.append(t1 - t0)
        bwd.append(t3 - t2)
f, b = sorted(fwd)[len(fwd) // 2], sorted(bwd)[len(bwd) // 2]
chain = sorted(x + y for x, y in zip(fwd, bwd))[len(fwd) // 2]
print(json.dumps({"forward_us": 1e6 * f, "backward_us": 1e6 * b, "chain_us": 1e6 * chain, "triangles": len(tri)}))
"""


def run(tree: str, args) -> dict:
    tree = os.path.abspath(tree)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, os.path.join(tree, "plugins"),
                                                       os.path.join(tree, "apps")]))
    argv = [str(v) for v in (args.batch, args.width, args.height, args.grid, args.reps)]
    out = subprocess.run([sys.executable, "-c", CHILD, *argv], env=env, capture_output=True, text=True, check=True,
                         cwd=tree)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", nargs="+", default=["."], help="source trees to compare")
    parser.add_argument("--batch", type=int, default=2, help="cameras (images) per call")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--height", type=int, default=48)
    parser.add_argument("--grid", type=int, default=12, help="a grid x grid mesh: 2 grid^2 triangles")
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    results = {tree: [] for tree in args.trees}
    for _ in range(args.rounds):
        for tree in args.trees:
            results[tree].append(run(tree, args))
    triangles = next(iter(results.values()))[0]["triangles"]
    print(f"host time of the nvdiffrast drop-in chain, no-op kernels, B={args.batch}, {args.width}x{args.height}, "
          f"{triangles} triangles, CPU; median of {args.rounds} rounds x {args.reps} chains [round min-max]")
    print(f"{'tree':<32} {'forward us':>20} {'backward us':>20} {'chain us':>20}")
    summary = {}
    for tree, rounds in results.items():
        row, cells = {"rounds": rounds}, []
        for name in ("forward_us", "backward_us", "chain_us"):
            values = [r[name] for r in rounds]
            row[name] = statistics.median(values)
            cells.append(f"{row[name]:7.1f} [{min(values):.0f}-{max(values):.0f}]")
        summary[tree] = row
        print(f"{tree:<32} " + " ".join(f"{c:>20}" for c in cells))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(summary, fh, indent=2)


if __name__ == "__main__":
    main()
