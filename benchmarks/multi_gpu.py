"""Data-parallel training throughput of `arc-warp train`'s trainer on 1, 2, ... GPUs (weak scaling).

Scene: N random Gaussians in a ball of radius ~1 (default 1M, SH degree 3 during
training), seen by 16 orbiting cameras at WxH (default 960x544). Ground-truth images are
rendered from the scene, and the model starts from its points (kNN scales, opacity 0.1),
so every rank trains on identical data with densification off (a steady workload).

For each requested GPU count G, G processes are spawned (no torchrun; NCCL, NVLink
multicast off via NCCL_NVLS_ENABLE=0) and train with ``--views-per-gpu`` views per GPU
per step (global batch G x views-per-gpu): ``--warmup`` steps, then ``--steps`` timed steps
between barriers. Reported: steps/s, views/s, scaling efficiency = (views/s per GPU at G)
/ (views/s per GPU at the smallest G run, normally 1), the median time of one all-reduce
of the gradient buffer, and peak memory of rank 0. A count above the GPUs visible is
skipped with a note. On the CPU (``--smoke``, or ``--device cpu``) the ranks are gloo
processes.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
import time

import numpy as np

from benchmarks import results

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
    import torch
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
                          progress=False, cpu_threads=None if cuda else 1, seed=opts["seed"],
                          capture=False)  # ranks step eagerly: one GPU alike, so the scaling compares like with like
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
                           "final_loss": float(loss),
                           "peak_mem_gib": torch.cuda.max_memory_allocated() / 2 ** 30
                           if cuda else None}, f)
    finally:
        dist.close()


def _allreduce_ms(dist, params, cuda: bool, reps: int = 5) -> float:
    """Median wall time of one all-reduce of a buffer the size of all gradients."""
    import torch
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


def add_arguments(parser) -> None:
    parser.add_argument("--gpus", type=int, nargs="+", default=[1, 2], help="GPU (process) counts, e.g. 1 2 4")
    parser.add_argument("--n", type=int, default=1_000_000, help="Gaussians")
    parser.add_argument("--width", type=int, default=960)
    parser.add_argument("--height", type=int, default=544)
    parser.add_argument("--views-per-gpu", type=int, default=1)
    parser.add_argument("--steps", type=int, default=30, help="timed steps")
    parser.add_argument("--warmup", type=int, default=5,
                        help="untimed steps, >= 4: the SH degree grows 0..3 over the first steps, and each degree "
                             "compiles its kernels on first use")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: gloo processes instead of GPUs")


def run(args) -> dict:
    import torch

    from arc_warp_train.distributed import launch

    if args.smoke:
        args.gpus, args.n, args.width, args.height, args.steps, args.warmup, args.device = [1], 300, 32, 24, 1, 4, "cpu"
    if min(args.gpus) < 1 or min(args.n, args.width, args.height, args.views_per_gpu, args.steps) < 1:
        raise SystemExit("--gpus, --n, --width, --height, --views-per-gpu, --steps must be >= 1")
    if args.warmup < 4:
        raise SystemExit(f"--warmup must be >= 4 (SH degree ramp), got {args.warmup}")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("multi_gpu: no CUDA device (--device cpu runs gloo processes)")
    available = torch.cuda.device_count() if args.device == "cuda" else math.inf
    opts = {k: getattr(args, k) for k in ("n", "width", "height", "views_per_gpu", "steps", "warmup", "seed",
                                          "device")}
    rows, notes = [], [f"NCCL_NVLS_ENABLE={os.environ['NCCL_NVLS_ENABLE']}"]
    for g in sorted(set(args.gpus)):
        if g > available:
            notes.append(f"{g} GPUs requested, {available} visible: skipped")
            print(f"# {notes[-1]}")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "result.json")
            t0 = time.perf_counter()
            launch(_worker, g, (opts, path))
            with open(path) as f:
                row = json.load(f)
        row["wall_s_including_setup"] = time.perf_counter() - t0
        rows.append(row)
        print(f"# {g} GPU(s) done in {row['wall_s_including_setup']:.0f} s", flush=True)
    for row in rows:
        row["efficiency"] = row["views_per_s"] / row["gpus"] / (rows[0]["views_per_s"] / rows[0]["gpus"])
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu (gloo processes)"
    return {"device": name, "n": args.n, "width": args.width, "height": args.height,
            "views_per_gpu": args.views_per_gpu, "notes": notes, "rows": rows}


def table(result: dict) -> str:
    num = results.num
    out = [[str(r["gpus"]), str(r["views_per_step"]), num(r["steps_per_s"], 2), num(r["views_per_s"], 1),
            num(r["efficiency"], 2), num(r["allreduce_ms"], 2) if r["gpus"] > 1 else "-",
            num(r["peak_mem_gib"], 1)] for r in result["rows"]]
    return results.markdown(["GPUs", "views/step", "steps/s", "views/s", "scaling efficiency", "all-reduce ms",
                             "peak GiB (rank 0)"], out) + (
        f"\n\n{results.count(result['n'])} Gaussians, {result['width']}x{result['height']}, SH 3, "
        f"{result['views_per_gpu']} view(s) per GPU per step.")
