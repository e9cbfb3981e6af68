"""Host (Python) time of an eager training step through `arc_warp_torch.rasterization`, with
the kernels made no-ops: what a step costs the CPU before any device work, measured on
the CPU. Compare two source trees in one run (alternating subprocesses):

    python benchmarks/bench_host.py --trees /path/to/old/checkout . --reps 400

Each tree's package and plugins are imported from the tree (PYTHONPATH). Reported: the
median microseconds per `rasterization` call and per `loss.backward()`, over `--rounds`
alternations of `--reps` calls, at N Gaussians and one camera.
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
warp.utils.radix_sort_pairs = lambda *a, **k: None
warp.utils.array_scan = lambda *a, **k: None
from arc_warp_torch import rasterization

n, w, h, reps = (int(v) for v in sys.argv[1:5])
rng = np.random.default_rng(0)
p = {"means": rng.normal(size=(n, 3)) + [0, 0, 4], "quats": rng.normal(size=(n, 4)),
     "scales": np.full((n, 3), -3.0), "opacities": np.zeros(n), "colors": rng.normal(size=(n, 16, 3))}
p = {k: torch.tensor(v, dtype=torch.float32, requires_grad=True) for k, v in p.items()}
vm = torch.eye(4)[None]
ks = torch.tensor([[[300.0, 0, w / 2], [0, 300.0, h / 2], [0, 0, 1]]])
fwd, bwd = [], []
for i in range(reps + 20):
    for t in p.values():
        t.grad = None
    t0 = time.perf_counter()
    colors, alphas, meta = rasterization(*p.values(), vm, ks, w, h, sh_degree=3, scales_activation="exp",
                                         opacities_activation="sigmoid")
    t1 = time.perf_counter()
    loss = colors.sum()
    t2 = time.perf_counter()
    loss.backward()
    t3 = time.perf_counter()
    if i >= 20:
        fwd.append(t1 - t0)
        bwd.append(t3 - t2)
print(json.dumps({"forward_us": 1e6 * sorted(fwd)[len(fwd) // 2], "backward_us": 1e6 * sorted(bwd)[len(bwd) // 2]}))
"""


def run(tree: str, args) -> dict:
    tree = os.path.abspath(tree)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, os.path.join(tree, "plugins"), os.path.join(tree, "apps")]))
    out = subprocess.run([sys.executable, "-c", CHILD, str(args.n), str(args.width), str(args.height), str(args.reps)],
                         env=env, capture_output=True, text=True, check=True, cwd=tree)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", nargs="+", default=["."], help="source trees to compare")
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--height", type=int, default=48)
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    results = {tree: [] for tree in args.trees}
    for _ in range(args.rounds):
        for tree in args.trees:
            results[tree].append(run(tree, args))
    print(f"host time per call, no-op kernels, N={args.n}, {args.width}x{args.height}, SH 3, CPU; "
          f"median of {args.rounds} rounds x {args.reps} calls")
    print(f"{'tree':<40} {'forward us':>12} {'backward us':>12}")
    summary = {}
    for tree, rounds in results.items():
        f = statistics.median(r["forward_us"] for r in rounds)
        b = statistics.median(r["backward_us"] for r in rounds)
        summary[tree] = {"forward_us": f, "backward_us": b, "rounds": rounds}
        print(f"{tree:<40} {f:12.1f} {b:12.1f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(summary, fh, indent=2)


if __name__ == "__main__":
    main()
