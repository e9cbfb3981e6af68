"""`arc-warp` command line: the core's `render` and `bench`, plus discovered commands.

`render` and `bench` need only the core (warp, numpy). Other subcommands (`train`,
`demo`, ...) belong to applications and plugins, which register them under the entry-point
group ``arc_warp.commands``: each entry point is a function ``add_parser(subparsers)``
that adds its subparser and sets ``func``. The core imports no plugin: it loads whatever
is registered, so the command line grows with what is installed.
"""

import argparse
import math
import os
import struct
import sys
import zlib

from importlib.metadata import entry_points

import numpy as np

from arc_warp.arc import MODES

REDUCE_MODES = tuple(m for m in MODES if m != "floor")
"""Modes a user may pick (``floor`` is for benchmarks only)."""

COMMAND_GROUP = "arc_warp.commands"
"""Entry-point group of subcommands contributed by applications and plugins."""


def _floats(text: str, count: int, name: str):
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != count:
        raise argparse.ArgumentTypeError(f"{name}: expected {count} comma-separated numbers, "
                                         f"got {text!r}")
    return values


def vec3(text):
    return _floats(text, 3, "vector")


def positive_int(text):
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


def quiet_warp():
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
    wp = quiet_warp()
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


def _bench_cloud(n: int, seed: int):
    """A random cloud of `n` Gaussians in a ball of radius ~1 (benchmark workload)."""
    rng = np.random.default_rng(seed)
    f32 = np.float32
    return (rng.normal(0.0, 0.5, (n, 3)).astype(f32), rng.normal(size=(n, 4)).astype(f32),
            np.exp(rng.uniform(np.log(0.01), np.log(0.06), (n, 3))).astype(f32),
            rng.uniform(0.3, 0.95, n).astype(f32), rng.uniform(0.0, 1.0, (n, 3)).astype(f32))


def cmd_bench(args) -> int:
    wp = quiet_warp()
    from arc_warp import Camera, RenderSettings, render_gaussians, render_gaussians_backward
    from arc_warp._src.arc.timing import median_time_ms

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="arc-warp", description="Differentiable Gaussian splatting in NVIDIA Warp with "
        "ARC warp-level reduction in the backward pass.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("render", help="render a 3DGS PLY file to PNG (core only, no torch)",
                       description="Render a standard 3DGS PLY from cameras orbiting its centre.")
    p.add_argument("ply", help="3DGS PLY file (binary little-endian)")
    p.add_argument("-o", "--output", default="render.png",
                   help="PNG path; with --views > 1 an index is appended (default render.png)")
    p.add_argument("--width", type=positive_int, default=256)
    p.add_argument("--height", type=positive_int, default=256)
    p.add_argument("--fov", type=float, default=40.0, help="vertical field of view, degrees")
    p.add_argument("--views", type=positive_int, default=1, help="cameras around the scene")
    p.add_argument("--elevation", type=float, default=25.0, help="camera elevation, degrees")
    p.add_argument("--distance", type=float, default=None,
                   help="camera distance to the scene centre (default: fit the scene)")
    p.add_argument("--up", type=vec3, default=(0.0, 0.0, 1.0), help="world up, e.g. 0,-1,0")
    p.add_argument("--background", type=vec3, default=(0.0, 0.0, 0.0), help="RGB in [0,1]")
    p.add_argument("--reduce", choices=REDUCE_MODES, default="arc")
    p.add_argument("--device", default=None, help="warp device (default: warp's default)")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("bench", help="time forward/backward per reduction mode (core only)",
                       description="Median forward and backward times of one render for each "
                       "reduction mode, on a PLY or a random Gaussian cloud.")
    p.add_argument("--ply", default=None, help="3DGS PLY to render (default: random cloud)")
    p.add_argument("--num-gaussians", type=positive_int, default=20000)
    p.add_argument("--width", type=positive_int, default=256)
    p.add_argument("--height", type=positive_int, default=256)
    p.add_argument("--modes", default="atomic,warp,serial,arc",
                   help="comma-separated reduction modes")
    p.add_argument("--reps", type=positive_int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="warp device (default: warp's default)")
    p.set_defaults(func=cmd_bench)

    for entry in sorted(entry_points(group=COMMAND_GROUP), key=lambda e: e.name):
        entry.load()(sub)

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
