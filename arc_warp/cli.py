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
import sys
import tempfile

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
    if len(values) != count or not all(math.isfinite(v) for v in values):
        raise argparse.ArgumentTypeError(f"{name}: expected {count} comma-separated numbers "
                                         f"(finite), got {text!r}")
    return values


def vec3(text):
    return _floats(text, 3, "vector")


def unit_rgb(text):
    """An RGB colour 'r,g,b' with each component in [0, 1]."""
    rgb = _floats(text, 3, "colour")
    if not all(0.0 <= v <= 1.0 for v in rgb):
        raise argparse.ArgumentTypeError(f"colour components must lie in [0, 1], got {text!r}")
    return rgb


def _positive(text, kind, what):
    try:
        value = kind(text)
    except ValueError:
        value = 0
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_int(text):
    return _positive(text, int, "an integer >= 1")


def positive_float(text):
    return _positive(text, float, "a finite number > 0")


def quiet_warp():
    import warp as wp

    wp.config.log_level = wp.LOG_WARNING
    return wp


def warp_device(name):
    """The Warp device called `name` (None: Warp's default), or ValueError saying why not."""
    wp = quiet_warp()
    if name is not None and str(name).startswith("cuda") and not wp.is_cuda_available():
        raise ValueError(f"--device {name}: Warp finds no CUDA device on this machine; "
                         "use --device cpu")
    try:
        return wp.get_device(name)
    except (ValueError, RuntimeError) as exc:
        raise ValueError(f"--device {name}: {exc}") from None


def prepare_output_dir(path, option: str = "-o") -> str:
    """Create folder `path` and check that a file can be written in it, before any work is
    done; ValueError naming the folder and the reason otherwise."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{option} {path}: a file of that name exists; give a folder")
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise ValueError(f"{option} {path}: cannot write there ({exc.strerror or exc}); "
                         "pick a writable folder") from None
    return path


def _png_outputs(output: str, views: int) -> list:
    """The PNG paths `render` will write, checked (extension, folder writable) up front."""
    base, ext = os.path.splitext(output)
    if os.path.isdir(output):
        raise ValueError(f"-o {output} is a folder; give a file name such as "
                         f"{os.path.join(output, 'render.png')}")
    if ext.lower() not in (".png", ""):
        raise ValueError(f"-o {output}: render writes PNG images only; use a .png name")
    prepare_output_dir(os.path.dirname(output) or ".")
    if views == 1:
        return [output if ext else output + ".png"]
    return [f"{base}_{k:03d}.png" for k in range(views)]


def load_gaussians(path) -> dict:
    """A 3DGS PLY -> activated arrays (see GaussianPly.activated), refusing files with no
    Gaussians, SH degree > 3 or non-finite values (naming the property and vertex)."""
    from arc_warp.ply import read_ply

    ply = read_ply(path)
    if ply.num_gaussians == 0:
        raise ValueError(f"{path}: the PLY holds no Gaussians (0 vertices); nothing to render")
    if ply.sh_degree > 3:
        raise ValueError(f"{path}: SH degree {ply.sh_degree} is not supported (0..3)")
    rest = ply.sh_rest.transpose(0, 2, 1).reshape(ply.num_gaussians, -1)  # file order
    fields = [("x", "y", "z"), ("f_dc_0", "f_dc_1", "f_dc_2"),
              tuple(f"f_rest_{i}" for i in range(rest.shape[1])), ("opacity",),
              ("scale_0", "scale_1", "scale_2"), ("rot_0", "rot_1", "rot_2", "rot_3")]
    for names, values in zip(fields, (ply.means, ply.sh_dc, rest, ply.opacity_logits[:, None],
                                      ply.log_scales, ply.quats)):
        bad = np.argwhere(~np.isfinite(values))
        if len(bad):
            row, col = bad[0]
            raise ValueError(f"{path}: property {names[col]} of vertex {row} is "
                             f"{values[row, col]}; fix or remove that Gaussian")
    return ply.activated()


def _fit(g) -> tuple:
    """(centre, radius): the median of the means and the 90 % quantile of their distances."""
    center = np.median(g["means"], axis=0).astype(float)
    radius = float(np.quantile(np.linalg.norm(g["means"] - center, axis=1), 0.9)) or 1.0
    return center, radius


def orbit(center, radius, up, views, elevation_deg, fov_deg, distance, width, height):
    """`views` cameras evenly around `center` at `elevation_deg`, at `distance` or far
    enough for a sphere of `radius` to fit in the vertical field of view `fov_deg`."""
    from arc_warp import Camera

    dist = distance or 1.15 * radius / math.sin(0.5 * math.radians(fov_deg))
    return Camera.orbit([2.0 * math.pi * k / views for k in range(views)],
                        [math.radians(elevation_deg)] * views, dist, fov_deg, width, height,
                        center, up)


def cmd_render(args) -> int:
    wp = quiet_warp()
    from arc_warp import RenderSettings, render_gaussians, write_png

    if not 0.0 < args.fov < 180.0:
        raise ValueError(f"--fov {args.fov}: the field of view must lie in (0, 180) degrees")
    paths = _png_outputs(args.output, args.views)
    device = warp_device(args.device)
    g = load_gaussians(args.ply)
    center, radius = _fit(g)
    settings = RenderSettings(background=args.background, reduce=args.reduce)
    with wp.ScopedDevice(device):
        arrays = [wp.array(g[k], dtype=t) for k, t in (("means", wp.vec3), ("quats", wp.vec4),
                                                       ("scales", wp.vec3),
                                                       ("opacities", wp.float32),
                                                       ("sh", wp.vec3))]
        cams = orbit(center, radius, args.up, args.views, args.elevation, args.fov,
                     args.distance, args.width, args.height)
        for cam, path in zip(cams, paths):
            write_png(path, render_gaussians(*arrays, cam, settings).color.numpy())
    print(f"rendered {len(g['means'])} Gaussians ({args.width}x{args.height}) -> "
          + ", ".join(paths))
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
    from arc_warp import RenderSettings, render_gaussians, render_gaussians_backward
    from arc_warp._src.arc.timing import median_time_ms

    device = warp_device(args.device)
    if args.ply:
        g = load_gaussians(args.ply)
        host = (g["means"], g["quats"], g["scales"], g["opacities"], g["sh"])
        center, radius = _fit(g)
    else:
        host = _bench_cloud(args.num_gaussians, args.seed)
        center, radius = np.zeros(3), 1.0
    cam = orbit(center, radius, (0.0, 0.0, 1.0), 1, 20.0, 45.0, None, args.width,
                args.height)[0]
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
                       description="Render a standard 3DGS PLY from cameras orbiting its centre.",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("ply", help="3DGS PLY file (binary little-endian)")
    p.add_argument("-o", "--output", default="render.png",
                   help="PNG path; with --views > 1 an index is appended")
    p.add_argument("--width", type=positive_int, default=256,
                   help="image width, pixels")
    p.add_argument("--height", type=positive_int, default=256,
                   help="image height, pixels")
    p.add_argument("--fov", type=float, default=40.0, help="vertical field of view, degrees")
    p.add_argument("--views", type=positive_int, default=1, help="cameras around the scene")
    p.add_argument("--elevation", type=float, default=25.0, help="camera elevation, degrees")
    p.add_argument("--distance", type=positive_float, default=None,
                   help="camera distance to the scene centre (> 0; None fits the scene)")
    p.add_argument("--up", type=vec3, default=(0.0, 0.0, 1.0), help="world up, e.g. 0,-1,0")
    p.add_argument("--background", type=unit_rgb, default=(0.0, 0.0, 0.0),
                   help="RGB, each in [0,1]")
    p.add_argument("--reduce", choices=REDUCE_MODES, default="arc",
                   help="backward reduction mode")
    p.add_argument("--device", default=None, help="warp device (None: warp's default)")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("bench", help="time forward/backward per reduction mode (core only)",
                       description="Median forward and backward times of one render for each "
                       "reduction mode, on a PLY or a random Gaussian cloud.",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--ply", default=None, help="3DGS PLY to render (default: random cloud)")
    p.add_argument("--num-gaussians", type=positive_int, default=20000,
                   help="Gaussians in the random cloud")
    p.add_argument("--width", type=positive_int, default=256,
                   help="image width, pixels")
    p.add_argument("--height", type=positive_int, default=256,
                   help="image height, pixels")
    p.add_argument("--modes", default="atomic,warp,serial,arc",
                   help="comma-separated reduction modes")
    p.add_argument("--reps", type=positive_int, default=10,
                   help="timed repetitions per mode")
    p.add_argument("--seed", type=int, default=0,
                   help="random seed")
    p.add_argument("--device", default=None, help="warp device (None: warp's default)")
    p.set_defaults(func=cmd_bench)

    for entry in sorted(entry_points(group=COMMAND_GROUP), key=lambda e: e.name):
        entry.load()(sub)

    return parser


def main(argv=None) -> int:
    """Entry point of the `arc-warp` script; returns the exit status."""
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # e.g. for a resume hint
    try:
        return args.func(args)
    except (ValueError, OSError, ImportError) as exc:
        # Every expected failure is one line naming the file or option and what to do.
        print(f"arc-warp {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
