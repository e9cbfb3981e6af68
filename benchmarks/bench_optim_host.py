"""Host time of one optimizer step over the six parameter tensors of 3DGS.

At a small N the kernels cost next to nothing, so this times what ``step()`` costs the
host: the Python and launch overhead that bounds a training step once the device is
fast (on an H200 the fused step at 300k Gaussians is host-bound). Times
``arc_warp_torch.SparseGaussianAdam`` (dense with torch's bias correction, dense without,
and sparse over half the rows) and ``torch.optim.Adam`` (its default implementation for
the device: for-loop on the CPU, foreach on CUDA) over means [N,3], quats [N,4],
log-scales [N,3], logit-opacities [N,1], SH DC [N,1,3] and SH rest [N,15,3], one param
group each (as INRIA's 3DGS builds them), every group's learning rate changed before every
step (as INRIA's schedule does).

Reported per optimizer: the median over ``--reps`` steps of ``time.perf_counter`` around
``step()`` alone (no sync: on CUDA, the time to queue the work), microseconds. The
optimizers take turns step by step, so a slower stretch of the machine hits them alike.
On the CPU torch runs on one thread, as Warp's CPU kernels do (on a machine of few cores
torch's idle OpenMP workers otherwise make its own timings erratic).

Usage::

    python benchmarks/bench_optim_host.py                      # CPU, N=10 and 1000
    python benchmarks/bench_optim_host.py --device cuda --n 1000 300000
"""

import argparse
import sys
import time

import numpy as np
import torch

SHAPES = {"means": (3,), "quats": (4,), "log_scales": (3,), "logit_opacities": (1,), "sh_dc": (1, 3),
          "sh_rest": (15, 3)}
LRS = {"means": 1.6e-4, "quats": 1e-3, "log_scales": 5e-3, "logit_opacities": 5e-2, "sh_dc": 2.5e-3,
       "sh_rest": 2.5e-3 / 20}
KINDS = ("torch_adam", "fused_adam", "fused_adam_no_bias_correction", "sparse_adam")


def _optimizer(kind, n, device):
    """(optimizer, step function) of ``kind`` over fresh 3DGS-shaped parameters with gradients."""
    gen = torch.Generator().manual_seed(0)
    params = {k: torch.randn(n, *s, generator=gen).to(device).requires_grad_(True) for k, s in SHAPES.items()}
    for p in params.values():
        p.grad = (torch.randn(p.shape, generator=gen) * 1e-3).to(device)
    groups = [{"params": [p], "lr": LRS[k], "name": k} for k, p in params.items()]
    if kind == "torch_adam":
        opt = torch.optim.Adam(groups, lr=0.0, eps=1e-15)
    else:
        from arc_warp_torch import SparseGaussianAdam

        opt = SparseGaussianAdam(groups, lr=0.0, eps=1e-15, bias_correction=kind == "fused_adam")
    if kind == "sparse_adam":
        visible = (torch.rand(n, generator=gen) < 0.5).to(device)
        return opt, lambda: opt.step(visible, n)
    return opt, opt.step


def bench(n, device, reps, kinds=KINDS, warmup=20):
    """{kind: median host microseconds per ``step()``} over 3DGS tensors of n rows."""
    runs = {kind: _optimizer(kind, n, device) for kind in kinds}
    times = {kind: [] for kind in kinds}
    for i in range(warmup + reps):
        for kind, (opt, step) in runs.items():
            for g in opt.param_groups:  # a schedule sets every group's lr before each step
                g["lr"] = LRS[g["name"]] * (1.0 - 1e-4 * i)
            t0 = time.perf_counter()
            step()
            t1 = time.perf_counter()
            if i >= warmup:
                times[kind].append(t1 - t0)
        if device.type == "cuda" and i % 64 == 63:
            torch.cuda.synchronize(device)  # keep the launch queue short
    return {kind: float(np.median(t)) * 1e6 for kind, t in times.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--n", type=int, nargs="+", default=[10, 1000])
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    if device.type == "cpu":
        torch.set_num_threads(1)
    print(f"# host us per step() over the 6 tensors of 3DGS, median of {args.reps}, device {device}")
    print("| N | " + " | ".join(args.kinds) + " |\n|---|" + "---|" * len(args.kinds))
    for n in args.n:
        row = bench(n, device, args.reps, args.kinds)
        print(f"| {n} | " + " | ".join(f"{row[k]:.1f}" for k in args.kinds) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
