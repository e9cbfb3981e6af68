"""The splat kernels per reduce mode (GaussianRenderer.forward/backward) against gsplat and gswarp.

Per N and size regime (:mod:`benchmarks.scene`; default ``shrink``, the scene of the
tables up to 0.11.0), one camera at 1920x1080, SH degree 3, the activated parameters
(unit quaternions, linear scales, opacities) in Warp arrays:

- arc_warp: one ``arc_warp.GaussianRenderer`` per reduce mode (``atomic``, ``warp``,
  ``serial``, ``arc``, ``deterministic``, and ``floor``: the same backward with no
  gradient accumulation at all, the bound any reduction can reach), holding its state,
  images and gradients; ``forward`` and ``backward`` (under one random colour
  cotangent) are timed as they are called in a loop, every mode interleaved in each
  repetition (CUDA events on Warp's stream, medians after warm-up);
- gsplat (``packed`` False and True, classic mode) and gswarp's ``GaussianRasterizer``
  when importable, on the same tensors and cotangent (CUDA events on torch's stream);
- agreement with gsplat: image PSNR and each gradient's cosine similarity.

``arc / atomic`` and ``arc / floor`` are the backward's ratios: what ARC saves over plain
atomics, and what it costs over free accumulation. The rasteriser backward alone, timed
up to 0.11.0 through a private entry point, is no longer measured. On the CPU (``--smoke``)
the host clock times everything.
"""

from __future__ import annotations

import math

import numpy as np

from benchmarks import peers, results, timing
from benchmarks.scene import REGIMES, SH_DEGREE, make_scene

MODES = ("atomic", "warp", "serial", "arc", "deterministic", "floor")
PEERS = ("gsplat", "gsplat_packed", "gswarp")


def add_arguments(parser) -> None:
    parser.add_argument("--n", type=int, nargs="+", default=[300_000, 1_000_000])
    parser.add_argument("--regimes", nargs="+", choices=REGIMES, default=["shrink"])
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--width", type=int, default=1920)
    parser.add_argument("--height", type=int, default=1080)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-peers", action="store_true", help="skip gsplat and gswarp")


def arc_modes(scene, modes, device, cotangent: np.ndarray, reps: int, warmup: int) -> tuple[dict, dict]:
    """``({mode: {forward_ms, backward_ms, ...}}, {"image", "grads", "intersections"})``:
    the timed modes, and the ``arc`` mode's image, gradients and intersection count."""
    import warp as wp

    from arc_warp import GaussianGrads, GaussianRenderer, ImageGrads, RenderImages, RenderSettings

    gaussians = scene.warp_gaussians(device)
    cameras = scene.cameras()
    n, h, w = scene.n, scene.height, scene.width
    cot = [ImageGrads(color=wp.array(cotangent, dtype=wp.vec3, device=device))]
    fns, kept = {}, {}
    for mode in modes:
        renderer = GaussianRenderer(w, h, n, 1, (SH_DEGREE + 1) ** 2, RenderSettings(reduce=mode), device)
        state = renderer.new_state()
        images = RenderImages(wp.empty((1, h, w), dtype=wp.vec3, device=device),
                              wp.empty((1, h, w), dtype=wp.float32, device=device),
                              wp.empty((1, 0, 0), dtype=wp.float32, device=device),
                              wp.empty((1, 0, 0), dtype=wp.float32, device=device),
                              wp.empty((1, n), dtype=wp.vec2, device=device),
                              wp.empty((1, n), dtype=wp.vec2i, device=device))
        grads = GaussianGrads(*(wp.empty_like(a) for a in gaussians.arrays))
        renderer.forward(gaussians, cameras, state, images, check=True)  # sizes the sort: one wait, untimed
        fns[f"{mode}/forward"] = lambda r=renderer, s=state, i=images: r.forward(gaussians, cameras, s, i)
        fns[f"{mode}/backward"] = lambda r=renderer, s=state, g=grads: r.backward(s, cot, g)
        kept[mode] = (renderer, state, images, grads)
    times = timing.medians(timing.Clock(device, "warp"), fns, warmup, reps)
    out = {mode: {} for mode in modes}
    for key, t in times.items():
        mode, what = key.split("/")
        out[mode].update({f"{what}_ms": t["device_ms"], f"{what}_host_ms": t["host_ms"]})
    reference = {}
    if "arc" in kept:
        renderer, state, images, grads = kept["arc"]
        status = renderer.forward(gaussians, cameras, state, images, check=True)
        renderer.backward(state, cot, grads)
        reference = {"image": images.color.numpy()[0], "intersections": int(status.totals[0]),
                     "grads": {k: a.numpy().reshape(n, -1) for k, a in zip(scene.ACTIVATED, grads.arrays)}}
    return out, reference


def torch_peers(scene, cotangent: np.ndarray, device: str, reps: int, warmup: int) -> tuple[dict, dict, list]:
    """``({peer: {forward_ms, backward_ms}}, gsplat's {"image", "grads"}, notes)`` on a torch device."""
    import torch

    found, agreement, notes = {}, {}, []
    a = scene.activated()
    leaves = {k: torch.tensor(v, device=device).requires_grad_(True) for k, v in a.items()}
    viewmat, K = (torch.tensor(v, device=device) for v in (scene.viewmats, scene.Ks))
    cot = torch.tensor(cotangent, device=device)
    clock = timing.Clock(device, "torch")
    gsplat, note = peers.optional("gsplat")
    notes.append(note)
    for packed in (False, True) if gsplat else ():
        def render(packed=packed):
            return gsplat.rasterization(*leaves.values(), viewmat, K, scene.width, scene.height, sh_degree=SH_DEGREE,
                                        packed=packed, rasterize_mode="classic")[0][0]

        found["gsplat_packed" if packed else "gsplat"] = timing.forward_backward(
            render, leaves.values(), cot, clock, reps, warmup)
        if not packed:
            (render() * cot).sum().backward()
            agreement = {"image": render().detach().cpu().numpy(),
                         "grads": {k: t.grad.cpu().numpy().reshape(scene.n, -1) for k, t in zip(scene.ACTIVATED,
                                                                                                 leaves.values())}}
            for t in leaves.values():
                t.grad = None
    gswarp, note = peers.optional("gswarp")
    notes.append(note)
    if gswarp:
        found["gswarp"] = timing.forward_backward(_gswarp_render(gswarp, scene, leaves, device), leaves.values(),
                                                  cot.permute(2, 0, 1), clock, reps, warmup)
    return found, agreement, notes


def _gswarp_render(gswarp, scene, t, device):
    """gswarp's INRIA-style rasterizer on the scene's camera (its projection matrix made
    from the intrinsics, near 0.01, far 100)."""
    import torch

    cam = scene.cameras()[0]
    w2c = torch.tensor(cam.world_to_camera, dtype=torch.float32, device=device)
    tanx, tany = scene.width / (2 * cam.fx), scene.height / (2 * cam.fy)
    zn, zf = 0.01, 100.0
    proj = torch.zeros(4, 4, device=device)
    proj[0, 0], proj[1, 1] = 1 / tanx, 1 / tany
    proj[2, 2], proj[2, 3], proj[3, 2] = zf / (zf - zn), -zf * zn / (zf - zn), 1.0
    settings = gswarp.GaussianRasterizationSettings(
        image_height=scene.height, image_width=scene.width, tanfovx=tanx, tanfovy=tany,
        bg=torch.zeros(3, device=device), scale_modifier=1.0, viewmatrix=w2c.T.contiguous(),
        projmatrix=(proj @ w2c).T.contiguous(), sh_degree=SH_DEGREE,
        campos=torch.tensor(cam.center, dtype=torch.float32, device=device), prefiltered=False,
        auto_tune_verbose=False)
    rasterizer = gswarp.GaussianRasterizer(settings)
    means2d = torch.zeros_like(t["means"], requires_grad=True)
    return lambda: rasterizer(means3D=t["means"], means2D=means2d, opacities=t["opacities"][:, None], shs=t["sh"],
                              scales=t["scales"], rotations=t["quats"])[0]


def psnr(a, b) -> float | None:
    """PSNR of two images clipped to [0, 1], dB; None where they are equal."""
    mse = float(np.mean((np.clip(a, 0, 1) - np.clip(b, 0, 1)) ** 2))
    return None if mse == 0 else 10 * math.log10(1.0 / mse)


def cosine(a, b) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))


def run(args) -> dict:
    import warp as wp

    if args.smoke:
        args.n, args.width, args.height, args.reps, args.warmup = [300], 64, 48, 2, 1
    device = wp.get_device("cpu" if args.smoke or not wp.is_cuda_available() else "cuda")
    notes = [] if device.is_cuda else ["no CUDA device: times are the host clock's"]
    rows = []
    for n in args.n:
        for regime in args.regimes:
            scene = make_scene(n, regime, args.width, args.height)
            cotangent = np.random.default_rng(1).standard_normal((args.height, args.width, 3)).astype(np.float32)
            ours, reference = arc_modes(scene, args.modes, device, cotangent, args.reps, args.warmup)
            row = {"n": n, "regime": regime, "intersections": reference.get("intersections"), **ours}
            if not args.no_peers:
                found, agreement, peer_notes = torch_peers(scene, cotangent, "cuda" if device.is_cuda else "cpu",
                                                           args.reps, args.warmup)
                row.update(found)
                notes += [note for note in peer_notes if note not in notes]
                if agreement and reference:
                    row["psnr_vs_gsplat"] = psnr(reference["image"], agreement["image"])
                    row["grad_cosine_vs_gsplat"] = {k: cosine(reference["grads"][k], agreement["grads"][k])
                                                    for k in scene.ACTIVATED}
            rows.append(row)
            print(f"# N={n} {regime}: " + ", ".join(f"{m} {row[m]['backward_ms']:.3f}" for m in args.modes)
                  + " ms backward", flush=True)
    threshold = None
    if device.is_cuda:
        import arc_warp

        threshold = arc_warp.resolve_threshold(device)
    return {"device": device.name if device.is_cuda else "cpu", "width": args.width, "height": args.height,
            "threshold": threshold, "notes": notes, "rows": rows}


def table(result: dict) -> str:
    num, ratio, out = results.num, results.ratio, []
    for r in result["rows"]:
        best = min((r[p] for p in ("gsplat", "gsplat_packed") if p in r), key=lambda p: p["backward_ms"], default={})
        floor, atomic = r.get("floor", {}), r.get("atomic", {})
        for variant in MODES + PEERS:
            if variant not in r:
                continue
            v = r[variant]
            ours = variant in MODES
            out.append([results.count(r["n"]), r["regime"], num(r.get("intersections")),
                        variant if ours else variant.replace("_", " "), num(v["forward_ms"]), num(v["backward_ms"]),
                        ratio(v["backward_ms"], atomic.get("backward_ms")) if ours else "-",
                        ratio(v["backward_ms"], floor.get("backward_ms")) if ours else "-",
                        ratio(v["forward_ms"], best.get("forward_ms")) if ours else "-",
                        ratio(v["backward_ms"], best.get("backward_ms")) if ours else "-"])
    text = results.markdown(["N", "regime", "intersections", "variant", "fwd ms", "bwd ms", "bwd ÷ atomic",
                             "bwd ÷ floor", "fwd ÷ best gsplat", "bwd ÷ best gsplat"], out)
    agreement = [r for r in result["rows"] if "psnr_vs_gsplat" in r]
    if agreement:
        text += "\n\nAgreement with gsplat (`arc`): " + "; ".join(
            f"N={results.count(r['n'])} {r['regime']}: image PSNR "
            + ("identical images" if r["psnr_vs_gsplat"] is None else f"{r['psnr_vs_gsplat']:.1f} dB")
            + ", gradient cosine "
            + ", ".join(f"{k} {v:.5f}" for k, v in r["grad_cosine_vs_gsplat"].items()) for r in agreement)
    if result.get("threshold"):
        text += f"\n\nARC threshold T = {result['threshold']} (calibrated)."
    return text
