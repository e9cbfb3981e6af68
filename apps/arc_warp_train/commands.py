"""The application's `arc-warp` subcommands: `train` and `demo`.

Registered under the ``arc_warp.commands`` entry-point group (see pyproject.toml), so the
core command line finds them without importing this package. Importing this module loads
neither torch nor the trainer: each command imports them when it runs and prints how to
install what is missing.
"""

import importlib
import os
import sys

from arc_warp.cli import REDUCE_MODES, positive_int, quiet_warp

INSTALL_HINT = "pip install -e '.[torch,app]' (from the arc_warp checkout)"


def _require_torch(command: str) -> bool:
    """True when torch and the app extras import; else print how to install them."""
    for module, what in (("torch", "PyTorch"), ("PIL", "Pillow"), ("matplotlib", "matplotlib"),
                         ("tqdm", "tqdm")):
        try:
            importlib.import_module(module)
        except ImportError:
            print(f"arc-warp {command} needs {what}, which is not installed: {INSTALL_HINT}",
                  file=sys.stderr)
            return False
    return True


def cmd_train(args) -> int:
    if not _require_torch("train"):
        return 2
    if args.gpus == 1:
        return _train_rank(args)  # one process, or one rank of torchrun's
    import torch

    from arc_warp_train.distributed import env_world_size, launch

    if env_world_size() > 1:
        raise ValueError("--gpus spawns its own processes; under torchrun leave it at 1 "
                         "(torchrun's --nproc_per_node sets the process count)")
    if args.batch_size is not None and args.batch_size % args.gpus:
        raise ValueError(f"--batch-size {args.batch_size} must be a multiple of --gpus "
                         f"{args.gpus} (each process renders an equal share)")
    if args.device not in (None, "cuda", "cpu"):
        raise ValueError(f"with --gpus pass --device cuda or cpu (process r uses cuda:r), "
                         f"got {args.device!r}")
    if args.device != "cpu" and torch.cuda.device_count() < args.gpus:
        raise ValueError(f"--gpus {args.gpus} but {torch.cuda.device_count()} CUDA devices are "
                         "visible (add --device cpu for CPU processes)")
    try:
        launch(_train_rank, args.gpus, (args,))
    except (torch.multiprocessing.ProcessRaisedException,
            torch.multiprocessing.ProcessExitedException) as exc:
        print(f"arc-warp train: a training process failed:\n{exc}", file=sys.stderr)
        return 1
    return 0


def _train_rank(args) -> int:
    """`arc-warp train` in this process: alone, or as one rank of a process group described
    by torchrun's environment variables (rank 0 prints)."""
    quiet_warp()
    from arc_warp_train.datasets import load_dataset
    from arc_warp_train.densify import DensifyConfig
    from arc_warp_train.trainer import TrainConfig, train
    from arc_warp_train.distributed import init_distributed

    dist = init_distributed(args.device)
    try:
        kw = {"downscale": args.downscale}
        if args.format != "colmap" and os.path.isfile(os.path.join(args.data,
                                                                   "transforms_train.json")):
            kw["background"] = (1.0, 1.0, 1.0) if args.white_background else (0.0, 0.0, 0.0)
        dataset = load_dataset(args.data, args.format, **kw)
        dens = DensifyConfig(refine_stop=min(15000, args.steps // 2), absgrad=args.absgrad,
                             max_gaussians=args.max_gaussians)
        cfg = TrainConfig(steps=args.steps, batch_size=args.batch_size or dist.world_size,
                          sh_degree=args.sh_degree, densify=dens, eval_every=args.eval_every,
                          checkpoint_every=args.checkpoint_every, seed=args.seed,
                          device=args.device, reduce=args.reduce, init_points=args.init_points,
                          cpu_threads=args.threads, progress=not args.no_progress,
                          check_sync=args.check_sync, optimizer=args.optimizer)
        if dist.is_main:
            ranks = f", {dist.world_size} data-parallel ranks ({dist.backend})" \
                if dist.enabled else ""
            print(f"{dataset.source}: {len(dataset.train)} train / {len(dataset.test)} test "
                  f"views, scene scale {dataset.scene_scale:.3g}, {cfg.batch_size} views per "
                  f"step{ranks}")
        result = train(dataset, cfg, args.output, resume=args.resume, dist=dist)
        if dist.is_main:
            print(f"final test-view PSNR {result.psnr:.2f} dB, SSIM {result.ssim:.4f}, "
                  f"{result.num_gaussians} Gaussians, {result.wall_s:.0f} s")
            for kind, path in result.files.items():
                print(f"  {kind}: {path}")
    finally:
        dist.close()
    return 0


def cmd_demo(args) -> int:
    if not _require_torch("demo"):
        return 2
    quiet_warp()
    if args.which == "image":
        from arc_warp_train.image_fit import run_image_demo

        run_image_demo(args.output, steps=args.steps or 500, seed=args.seed,
                       device=args.device, progress=not args.no_progress)
        return 0
    from arc_warp_train.demo import demo_config, run_demo

    cfg = demo_config(args.steps or 2000, seed=args.seed, device=args.device,
                      progress=not args.no_progress)
    run_demo(args.output, cfg)
    return 0




def add_train_parser(sub) -> None:
    """Entry point: adds `arc-warp train` to the core's subparsers."""
    p = sub.add_parser("train", help="train 3DGS on a dataset (needs torch)",
                       description="Train 3D Gaussians on a NeRF-synthetic (transforms.json) "
                       "or COLMAP text dataset; writes PLY, test-view PNGs, PSNR plot, "
                       f"checkpoint. Needs PyTorch ({INSTALL_HINT}). Multi-GPU: --gpus N, or "
                       "torchrun --nproc_per_node N -m arc_warp.cli train ...")
    p.add_argument("data", help="dataset folder")
    p.add_argument("-o", "--output", default="arc_warp_train_out", help="output folder")
    p.add_argument("--format", choices=("auto", "nerf", "colmap"), default="auto")
    p.add_argument("--steps", type=positive_int, default=30000)
    p.add_argument("--sh-degree", type=int, choices=range(4), default=3)
    p.add_argument("--downscale", type=positive_int, default=1, help="image downscale factor")
    p.add_argument("--white-background", action="store_true",
                   help="composite NeRF-synthetic RGBA images on white (default black)")
    p.add_argument("--init-points", type=positive_int, default=100_000,
                   help="random initial points when the dataset has no point cloud")
    p.add_argument("--max-gaussians", type=positive_int, default=None)
    p.add_argument("--absgrad", action="store_true", help="AbsGS densification statistic")
    p.add_argument("--eval-every", type=positive_int, default=5000)
    p.add_argument("--checkpoint-every", type=int, default=5000)
    p.add_argument("--resume", default=None, help="checkpoint.pt to resume from")
    p.add_argument("--reduce", choices=REDUCE_MODES, default="arc")
    p.add_argument("--optimizer", choices=("sparse_adam", "fused_adam", "adam"), default="adam",
                   help="sparse_adam: fused Warp Adam over visible Gaussians; "
                        "fused_adam: the same over all (= torch Adam); adam: torch.optim.Adam")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="torch device (default cuda if available)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--gpus", type=positive_int, default=1,
                   help="data-parallel processes to spawn, one GPU each (NCCL); with --device "
                   "cpu, CPU processes (gloo). Under torchrun leave at 1")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="training views per step over all processes, split evenly among them "
                   "(default: one per process)")
    p.add_argument("--check-sync", action="store_true",
                   help="check at each evaluation and checkpoint that all processes hold "
                   "bitwise-equal parameters and optimizer state")
    p.set_defaults(func=cmd_train)

def add_demo_parser(sub) -> None:
    """Entry point: adds `arc-warp demo` to the core's subparsers."""
    p = sub.add_parser("demo", help="train a small built-in scene end to end (needs torch)",
                       description="'scene' (default): render a procedural scene into a "
                       "multi-view dataset and train 3DGS on it from random points; writes "
                       "ground truth | render PNGs, the PSNR plot and the PLY. 'image': fit "
                       "Gaussians to a photograph bundled with matplotlib. Fixed seed. Needs "
                       f"PyTorch and the app extras ({INSTALL_HINT}).")
    p.add_argument("which", nargs="?", choices=("scene", "image"), default="scene")
    p.add_argument("-o", "--output", default="arc_warp_demo_out", help="output folder")
    p.add_argument("--steps", type=positive_int, default=None,
                   help="training steps (default 2000 for scene, 500 for image)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="torch device (default cuda if available)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_demo)
