"""The application's `arc-warp` subcommands: `train` and `demo`.

Registered under the ``arc_warp.commands`` entry-point group (see pyproject.toml), so the
core command line finds them without importing this package. Importing this module loads
neither torch nor the trainer: each command imports them when it runs and prints how to
install what is missing.
"""

import argparse
import importlib
import os
import shlex
import sys

from arc_warp.cli import REDUCE_MODES, positive_int, prepare_output_dir, quiet_warp
from arc_warp_train.viewer import LOOPBACK, port_number

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


def _torch_device(name):
    """Check a --device for torch before any work: ValueError when CUDA is asked for and
    absent, or the name is not a device."""
    import torch

    try:
        dev = torch.device(name) if name is not None else None
    except RuntimeError as exc:
        raise ValueError(f"--device {name}: {exc}") from None
    if dev is not None and dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: torch finds no CUDA device on this machine; use "
                         "--device cpu (or install a CUDA build of torch)")
    if dev is not None and dev.type not in ("cuda", "cpu"):
        raise ValueError(f"--device {name}: only cuda and cpu devices are supported")


# Rough CPU cost of one training step, measured on a 2-core x86 machine with arc_warp's
# CPU kernels: per rendered pixel and per Gaussian (forward + backward + Adam).
CPU_S_PER_PIXEL, CPU_S_PER_GAUSSIAN = 25e-6, 40e-6


def cpu_time_estimate(dataset, steps: int, batch: int, gaussians: int) -> float:
    """Seconds a CPU run of `steps` steps would roughly take (see CPU_S_PER_PIXEL)."""
    pixels = sum(v.width * v.height for v in dataset.train) / len(dataset.train)
    return steps * (batch * pixels * CPU_S_PER_PIXEL + gaussians * CPU_S_PER_GAUSSIAN)


def resume_command(argv, checkpoint) -> str:
    """The `arc-warp train ...` line that resumes from `checkpoint` with the same options
    (less --overwrite, which would delete the checkpoint it resumes from)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--resume":
            skip = True
        elif not arg.startswith("--resume=") and arg != "--overwrite":
            out.append(arg)
    return shlex.join(["arc-warp"] + out + ["--resume", str(checkpoint)])


def cmd_train(args) -> int:
    try:
        return _cmd_train(args)
    except KeyboardInterrupt:  # before training started, or a second Ctrl-C during it
        print("arc-warp train: interrupted", file=sys.stderr)
        return 130


def _is_main_process() -> bool:
    """False in the ranks > 0 of torchrun (they leave the output folder to rank 0)."""
    return int(os.environ.get("RANK", "0")) == 0


def _cmd_train(args) -> int:
    if not _require_torch("train"):
        return 2
    _torch_device(args.device)
    if args.viewer:
        from arc_warp_train.viewer import check_listen_address, require_viser

        require_viser()
        if _is_main_process():
            check_listen_address(args.viewer_host, args.viewer_port, "--viewer-host",
                                 "--viewer-port")
    if args.resume is not None:
        from arc_warp_train.checkpoint import check_resume_steps, read_checkpoint

        # Integrity and step now; the fit to the run once the data is read.
        step = int(read_checkpoint(args.resume)["step"])
        check_resume_steps({"step": step}, args.resume, args.steps)
        if step == args.steps and _is_main_process():
            print(f"note: --resume {args.resume} is already at step {step} = --steps; nothing "
                  "is left to train, so only its outputs are written again (pass a larger "
                  "--steps to train on)", file=sys.stderr)
    if _is_main_process():
        from arc_warp_train.run_folder import check_output_folder

        check_output_folder(args.output, args.resume, args.overwrite)
    else:
        prepare_output_dir(args.output)
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
    from arc_warp_train.datasets import dataset_kind, load_dataset
    from arc_warp_train.densify import DensifyConfig
    from arc_warp_train.trainer import TrainConfig, TrainingInterrupted, train
    from arc_warp_train.distributed import init_distributed

    dist = init_distributed(args.device)
    try:
        kw = {"downscale": args.downscale, "undistort": args.undistort}
        if args.format != "colmap" and dataset_kind(args.data) == "nerf":
            kw["background"] = (1.0, 1.0, 1.0) if args.white_background else (0.0, 0.0, 0.0)
        dataset = load_dataset(args.data, args.format, **kw)
        refine_stop = min(15000, args.steps // 2) if args.refine_stop is None else args.refine_stop
        dens = DensifyConfig(refine_stop=refine_stop, absgrad=args.absgrad,
                             max_gaussians=args.max_gaussians)
        cfg = TrainConfig(steps=args.steps, batch_size=args.batch_size or dist.world_size,
                          sh_degree=args.sh_degree, densify=dens, eval_every=args.eval_every,
                          checkpoint_every=args.checkpoint_every, seed=args.seed,
                          device=args.device, reduce=args.reduce, init_points=args.init_points,
                          cpu_threads=args.threads, progress=not args.no_progress,
                          check_sync=args.check_sync, optimizer=args.optimizer,
                          capture=False if args.eager else None)
        if dist.is_main:
            for line in dataset.extras.get("camera_notes", []):
                print(f"note: {line}", file=sys.stderr)
        skipped = dataset.extras.get("skipped_frames", [])
        if dist.is_main and skipped:
            print(f"note: {len(skipped)} frames have no image file and are left out, as "
                  f"instant-ngp does (first: {skipped[0]})", file=sys.stderr)
        if dist.is_main:
            ranks = f", {dist.world_size} data-parallel ranks ({dist.backend})" \
                if dist.enabled else ""
            print(f"{dataset.source}: {len(dataset.train)} train / {len(dataset.test)} test "
                  f"views, scene scale {dataset.scene_scale:.3g}, {cfg.batch_size} views per "
                  f"step{ranks}")
        if dist.is_main and (args.device == "cpu" or (args.device is None and
                                                     not torch_cuda_available())):
            init = len(dataset.points) if dataset.points is not None else cfg.init_points
            hours = cpu_time_estimate(dataset, cfg.steps, cfg.batch_size, init) / 3600.0
            if hours > 1.0:
                print(f"warning: training on the CPU; {cfg.steps} steps at this image size "
                      f"would take roughly {hours:.0f} h. For a quick CPU run lower --steps "
                      "and --init-points or raise --downscale; or train on a GPU.",
                      file=sys.stderr)
        viewer = on_step = None
        if args.viewer and dist.is_main:
            from arc_warp_train.viewer import GaussianSource, Lens, TrainingView, Viewer, serving_notice

            first = dataset.train[0]  # its lens in the "camera" menu, unless a plain pinhole
            lenses = {"pinhole": None, **({f"capture ({first.lens})": Lens.of_view(first)}
                                          if first.lens != "pinhole" else {})}
            viewer = Viewer(GaussianSource(), port=args.viewer_port, host=args.viewer_host,
                            device=args.device, stats=("step", "PSNR", "Gaussians"), lenses=lenses)
            on_step = TrainingView(viewer)
            url, *warning = serving_notice(args.viewer_host, viewer.port, "--viewer-host")
            print(f"viewer: {url}", flush=True)
            for line in warning:
                print(line, file=sys.stderr)
        try:
            result = train(dataset, cfg, args.output, resume=args.resume, dist=dist,
                           on_step=on_step, overwrite=args.overwrite)
        except TrainingInterrupted as stop:
            print(f"arc-warp train: {stop}\nresume with: "
                  f"{resume_command(getattr(args, 'argv', None) or sys.argv[1:], stop.path)}",
                  file=sys.stderr)
            return 130
        finally:
            if viewer is not None:
                viewer.close()
        if dist.is_main:
            print(f"final test-view PSNR {result.psnr:.2f} dB, SSIM {result.ssim:.4f}, "
                  f"{result.num_gaussians} Gaussians, {result.wall_s:.0f} s; "
                  f"{training_line(result.training)}")
            for kind, path in result.files.items():
                print(f"  {kind}: {path}")
    finally:
        dist.close()
    return 0


def training_line(training: dict) -> str:
    """`Trainer.training_summary` in words: steps, their seconds and rate, the step mode."""
    rate = f"{training['it_per_s']:.1f} it/s" if training["it_per_s"] else "no steps timed"
    line = f"{training['steps']} steps in {training['seconds']:.1f} s ({rate}), {training['mode']}"
    if training["mode"] == "captured":
        line += (f": {training['captures']} graphs captured ({training['recaptures']} recaptures), "
                 f"{training['skipped_steps']} steps skipped")
    return line


def torch_cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def cmd_demo(args) -> int:
    if not _require_torch("demo"):
        return 2
    _torch_device(args.device)
    if args.which == "image":
        prepare_output_dir(args.output)
    else:
        from arc_warp_train.run_folder import check_output_folder

        check_output_folder(args.output, overwrite=args.overwrite)
    quiet_warp()
    try:
        if args.which == "image":
            from arc_warp_train.image_fit import run_image_demo

            run_image_demo(args.output, steps=args.steps or 500, seed=args.seed,
                           device=args.device, progress=not args.no_progress)
            return 0
        from arc_warp_train.demo import demo_config, run_demo

        cfg = demo_config(args.steps or 2000, seed=args.seed, device=args.device,
                          progress=not args.no_progress)
        run_demo(args.output, cfg, overwrite=args.overwrite)
    except KeyboardInterrupt:
        print("arc-warp demo: interrupted", file=sys.stderr)
        return 130
    return 0


def add_train_parser(sub) -> None:
    """Entry point: adds `arc-warp train` to the core's subparsers."""
    p = sub.add_parser("train", help="train 3DGS on a dataset (needs torch)",
                       description="Train 3D Gaussians on a transforms.json "
                       "(NeRF-synthetic, nerfstudio, instant-ngp) or COLMAP (binary or text) dataset, "
                       "rendering each capture's own camera (pinhole, OpenCV distortion, fisheye) over "
                       "the full frame; writes PLY, test-view PNGs, PSNR plot, "
                       f"checkpoint. Needs PyTorch ({INSTALL_HINT}). Multi-GPU: --gpus N, or "
                       "torchrun --nproc_per_node N -m arc_warp.cli train ...",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("data", help="dataset folder")
    p.add_argument("-o", "--output", default="arc_warp_train_out",
                   help="output folder; one that holds another run's results is refused "
                   "unless --resume continues that run or --overwrite is given")
    p.add_argument("--overwrite", action="store_true",
                   help="delete an earlier run's results in the output folder first (the files "
                   "a run writes: checkpoint.pt, point_cloud.ply, metrics.json, psnr.png, "
                   "test_views/view_NNN.png; nothing else)")
    p.add_argument("--format", choices=("auto", "nerf", "colmap"), default="auto",
                   help="dataset layout (auto: detect)")
    p.add_argument("--steps", type=positive_int, default=30000,
                   help="training steps")
    p.add_argument("--sh-degree", type=int, choices=range(4), default=3,
                   help="spherical-harmonics degree")
    p.add_argument("--downscale", type=positive_int, default=1,
                   help="image downscale factor; images_N folders are used when present")
    p.add_argument("--undistort", action="store_true",
                   help="resample the images of distorted and fisheye cameras to pinhole cameras on "
                   "load (pycolmap; crops a fisheye's field of view) instead of rendering the "
                   "capture's own lens; models the renderer cannot draw are undistorted anyway")
    p.add_argument("--white-background", action="store_true",
                   help="composite NeRF-synthetic RGBA images on white (default black)")
    p.add_argument("--init-points", type=positive_int, default=100_000,
                   help="random initial points when the dataset has no point cloud")
    p.add_argument("--max-gaussians", type=positive_int, default=None,
                   help="cap on the Gaussian count (None: no cap)")
    p.add_argument("--absgrad", action="store_true", help="AbsGS densification statistic")
    p.add_argument("--refine-stop", type=positive_int, default=None,
                   help="last densification step (None: min(15000, steps / 2); INRIA's "
                   "train.py densifies until 15000 whatever --iterations is)")
    p.add_argument("--eval-every", type=positive_int, default=5000,
                   help="steps between held-out evaluations")
    p.add_argument("--checkpoint-every", type=int, default=5000,
                   help="steps between checkpoints (0: only at the end; Ctrl-C also saves one)")
    p.add_argument("--resume", default=None,
                   help="checkpoint.pt to resume from; give the run's folder as -o to continue "
                   "it in place")
    p.add_argument("--reduce", choices=REDUCE_MODES, default="arc",
                   help="backward reduction mode")
    p.add_argument("--optimizer", choices=("sparse_adam", "fused_adam", "adam"), default="adam",
                   help="sparse_adam: fused Warp Adam over visible Gaussians; "
                        "fused_adam: the same over all (= torch Adam); adam: torch.optim.Adam")
    p.add_argument("--eager", action="store_true",
                   help="run every step in Python (render, backward, optimizer step each launched "
                   "from the host). Default: on CUDA each step is replayed from a CUDA graph, captured "
                   "again after each densification, SH degree change and new image size (with every "
                   "--optimizer the graph steps arc_warp's fused Adam, which skips a step whose render "
                   "overflowed); on the CPU steps are eager")
    p.add_argument("--seed", type=int, default=0,
                   help="random seed")
    p.add_argument("--device", default=None, help="torch device (None: cuda if available)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--gpus", type=positive_int, default=1,
                   help="data-parallel processes to spawn, one GPU each (NCCL); with --device "
                   "cpu, CPU processes (gloo); their steps are eager. Under torchrun leave at 1")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="training views per step over all processes, split evenly among them "
                   "(None: one per process)")
    p.add_argument("--check-sync", action="store_true",
                   help="check at each evaluation and checkpoint that all processes hold "
                   "bitwise-equal parameters and optimizer state")
    p.add_argument("--viewer", action="store_true",
                   help="serve a live view of the model while training (viser; rank 0)")
    p.add_argument("--viewer-port", type=port_number, default=8080,
                   help="viewer HTTP port (0: any free port, printed)")
    p.add_argument("--viewer-host", default=LOOPBACK,
                   help="address the viewer listens on; the default serves this machine only, "
                   "another (e.g. 0.0.0.0) exposes the unauthenticated viewer to the network")
    p.set_defaults(func=cmd_train)

def add_demo_parser(sub) -> None:
    """Entry point: adds `arc-warp demo` to the core's subparsers."""
    p = sub.add_parser("demo", help="train a small built-in scene end to end (needs torch)",
                       description="'scene' (default): render a procedural scene into a "
                       "multi-view dataset and train 3DGS on it from random points; writes "
                       "ground truth | render PNGs, the PSNR plot and the PLY. 'image': fit "
                       "Gaussians to a photograph bundled with matplotlib. Fixed seed. Needs "
                       f"PyTorch and the app extras ({INSTALL_HINT}).",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("which", nargs="?", choices=("scene", "image"), default="scene",
                   help="what to fit")
    p.add_argument("-o", "--output", default="arc_warp_demo_out",
                   help="output folder ('scene' refuses one holding an earlier run's results "
                   "unless --overwrite is given)")
    p.add_argument("--overwrite", action="store_true",
                   help="'scene': delete an earlier run's results in the output folder first "
                   "(only the files a run writes)")
    p.add_argument("--steps", type=positive_int, default=None,
                   help="training steps (None: 2000 for scene, 500 for image)")
    p.add_argument("--seed", type=int, default=0,
                   help="random seed")
    p.add_argument("--device", default=None, help="torch device (None: cuda if available)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_demo)
