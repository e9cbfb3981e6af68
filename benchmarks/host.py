"""Host (Python) time of an eager torch step with no-op kernels, on the CPU: source trees compared.

Issue 36's harness: ``arc_warp_torch.rasterization`` (SH degree 3, the raw parameters with
the activations in the projection) and ``loss.backward()`` with Warp's launches, radix
sorts and scans made no-ops, so what is left is what a step costs the CPU before any
device work (fills and copies stay real). Each tree in ``--trees`` runs in its own
subprocess with ``PYTHONPATH`` set to the tree, its plugins and apps (so its own arc_warp
is imported), the trees alternated for ``--rounds`` rounds of ``--reps`` calls after 20
warm-up calls; reported: the median over rounds of each round's median microseconds per
``rasterization`` call and per ``loss.backward()``, N Gaussians, one camera. Compare a
base checkout with this one::

    python -m benchmarks host --trees /path/to/base . --reps 300
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

from benchmarks import results

CHILD = r"""
import json, sys, time
import numpy as np
import torch
import warp as wp
import warp.utils

wp.config.log_level = wp.LOG_WARNING
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


def add_arguments(parser) -> None:
    parser.add_argument("--trees", nargs="+", default=["."], help="source trees to compare (the first is the base)")
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--height", type=int, default=48)
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)


def run_tree(tree: str, args) -> dict:
    """One round in ``tree``: ``{forward_us, backward_us}``."""
    tree = os.path.abspath(tree)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, os.path.join(tree, "plugins"),
                                                       os.path.join(tree, "apps")]))
    out = subprocess.run([sys.executable, "-c", CHILD, str(args.n), str(args.width), str(args.height),
                          str(args.reps)], env=env, capture_output=True, text=True, cwd=tree, timeout=1800)
    if out.returncode:
        raise RuntimeError(f"host: the harness failed in {tree}:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def tree_commit(tree: str) -> str:
    out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], cwd=tree, capture_output=True,
                         text=True)
    return out.stdout.strip() or "unknown"


def run(args) -> dict:
    if args.smoke:
        args.reps, args.rounds, args.n = 20, 1, 200
    rounds = {tree: [] for tree in args.trees}
    for _ in range(args.rounds):
        for tree in args.trees:
            rounds[tree].append(run_tree(tree, args))
    rows = [{"tree": tree, "commit": tree_commit(tree),
             "forward_us": statistics.median(r["forward_us"] for r in found),
             "backward_us": statistics.median(r["backward_us"] for r in found), "rounds": found}
            for tree, found in rounds.items()]
    return {"device": "cpu (no-op kernels)", "n": args.n, "width": args.width, "height": args.height,
            "reps": args.reps, "rows": rows}


def table(result: dict) -> str:
    rows, num, ratio = result["rows"], results.num, results.ratio
    base = rows[0]
    out = [[f"`{r['tree']}` ({r['commit']})", num(r["forward_us"], 1), num(r["backward_us"], 1),
            ratio(r["forward_us"], base["forward_us"]), ratio(r["backward_us"], base["backward_us"])] for r in rows]
    return results.markdown(["tree", "forward µs", "backward µs", "forward ÷ first tree", "backward ÷ first tree"],
                            out) + (f"\n\nN = {result['n']}, {result['width']}x{result['height']}, SH 3, one camera, "
                                    f"median of the rounds' medians over {result['reps']} calls.")
