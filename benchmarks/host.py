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

``--workload mesh`` times the nvdiffrast drop-in chain instead (``arc_warp_torch.mesh``:
rasterize -> interpolate with pixel derivatives -> texture 'linear-mipmap-linear' with its
mip stack built per call -> antialias with a topology hash built once; two cameras, a
jittered 12 x 12 grid of 288 triangles, a 32x32 texture; torch on one thread, whose
parallel gradient fills otherwise wait milliseconds for a second thread on a loaded CPU).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

from benchmarks import results

SPLAT = r"""
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


MESH = r"""
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
import arc_warp_torch.mesh as dr

# torch's parallel fills (the gradients' zeros) wait milliseconds for a second OpenMP thread
# on a loaded machine: one thread keeps the figure the Python's own
torch.set_num_threads(1)

w, h, reps = (int(v) for v in sys.argv[2:5])
batch, grid = 2, 12
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
CHILDREN = {"splat": SPLAT, "mesh": MESH}


def add_arguments(parser) -> None:
    parser.add_argument("--workload", choices=tuple(CHILDREN), default="splat",
                        help="splat: rasterization + backward; mesh: the nvdiffrast drop-in chain")
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
    out = subprocess.run([sys.executable, "-c", CHILDREN[args.workload], str(args.n), str(args.width), str(args.height),
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
    return {"device": "cpu (no-op kernels)", "workload": args.workload, "n": args.n, "width": args.width, "height": args.height,
            "reps": args.reps, "rows": rows}


def table(result: dict) -> str:
    rows, num, ratio = result["rows"], results.num, results.ratio
    base = rows[0]
    out = [[f"`{r['tree']}` ({r['commit']})", num(r["forward_us"], 1), num(r["backward_us"], 1),
            ratio(r["forward_us"], base["forward_us"]), ratio(r["backward_us"], base["backward_us"])] for r in rows]
    return results.markdown(["tree", "forward µs", "backward µs", "forward ÷ first tree", "backward ÷ first tree"],
                            out) + ("\n\nThe mesh chain: 288 triangles, two cameras" if result.get("workload") == "mesh"
                                    else f"\n\nN = {result['n']}, SH 3, one camera") + (
        f", {result['width']}x{result['height']}, median of the rounds' medians over {result['reps']} calls.")
