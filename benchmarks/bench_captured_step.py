"""A training step captured whole in ``torch.cuda.graph`` (``arc_warp_torch.capture_step``)
against the same step run eagerly, and against the peers' eager steps, in one run.

The scene, parameters, learning rates and loss are bench_train_step's. Per N and size
regime, medians after warm-up:

- ``arc_captured``: the render alone (``arc_fused``'s raw parameters and fused
  activations, inputs that require grad) captured in one CUDA graph (``fwd``), render +
  L1 + backward in another (``fwd+bwd``), and the same + Adam in another (``step``):
  ``torch.optim.Adam(capturable=True, fused=True)`` and arc_warp's
  ``SparseGaussianAdam(capturable=True, bias_correction=True)`` (dense), whose step counts
  stay on the device, as a replayed graph needs; all on one ``RenderContext``. Each graph is replayed;
  ``captured.check()`` runs after the timed replays;
- ``arc_fused``, ``gsplat``, ``fastergs``: bench_train_step's eager figures
  (``bench_library``), each library with its own optimizer: arc_warp's fused
  ``SparseGaussianAdam``, torch's Adam for gsplat, Faster-GS's ``FusedAdam``.

Columns:
- fwd ms: GPU time (CUDA events) of one synchronised forward (the eager libraries' forward
  median, as bench_train_step's);
- fwd+bwd ms / step ms: GPU time (CUDA events) of one synchronised forward + backward / training
  step (for the eager libraries: forward + backward medians summed, and the step with
  the optimizer named);
- loop ms/step: ``reps`` steps back to back, one sync at the end (eager: torch Adam);
- host ms: ``time.perf_counter`` around the calls, before any sync: one ``graph.replay()``
  per captured step; the forward + backward calls for the eager libraries.

Usage (GPU)::

    python benchmarks/bench_captured_step.py --n 300000 1000000 --regimes small large --libs arc_fused gsplat fastergs
"""

import argparse
import sys
import time

import numpy as np
import torch

import bench_train_step as bts


def _timed(call):
    """(device ms between events around ``call()``, host ms of the call before any sync)."""
    with bts.Timer(True) as t:
        call()
    return t.device_ms(), t.host_ms


def bench_captured(raw, viewmats, ks, target, device, width, height, reps):
    """{fwd_ms, fwd_host_ms, fwd_bwd_ms, fwd_bwd_host_ms, step_ms, step_host_ms, loop_ms,
    loop_host_ms, step_arc_adam_ms, ...} of the captured graphs: synchronised replays, then
    (steps) ``reps`` replays back to back."""
    from arc_warp_torch import RenderContext, SparseGaussianAdam, capture_step, rasterization

    params = bts._params(raw, device)
    context = RenderContext(device)

    def groups():  # a list per optimizer: torch's fills its options into the dicts
        return [{"params": [v], "lr": bts.LRS[k]} for k, v in params.items()]

    torch_adam = torch.optim.Adam(groups(), eps=1e-15, capturable=True, fused=True)
    arc_adam = SparseGaussianAdam(groups(), lr=0.0, eps=1e-15, bias_correction=True, capturable=True,
                                  context=context)

    def fwd():
        return rasterization(params["means"], params["quats"], params["log_scales"], params["logit_opacities"],
                             params["sh"], viewmats, ks, width, height, sh_degree=bts.SH_DEGREE, context=context,
                             **bts.FUSED)[0]

    def fwd_bwd():
        (fwd() - target).abs().mean().backward()

    def zero_grad():
        for v in params.values():
            v.grad = None

    row = {}
    bodies = (("fwd", fwd), ("fwd_bwd", fwd_bwd), ("step", lambda: (fwd_bwd(), torch_adam.step())),
              ("step_arc_adam", lambda: (fwd_bwd(), arc_adam.step())))
    for name, body in bodies:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(bts.WARMUP):
                zero_grad()
                body()  # an optimizer's state exists before its capture
        torch.cuda.current_stream(device).wait_stream(side)
        zero_grad()  # the gradients are the graph's own
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), capture_step(context) as captured:
            body()
        for _ in range(bts.WARMUP):
            graph.replay()
        torch.cuda.synchronize(device)
        single = [_timed(graph.replay) for _ in range(reps)]
        row[f"{name}_ms"] = float(np.median([d for d, _ in single]))
        row[f"{name}_host_ms"] = float(np.median([h for _, h in single]))
        if name.startswith("step"):
            hosts = []
            with bts.Timer(True) as loop:
                for _ in range(reps):
                    t0 = time.perf_counter()
                    graph.replay()
                    hosts.append((time.perf_counter() - t0) * 1e3)
            row[name.replace("step", "loop")] = loop.device_ms() / reps
            row[name.replace("step", "loop") + "_host_ms"] = float(np.median(hosts))
        captured.check()
        del graph
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, nargs="+", default=[300_000, 1_000_000])
    ap.add_argument("--regimes", nargs="+", choices=sorted(bts.REGIMES), default=["small", "large"])
    ap.add_argument("--libs", nargs="+", default=["arc_fused", "gsplat", "fastergs"],
                    choices=["arc_fused", "gsplat", "fastergs"], help="eager libraries timed in the same run")
    ap.add_argument("--width", type=int, default=1920)
    ap.add_argument("--height", type=int, default=1080)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_captured_step: CUDA graphs need a CUDA device", file=sys.stderr)
        return 2
    import warp as wp

    wp.init()
    device = torch.device("cuda", 0)
    libs, notes = bts._renderers(args.libs, args.width, args.height)
    bts._count_waits()
    bts._count_arc_backward()
    print(f"# torch API, {args.width}x{args.height}, SH {bts.SH_DEGREE}, {torch.cuda.get_device_name(device)}; "
          + "; ".join(notes))
    print("| N | regime | library | fwd ms | fwd+bwd ms | step ms (optimizer) | loop ms/step | host ms (per call) |\n"
          "|---|---|---|---|---|---|---|---|")
    for n in args.n:
        for regime in args.regimes:
            raw, viewmats, ks = bts.make_scene(n, regime, args.width, args.height, 1)
            viewmats, ks = viewmats.to(device), ks.to(device)
            target = torch.rand(1, args.height, args.width, 3, device=device,
                                generator=torch.Generator(device).manual_seed(0))
            row = bench_captured(raw, viewmats, ks, target, device, args.width, args.height, args.reps)
            for adam, label in (("", "torch fused Adam"), ("_arc_adam", "SparseGaussianAdam")):
                print(f"| {n} | {regime} | arc_captured | {row['fwd_ms']:.3f} | {row['fwd_bwd_ms']:.3f} | "
                      f"{row['step' + adam + '_ms']:.3f} ({label}, capturable) | {row['loop' + adam + '_ms']:.3f} | "
                      f"{row['fwd_host_ms']:.3f} fwd, {row['fwd_bwd_host_ms']:.3f} fwd+bwd, "
                      f"{row['loop' + adam + '_host_ms']:.3f} step replay |", flush=True)
            for name, lib in libs.items():
                eager = bts.bench_library(lib, raw, viewmats, ks, target, device, args.reps,
                                          (torch.cuda.memory_allocated(device) - target.nbytes, None))
                own = next((k for k in ("step_fused_adam_ms", "step_fastergs_adam_ms") if k in eager),
                           "step_torch_adam_ms")
                print(f"| {n} | {regime} | {name} | {eager['forward_ms']:.3f} | "
                      f"{eager['forward_ms'] + eager['backward_ms']:.3f} | {eager[own]:.3f} ({own[5:-3]}) | "
                      f"{eager['loop_ms']:.3f} | {eager['host_ms']:.3f} fwd+bwd |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
