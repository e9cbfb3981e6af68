"""Data-parallel training throughput on 1, 2, ... GPUs (weak scaling).

Scene: N random Gaussians in a ball of radius ~1 (default 1M, SH degree 3 during
training), seen by 16 orbiting cameras at WxH (default 960x544). Ground-truth images are
rendered from the scene, and the model starts from its points (kNN scales, opacity 0.1),
so every rank trains on identical data with densification off (a steady workload).

For each requested GPU count G, G processes are spawned (no torchrun; NCCL, NVLink
multicast off via NCCL_NVLS_ENABLE=0) and train with `--views-per-gpu` views per GPU
per step (global batch G x views-per-gpu): `--warmup` steps, then `--steps` timed steps
between barriers. Reported: steps/s, views/s, scaling efficiency
= (views/s per GPU at G) / (views/s per GPU at the smallest G run, normally 1), the
median time of one all-reduce of the gradient buffer, and peak memory of rank 0.

Usage::

    python benchmarks/bench_multi_gpu.py --gpus 1 2 [--json out.json]
    python benchmarks/bench_multi_gpu.py --gpus 1 2 --device cpu --n 2000 --width 64 \\
        --height 48 --steps 3 --warmup 4     # CPU smoke test (gloo processes)
"""

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

NUM_VIEWS = 16


def make_dataset(n: int, width: int, height: int, seed: int, device: str):
    """In-memory Dataset: `n` random Gaussians (RGB) rendered by the Warp renderer from
    NUM_VIEWS orbit cameras on `device`; the points seed the model."""
    import warp as wp

    from arc_warp import RenderSettings, render_gaussians
    from arc_warp_train.datasets import Dataset, View
    from arc_warp_train.synthetic import orbit_cameras

    rng = np.random.default_rng(seed)
    f32 = np.float32
    size = (1e6 / n) ** (1.0 / 3.0)  # denser clouds get smaller Gaussians
    means = rng.normal(0.0, 0.45, (n, 3)).astype(f32)
    quats = rng.normal(size=(n, 4)).astype(f32)
    scales = (np.exp(rng.uniform(np.log(0.003), np.log(0.015), (n, 3))) * size).astype(f32)
    opacities = rng.uniform(0.3, 0.95, n).astype(f32)
    colors = rng.uniform(0.0, 1.0, (n, 3)).astype(f32)
    cams = orbit_cameras(NUM_VIEWS + 1, width, height, radius=3.5)
    views = []
    with wp.ScopedDevice(device):
        arrays = [wp.array(a, dtype=t) for a, t in ((means, wp.vec3), (quats, wp.vec4),
                                                    (scales, wp.vec3), (opacities, wp.float32),
                                                    (colors, wp.vec3))]
        for i, cam in enumerate(cams):
            image = render_gaussians(*arrays, cam, RenderSettings()).color.numpy()
            views.append(View(f"view_{i}", np.clip(image, 0.0, 1.0), np.array(cam.K),
                              np.array(cam.world_to_camera)))  # writable copies for torch
    return Dataset(views[:NUM_VIEWS], views[NUM_VIEWS:], means, colors, source="bench")


def _worker(opts: dict, result_path: str) -> None:
    """One rank: build the data, warm up, time the steps; rank 0 writes the result JSON."""
    import warp as wp

    wp.config.log_level = wp.LOG_WARNING
    from arc_warp_train.densify import DensifyConfig
    from arc_warp_train.distributed import init_distributed
    from arc_warp_train.trainer import TrainConfig, Trainer

    dist = init_distributed(opts["device"])
    try:
        cuda = opts["device"] == "cuda"
        dev = f"cuda:{dist.local_rank}" if cuda else "cpu"
        data = make_dataset(opts["n"], opts["width"], opts["height"], opts["seed"], dev)
        total = opts["warmup"] + opts["steps"]
        cfg = TrainConfig(steps=total, batch_size=dist.world_size * opts["views_per_gpu"],
                          sh_degree=3, sh_degree_interval=1, densify=DensifyConfig(refine_stop=0),
                          eval_every=total, log_every=total, device=opts["device"],
                          progress=False, cpu_threads=None if cuda else 1, seed=opts["seed"])
        trainer = Trainer(data, cfg, tempfile.gettempdir(), dist)

        def sync():
            if cuda:
                torch.cuda.synchronize()
            dist.barrier()

        for _ in range(opts["warmup"]):  # SH degree 3 from step 3 on
            trainer.train_step()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        sync()
        start = time.perf_counter()
        for _ in range(opts["steps"]):
            loss, _ = trainer.train_step()
        sync()
        elapsed = time.perf_counter() - start
        buffer_mb = 4 * sum(p.numel() for p in trainer.params.values()) / 2 ** 20
        allreduce_ms = _allreduce_ms(dist, trainer.params, cuda) if dist.enabled else 0.0
        if dist.is_main:
            with open(result_path, "w") as f:
                json.dump({"gpus": dist.world_size, "views_per_step": cfg.batch_size,
                           "steps": opts["steps"], "seconds": elapsed,
                           "steps_per_s": opts["steps"] / elapsed,
                           "views_per_s": opts["steps"] * cfg.batch_size / elapsed,
                           "allreduce_ms": allreduce_ms, "grad_buffer_mib": buffer_mb,
                           "num_gaussians": int(trainer.params["means"].shape[0]),
                           "final_loss": loss,
                           "peak_mem_gib": torch.cuda.max_memory_allocated() / 2 ** 30
                           if cuda else None}, f)
    finally:
        dist.close()


def _allreduce_ms(dist, params, cuda: bool, reps: int = 5) -> float:
    """Median wall time of one all-reduce of a buffer the size of all gradients."""
    import torch.distributed as tdist

    flat = torch.cat([p.detach().reshape(-1) for p in params.values()])
    times = []
    for _ in range(reps + 1):
        dist.barrier()
        t0 = time.perf_counter()
        tdist.all_reduce(flat)
        if cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[1:])  # the first one sets up NCCL buffers


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 2],
                    help="GPU (process) counts to run, e.g. 1 2 4")
    ap.add_argument("--n", type=int, default=1_000_000, help="Gaussians")
    ap.add_argument("--width", type=int, default=960)
    ap.add_argument("--height", type=int, default=544)
    ap.add_argument("--views-per-gpu", type=int, default=1)
    ap.add_argument("--steps", type=int, default=30, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5,
                    help="untimed steps, >= 4: the SH degree grows 0..3 over the first steps, "
                    "and each degree compiles its kernels on first use")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: gloo processes instead of GPUs (smoke test)")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    if min(args.gpus) < 1 or min(args.n, args.width, args.height, args.views_per_gpu,
                                 args.steps) < 1:
        ap.error("--gpus, --n, --width, --height, --views-per-gpu, --steps must be >= 1")
    if args.warmup < 4:
        ap.error(f"--warmup must be >= 4 (SH degree ramp), got {args.warmup}")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    from arc_warp_train.distributed import launch

    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("bench_multi_gpu: no CUDA device (use --device cpu for a smoke test)",
                  file=sys.stderr)
            return 2
        available = torch.cuda.device_count()
        device_name = torch.cuda.get_device_name(0)
    else:
        available, device_name = math.inf, "cpu (gloo processes)"
    opts = {k: getattr(args, k) for k in ("n", "width", "height", "views_per_gpu", "steps",
                                           "warmup", "seed", "device")}
    print(f"# data-parallel training: {args.n} Gaussians, {args.width}x{args.height}, SH 3, "
          f"{args.views_per_gpu} view(s) per GPU per step, {args.steps} timed steps after "
          f"{args.warmup} warm-up; {device_name}, NCCL_NVLS_ENABLE="
          f"{os.environ['NCCL_NVLS_ENABLE']}", flush=True)
    results, skipped = [], []
    for g in sorted(set(args.gpus)):
        if g > available:
            msg = f"requested {g} GPUs but only {available} visible: skipped"
            print(f"# WARNING: {msg}", file=sys.stderr, flush=True)
            skipped.append({"gpus": g, "reason": msg})
            continue
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "result.json")
            t0 = time.perf_counter()
            launch(_worker, g, (opts, path))
            with open(path) as f:
                row = json.load(f)
        row["wall_s_including_setup"] = time.perf_counter() - t0
        results.append(row)
        print(f"# {g} GPU(s) done in {row['wall_s_including_setup']:.0f} s", flush=True)
    if results:
        base = results[0]["views_per_s"] / results[0]["gpus"]
        for row in results:
            row["efficiency"] = row["views_per_s"] / row["gpus"] / base
        print(f"{'gpus':>4} {'views/step':>10} {'steps/s':>8} {'views/s':>8} {'efficiency':>10} "
              f"{'allreduce ms':>12} {'peak GiB':>8}")
        for r in results:
            peak = f"{r['peak_mem_gib']:8.1f}" if r["peak_mem_gib"] is not None else f"{'-':>8}"
            print(f"{r['gpus']:4d} {r['views_per_step']:10d} {r['steps_per_s']:8.2f} "
                  f"{r['views_per_s']:8.2f} {r['efficiency']:10.2f} {r['allreduce_ms']:12.2f} "
                  f"{peak}")
        print(f"# efficiency = views/s per GPU relative to {results[0]['gpus']} GPU(s); "
              f"gradient buffer {results[0]['grad_buffer_mib']:.0f} MiB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device_name, "n": args.n, "width": args.width,
                       "height": args.height, "views_per_gpu": args.views_per_gpu,
                       "nccl_nvls_enable": os.environ["NCCL_NVLS_ENABLE"],
                       "results": results, "skipped": skipped}, f, indent=1)
    return 0 if results else 2


if __name__ == "__main__":
    sys.exit(main())
