"""`arc-warp` command line: render, train, bench, demo.

`render` and `bench` need only the core (warp, numpy); `train` and `demo` import torch
and the `arc_warp_torch` plugin lazily and say how to install them when missing.
"""

import argparse
import math
import os
import struct
import sys
import zlib

import numpy as np

TORCH_HINT = "pip install arc-warp[torch]"
APP_HINT = "pip install arc-warp[app]"


def _floats(text: str, count: int, name: str):
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != count:
        raise argparse.ArgumentTypeError(f"{name}: expected {count} comma-separated numbers, "
                                         f"got {text!r}")
    return values


def _vec3(text):
    return _floats(text, 3, "vector")


def _positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text}")
    return value


def write_png(path, rgb: np.ndarray) -> None:
    """Write an (H,W,3) float image in [0,1] (clipped) as an 8-bit RGB PNG (zlib only)."""
    img = (np.clip(rgb, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    h, w = img.shape[:2]
    raw = b"".join(b"\x00" + img[y].tobytes() for y in range(h))

    def chunk(tag, data):
        return (struct.pack(">I", len(data)) + tag + data
                + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF))

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def _require_torch(command: str) -> bool:
    """True when torch and the app extras import; else print how to install them."""
    import importlib

    for module, what, hint in (("torch", "PyTorch", TORCH_HINT), ("PIL", "Pillow", APP_HINT),
                               ("matplotlib", "matplotlib", APP_HINT), ("tqdm", "tqdm", APP_HINT)):
        try:
            importlib.import_module(module)
        except ImportError:
            print(f"arc-warp {command} needs {what}, which is not installed: {hint}",
                  file=sys.stderr)
            return False
    return True


def _quiet_warp():
    import warp as wp

    wp.config.log_level = wp.LOG_WARNING
    return wp


def _orbit_eyes(center, radius, up, views, elevation_deg, fov_deg, distance):
    """Camera positions on a circle around `center`, `elevation_deg` above the plane
    normal to `up`, far enough for a sphere of `radius` to fit in the field of view."""
    up = np.asarray(up, float) / np.linalg.norm(up)
    helper = np.eye(3)[np.argmin(np.abs(up))]
    a = np.cross(up, helper)
    a /= np.linalg.norm(a)
    b = np.cross(up, a)
    dist = distance or 1.15 * radius / math.sin(0.5 * math.radians(fov_deg))
    el = math.radians(elevation_deg)
    for k in range(views):
        az = 2.0 * math.pi * k / views
        yield center + dist * (math.cos(el) * (math.cos(az) * a + math.sin(az) * b)
                               + math.sin(el) * up)


def cmd_render(args) -> int:
    wp = _quiet_warp()
    from arc_warp import Camera, RenderSettings, render_gaussians
    from arc_warp.ply import read_ply

    ply = read_ply(args.ply)
    if ply.sh_degree > 3:
        print(f"{args.ply}: SH degree {ply.sh_degree} is not supported (0..3)", file=sys.stderr)
        return 2
    g = ply.activated()
    center = np.median(g["means"], axis=0).astype(float)
    radius = float(np.quantile(np.linalg.norm(g["means"] - center, axis=1), 0.9)) or 1.0
    settings = RenderSettings(background=args.background, reduce=args.reduce)
    out_base, ext = os.path.splitext(args.output)
    written = []
    with wp.ScopedDevice(args.device):
        arrays = [wp.array(g[k], dtype=t) for k, t in (("means", wp.vec3), ("quats", wp.vec4),
                                                       ("scales", wp.vec3),
                                                       ("opacities", wp.float32),
                                                       ("sh", wp.vec3))]
        eyes = _orbit_eyes(center, radius, args.up, args.views, args.elevation, args.fov,
                           args.distance)
        for k, eye in enumerate(eyes):
            cam = Camera.look_at(eye, center, args.up, args.fov, args.width, args.height)
            out = render_gaussians(*arrays, cam, settings)
            path = args.output if args.views == 1 else f"{out_base}_{k:03d}{ext or '.png'}"
            write_png(path, out.color.numpy())
            written.append(path)
    print(f"rendered {ply.num_gaussians} Gaussians ({args.width}x{args.height}) -> "
          + ", ".join(written))
    return 0


def cmd_train(args) -> int:
    if not _require_torch("train"):
        return 2
    if args.gpus == 1:
        return _train_rank(args)  # one process, or one rank of torchrun's
    import torch

    from arc_warp_torch.train.distributed import env_world_size, launch

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
    _quiet_warp()
    from arc_warp_torch.train import DensifyConfig, TrainConfig, load_dataset, train
    from arc_warp_torch.train.distributed import init_distributed

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
                          check_sync=args.check_sync)
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


def _bench_cloud(n: int, seed: int):
    """A random cloud of `n` Gaussians in a ball of radius ~1 (benchmark workload)."""
    rng = np.random.default_rng(seed)
    f32 = np.float32
    return (rng.normal(0.0, 0.5, (n, 3)).astype(f32), rng.normal(size=(n, 4)).astype(f32),
            np.exp(rng.uniform(np.log(0.01), np.log(0.06), (n, 3))).astype(f32),
            rng.uniform(0.3, 0.95, n).astype(f32), rng.uniform(0.0, 1.0, (n, 3)).astype(f32))


def cmd_bench(args) -> int:
    wp = _quiet_warp()
    from arc_warp import Camera, RenderSettings, render_gaussians, render_gaussians_backward
    from arc_warp._src.timing import median_time_ms

    if args.ply:
        from arc_warp.ply import read_ply

        g = read_ply(args.ply).activated()
        host = (g["means"], g["quats"], g["scales"], g["opacities"], g["sh"])
        center = np.median(g["means"], axis=0).astype(float)
        radius = float(np.quantile(np.linalg.norm(g["means"] - center, axis=1), 0.9)) or 1.0
    else:
        host = _bench_cloud(args.num_gaussians, args.seed)
        center, radius = np.zeros(3), 1.0
    eye = next(_orbit_eyes(center, radius, (0.0, 0.0, 1.0), 1, 20.0, 45.0, None))
    cam = Camera.look_at(eye, center, (0.0, 0.0, 1.0), 45.0, args.width, args.height)
    device = wp.get_device(args.device)
    print(f"{host[0].shape[0]} Gaussians, {args.width}x{args.height}, device {device}, "
          f"median of {args.reps}")
    print(f"{'mode':>8} {'forward ms':>11} {'backward ms':>12}")
    with wp.ScopedDevice(device):
        arrays = [wp.array(a, dtype=t) for a, t in zip(
            host, (wp.vec3, wp.vec4, wp.vec3, wp.float32, wp.vec3))]
        grad = wp.array(np.random.default_rng(args.seed).normal(
            size=(args.height, args.width, 3)).astype(np.float32), dtype=wp.vec3)
        for mode in args.modes.split(","):
            settings = RenderSettings(reduce=mode.strip())
            out = render_gaussians(*arrays, cam, settings)
            fwd = median_time_ms(lambda: render_gaussians(*arrays, cam, settings), device,
                                 warmup=1, reps=args.reps)
            bwd = median_time_ms(lambda: render_gaussians_backward(out, grad), device,
                                 warmup=1, reps=args.reps)
            print(f"{settings.reduce:>8} {fwd:11.3f} {bwd:12.3f}")
    return 0


def cmd_demo(args) -> int:
    if not _require_torch("demo"):
        return 2
    _quiet_warp()
    if args.which == "image":
        from arc_warp_torch.train.image_fit import run_image_demo

        run_image_demo(args.output, steps=args.steps or 500, seed=args.seed,
                       device=args.device, progress=not args.no_progress)
        return 0
    from arc_warp_torch.train.demo import demo_config, run_demo

    cfg = demo_config(args.steps or 2000, seed=args.seed, device=args.device,
                      progress=not args.no_progress)
    run_demo(args.output, cfg)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="arc-warp", description="Differentiable Gaussian splatting in NVIDIA Warp with "
        "ARC warp-level reduction in the backward pass.")
    sub = parser.add_subparsers(dest="command", required=True)
    reduce_modes = ("atomic", "warp", "serial", "arc")

    p = sub.add_parser("render", help="render a 3DGS PLY file to PNG (core only, no torch)",
                       description="Render a standard 3DGS PLY from cameras orbiting its centre.")
    p.add_argument("ply", help="3DGS PLY file (binary little-endian)")
    p.add_argument("-o", "--output", default="render.png",
                   help="PNG path; with --views > 1 an index is appended (default render.png)")
    p.add_argument("--width", type=_positive_int, default=256)
    p.add_argument("--height", type=_positive_int, default=256)
    p.add_argument("--fov", type=float, default=40.0, help="vertical field of view, degrees")
    p.add_argument("--views", type=_positive_int, default=1, help="cameras around the scene")
    p.add_argument("--elevation", type=float, default=25.0, help="camera elevation, degrees")
    p.add_argument("--distance", type=float, default=None,
                   help="camera distance to the scene centre (default: fit the scene)")
    p.add_argument("--up", type=_vec3, default=(0.0, 0.0, 1.0), help="world up, e.g. 0,-1,0")
    p.add_argument("--background", type=_vec3, default=(0.0, 0.0, 0.0), help="RGB in [0,1]")
    p.add_argument("--reduce", choices=reduce_modes, default="arc")
    p.add_argument("--device", default=None, help="warp device (default: warp's default)")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("train", help="train 3DGS on a dataset (needs torch)",
                       description="Train 3D Gaussians on a NeRF-synthetic (transforms.json) "
                       "or COLMAP text dataset; writes PLY, test-view PNGs, PSNR plot, "
                       f"checkpoint. Needs PyTorch ({TORCH_HINT}). Multi-GPU: --gpus N, or "
                       "torchrun --nproc_per_node N -m arc_warp.cli train ...")
    p.add_argument("data", help="dataset folder")
    p.add_argument("-o", "--output", default="arc_warp_train_out", help="output folder")
    p.add_argument("--format", choices=("auto", "nerf", "colmap"), default="auto")
    p.add_argument("--steps", type=_positive_int, default=30000)
    p.add_argument("--sh-degree", type=int, choices=range(4), default=3)
    p.add_argument("--downscale", type=_positive_int, default=1, help="image downscale factor")
    p.add_argument("--white-background", action="store_true",
                   help="composite NeRF-synthetic RGBA images on white (default black)")
    p.add_argument("--init-points", type=_positive_int, default=100_000,
                   help="random initial points when the dataset has no point cloud")
    p.add_argument("--max-gaussians", type=_positive_int, default=None)
    p.add_argument("--absgrad", action="store_true", help="AbsGS densification statistic")
    p.add_argument("--eval-every", type=_positive_int, default=5000)
    p.add_argument("--checkpoint-every", type=int, default=5000)
    p.add_argument("--resume", default=None, help="checkpoint.pt to resume from")
    p.add_argument("--reduce", choices=reduce_modes, default="arc")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="torch device (default cuda if available)")
    p.add_argument("--threads", type=_positive_int, default=None, help="torch CPU threads")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--gpus", type=_positive_int, default=1,
                   help="data-parallel processes to spawn, one GPU each (NCCL); with --device "
                   "cpu, CPU processes (gloo). Under torchrun leave at 1")
    p.add_argument("--batch-size", type=_positive_int, default=None,
                   help="training views per step over all processes, split evenly among them "
                   "(default: one per process)")
    p.add_argument("--check-sync", action="store_true",
                   help="check at each evaluation and checkpoint that all processes hold "
                   "bitwise-equal parameters and optimizer state")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("bench", help="time forward/backward per reduction mode (core only)",
                       description="Median forward and backward times of one render for each "
                       "reduction mode, on a PLY or a random Gaussian cloud.")
    p.add_argument("--ply", default=None, help="3DGS PLY to render (default: random cloud)")
    p.add_argument("--num-gaussians", type=_positive_int, default=20000)
    p.add_argument("--width", type=_positive_int, default=256)
    p.add_argument("--height", type=_positive_int, default=256)
    p.add_argument("--modes", default="atomic,warp,serial,arc",
                   help="comma-separated reduction modes")
    p.add_argument("--reps", type=_positive_int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="warp device (default: warp's default)")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("demo", help="train a small built-in scene end to end (needs torch)",
                       description="'scene' (default): render a procedural scene into a "
                       "multi-view dataset and train 3DGS on it from random points; writes "
                       "ground truth | render PNGs, the PSNR plot and the PLY. 'image': fit "
                       "Gaussians to a photograph bundled with matplotlib. Fixed seed. Needs "
                       f"PyTorch ({TORCH_HINT}) and the app extras ({APP_HINT}).")
    p.add_argument("which", nargs="?", choices=("scene", "image"), default="scene")
    p.add_argument("-o", "--output", default="arc_warp_demo_out", help="output folder")
    p.add_argument("--steps", type=_positive_int, default=None,
                   help="training steps (default 2000 for scene, 500 for image)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="torch device (default cuda if available)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv=None) -> int:
    """Entry point of the `arc-warp` script; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"arc-warp {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
