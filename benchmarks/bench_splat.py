"""3DGS forward/backward benchmark against peers (needs a CUDA GPU).

Scene: N Gaussians spread through the view frustum (depth 2..12), anisotropic
scales, random rotations, opacities in [0.05, 1], SH degree 3, 1920x1080, pinhole
camera at the origin looking down +z. Gaussians shrink as N grows (scales times
(1e6/N)^(1/3)), as in denser reconstructions.

Timed with CUDA events after warm-up, medians:
  * arc_warp forward, and backward for every reduce mode (``deterministic``
    included) plus ``floor`` (the same
    backward without gradient atomics), both the whole backward and the rasteriser
    backward alone (where the accumulation happens);
  * gsplat 1.5.3 (packed and unpacked) and gswarp 1.1.0 when importable, on the
    same scene, camera and cotangent.
Agreement with gsplat: image PSNR and per-parameter gradient cosine similarity.

Usage::

    python benchmarks/bench_splat.py --n 1000000 [--n 300000 ...] [--json out.json]
"""

import argparse
import json
import math
import sys

import numpy as np
import warp as wp

import arc_warp
from arc_warp._src.splat.raster_ops import raster_backward
from arc_warp._src.arc.timing import median_times_ms

WIDTH, HEIGHT = 1920, 1080
SH_DEGREE = 3
MODES = ("atomic", "warp", "serial", "arc", "deterministic", "floor")


def make_scene(n: int, seed: int = 0) -> dict:
    """Random frustum-filling scene as float32 numpy arrays (gsplat conventions)."""
    rng = np.random.default_rng(seed)
    cam = arc_warp.Camera.from_fov(60.0, WIDTH, HEIGHT)
    z = rng.uniform(2.0, 12.0, n)
    u = rng.uniform(0.0, WIDTH, n)
    v = rng.uniform(0.0, HEIGHT, n)
    means = np.stack([(u - cam.cx) / cam.fx * z, (v - cam.cy) / cam.fy * z, z], 1)
    quats = rng.standard_normal((n, 4))
    quats /= np.linalg.norm(quats, axis=1, keepdims=True)
    size = (1e6 / n) ** (1.0 / 3.0)
    scales = np.exp(rng.uniform(np.log(0.004), np.log(0.025), (n, 3))) * size
    opacities = rng.uniform(0.05, 1.0, n)
    sh = np.zeros((n, (SH_DEGREE + 1) ** 2, 3))
    sh[:, 0] = rng.uniform(-1.5, 1.5, (n, 3))
    sh[:, 1:] = rng.standard_normal((n, (SH_DEGREE + 1) ** 2 - 1, 3)) * 0.15
    f32 = lambda a: np.ascontiguousarray(a, dtype=np.float32)  # noqa: E731
    return {
        "camera": cam,
        "means": f32(means),
        "quats": f32(quats),
        "scales": f32(scales),
        "opacities": f32(opacities),
        "sh": f32(sh),
    }


def scene_arrays(scene: dict, device) -> dict:
    """The scene's Gaussians as Warp arrays, keyed as ``render_gaussians`` takes them."""
    return dict(
        means=wp.array(scene["means"], dtype=wp.vec3, device=device),
        quats=wp.array(scene["quats"], dtype=wp.vec4, device=device),
        scales=wp.array(scene["scales"], dtype=wp.vec3, device=device),
        opacities=wp.array(scene["opacities"], dtype=float, device=device),
        colors=wp.array(scene["sh"], dtype=wp.vec3, device=device),
    )


def time_arc_warp(scene: dict, cotangent: np.ndarray, device, reps: int) -> dict:
    cam = scene["camera"]
    arrays = scene_arrays(scene, device)
    grad_color = wp.array(cotangent, dtype=wp.vec3, device=device)
    zeros = wp.zeros((HEIGHT, WIDTH), dtype=float, device=device)
    launches = {}
    for mode in MODES:
        settings = arc_warp.RenderSettings(reduce=mode)
        out = arc_warp.render_gaussians(**arrays, camera=cam, settings=settings)
        grads = arc_warp.render_gaussians_backward(out, grad_color)
        threshold = arc_warp.resolve_threshold(device) if mode == "arc" else 0
        launches[f"{mode}/forward_ms"] = lambda s=settings: arc_warp.render_gaussians(**arrays, camera=cam, settings=s)
        launches[f"{mode}/backward_ms"] = lambda o=out, g=grads: arc_warp.render_gaussians_backward(o, grad_color, grads=g)
        launches[f"{mode}/raster_backward_ms"] = lambda o=out, m=mode, t=threshold, s=settings: raster_backward(
            o._project, o._bins, o._images, s.background, grad_color, zeros, zeros, zeros, m, False, t, o._frame
        )
    # All modes interleaved in every repetition: their ratios are free of drift.
    times = median_times_ms(launches, device, warmup=3, reps=reps)
    res = {mode: {} for mode in MODES}
    for key, t in times.items():
        mode, what = key.split("/")
        res[mode][what] = t
    # Gradients for the comparison with gsplat come from the default (arc) render.
    out = arc_warp.render_gaussians(**arrays, camera=cam, settings=arc_warp.RenderSettings())
    grads = arc_warp.render_gaussians_backward(out, grad_color)
    res["image"] = out.color.numpy()
    res["grads"] = {k: getattr(grads, k).numpy().reshape(len(scene["means"]), -1) for k in arrays}
    res["n_isects"] = int(out._bins.n_isects)
    return res


def _torch_inputs(scene, torch):
    dev = "cuda"
    t = {k: torch.tensor(scene[k], device=dev, requires_grad=True) for k in ("means", "quats", "scales", "opacities", "sh")}
    cam = scene["camera"]
    viewmat = torch.tensor(cam.world_to_camera, dtype=torch.float32, device=dev)
    K = torch.tensor(cam.K, dtype=torch.float32, device=dev)
    return t, viewmat, K


def _torch_median_ms(fn, reps, torch, setup=None):
    """Median CUDA-event time of ``fn()`` after 3 warm-ups; ``setup()`` runs untimed first."""
    times = []
    for i in range(reps + 3):
        arg = setup() if setup else None
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn() if arg is None else fn(arg)
        e.record()
        e.synchronize()
        if i >= 3:
            times.append(s.elapsed_time(e))
    return float(np.median(times))


def _torch_backward_median_ms(make_loss, leaves, reps, torch):
    """Median time of ``loss.backward()`` alone; the forward runs untimed before each."""

    def setup():
        for x in leaves:
            x.grad = None
        return make_loss()

    return _torch_median_ms(lambda loss: loss.backward(), reps, torch, setup)


def time_gsplat(scene, cotangent, reps) -> dict | None:
    try:
        import torch
        from gsplat import rasterization
    except Exception as e:  # noqa: BLE001 - peers are optional
        print(f"# gsplat unavailable: {e}")
        return None
    t, viewmat, K = _torch_inputs(scene, torch)
    v = torch.tensor(cotangent, device="cuda")
    res = {}
    for packed in (True, False):
        def fwd():
            img, _, _ = rasterization(
                t["means"], t["quats"], t["scales"], t["opacities"], t["sh"], viewmat[None], K[None],
                WIDTH, HEIGHT, sh_degree=SH_DEGREE, packed=packed, rasterize_mode="classic",
            )
            return img

        key = "gsplat_packed" if packed else "gsplat"
        res[key] = {
            "forward_ms": _torch_median_ms(fwd, reps, torch),
            "backward_ms": _torch_backward_median_ms(lambda: (fwd()[0] * v).sum(), t.values(), reps, torch),
        }
    img = fwd()
    for x in t.values():
        x.grad = None
    (img[0] * v).sum().backward()
    res["image"] = img[0].detach().cpu().numpy()
    res["grads"] = {
        "means": t["means"].grad.cpu().numpy(),
        "quats": t["quats"].grad.cpu().numpy(),
        "scales": t["scales"].grad.cpu().numpy(),
        "opacities": t["opacities"].grad.cpu().numpy().reshape(-1, 1),
        "colors": t["sh"].grad.cpu().numpy().reshape(len(scene["means"]), -1),
    }
    return res


def time_gswarp(scene, cotangent, reps) -> dict | None:
    try:
        import torch
        import gswarp
    except Exception as e:  # noqa: BLE001 - peers are optional
        print(f"# gswarp unavailable: {e}")
        return None
    cam = scene["camera"]
    t, _, _ = _torch_inputs(scene, torch)
    w2c = torch.tensor(cam.world_to_camera, dtype=torch.float32, device="cuda")
    tanx, tany = WIDTH / (2 * cam.fx), HEIGHT / (2 * cam.fy)
    zn, zf = 0.01, 100.0
    proj = torch.zeros(4, 4, device="cuda")
    proj[0, 0], proj[1, 1] = 1 / tanx, 1 / tany
    proj[2, 2], proj[2, 3], proj[3, 2] = zf / (zf - zn), -zf * zn / (zf - zn), 1.0
    settings = gswarp.GaussianRasterizationSettings(
        image_height=HEIGHT, image_width=WIDTH, tanfovx=tanx, tanfovy=tany,
        bg=torch.zeros(3, device="cuda"), scale_modifier=1.0, viewmatrix=w2c.T.contiguous(),
        projmatrix=(proj @ w2c).T.contiguous(), sh_degree=SH_DEGREE,
        campos=torch.tensor(cam.center, dtype=torch.float32, device="cuda"), prefiltered=False,
        auto_tune_verbose=False,
    )
    rast = gswarp.GaussianRasterizer(settings)
    means2d = torch.zeros_like(t["means"], requires_grad=True)
    v = torch.tensor(cotangent, device="cuda").permute(2, 0, 1)

    def fwd():
        return rast(means3D=t["means"], means2D=means2d, opacities=t["opacities"][:, None], shs=t["sh"],
                    scales=t["scales"], rotations=t["quats"])[0]

    return {
        "gswarp": {
            "forward_ms": _torch_median_ms(fwd, reps, torch),
            "backward_ms": _torch_backward_median_ms(lambda: (fwd() * v).sum(), [*t.values(), means2d], reps, torch),
        }
    }


def psnr(a, b) -> float:
    mse = float(np.mean((np.clip(a, 0, 1) - np.clip(b, 0, 1)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(1.0 / mse)


def cosine(a, b) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, action="append", help="Gaussian counts (repeatable; default 1000000)")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--no-peers", action="store_true", help="skip gsplat / gswarp")
    ap.add_argument("--json", help="write results to this file")
    args = ap.parse_args(argv)
    wp.config.log_level = wp.LOG_WARNING
    device = wp.get_device("cuda")
    if not device.is_cuda:
        print("bench_splat needs a CUDA GPU", file=sys.stderr)
        return 2
    print(f"# device {device.name}, warp {wp.config.version}, {WIDTH}x{HEIGHT}, SH degree {SH_DEGREE}")
    print(f"# ARC threshold T = {arc_warp.resolve_threshold(device)}")
    report = []
    for n in args.n or [1_000_000]:
        scene = make_scene(n)
        cotangent = np.random.default_rng(1).standard_normal((HEIGHT, WIDTH, 3)).astype(np.float32)
        ours = time_arc_warp(scene, cotangent, device, args.reps)
        peers = {}
        if not args.no_peers:
            for fn in (time_gsplat, time_gswarp):
                try:
                    r = fn(scene, cotangent, args.reps)
                except Exception as e:  # noqa: BLE001 - a broken peer must not hide our numbers
                    print(f"# {fn.__name__} failed: {type(e).__name__}: {e}")
                    r = None
                if r:
                    peers.update(r)
        print(f"\n## N = {n}  (intersections: {ours['n_isects']})")
        print(f"{'variant':22s} {'forward_ms':>10s} {'backward_ms':>11s} {'raster_bwd_ms':>13s} "
              f"{'bwd/floor':>9s} {'raster/floor':>12s}")
        row = {"n": n, "n_isects": ours["n_isects"]}
        for mode in MODES:
            r = ours[mode]
            fl = ours["floor"]
            print(f"arc_warp/{mode:13s} {r['forward_ms']:10.3f} {r['backward_ms']:11.3f} {r['raster_backward_ms']:13.3f} "
                  f"{r['backward_ms'] / fl['backward_ms']:9.3f} {r['raster_backward_ms'] / fl['raster_backward_ms']:12.3f}")
            row[mode] = r
        for key in ("gsplat", "gsplat_packed", "gswarp"):
            if key in peers:
                r = peers[key]
                print(f"{key:16s} {r['forward_ms']:10.3f} {r['backward_ms']:11.3f}")
                row[key] = r
        a, at, fl = ours["arc"], ours["atomic"], ours["floor"]
        print(f"arc backward speed-up over atomic: {at['backward_ms'] / a['backward_ms']:.2f}x "
              f"(rasteriser alone {at['raster_backward_ms'] / a['raster_backward_ms']:.2f}x); "
              f"arc over floor: {a['backward_ms'] / fl['backward_ms']:.3f}x")
        det = ours["deterministic"]
        print(f"deterministic backward over arc: {det['backward_ms'] / a['backward_ms']:.3f}x "
              f"(rasteriser alone {det['raster_backward_ms'] / a['raster_backward_ms']:.3f}x; bar <= 1.3x)")
        if "image" in peers:
            best = min((peers[k] for k in ("gsplat", "gsplat_packed") if k in peers), key=lambda r: r["backward_ms"])
            print(f"vs best gsplat: forward {a['forward_ms'] / best['forward_ms']:.2f}x, "
                  f"backward {a['backward_ms'] / best['backward_ms']:.2f}x (ratios < 1 mean arc_warp is faster)")
            row["psnr_vs_gsplat"] = psnr(ours["image"], peers["image"])
            row["grad_cosine_vs_gsplat"] = {k: cosine(ours["grads"][k], peers["grads"][k]) for k in ours["grads"]}
            print(f"image PSNR vs gsplat: {row['psnr_vs_gsplat']:.1f} dB")
            print("gradient cosine vs gsplat: " + ", ".join(f"{k} {v:.5f}" for k, v in row["grad_cosine_vs_gsplat"].items()))
        report.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device.name, "width": WIDTH, "height": HEIGHT, "results": report}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
