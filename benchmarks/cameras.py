"""Camera models through rasterization: pinhole, ortho, fisheye and distorted pinhole, against gsplat's.

Per N and size regime (:mod:`benchmarks.scene`), one camera at 1920x1080, SH degree 3, the
activated parameters as torch leaves, forward and backward (one random colour
cotangent) through ``arc_warp_torch.rasterization`` for each model:

- ``pinhole``: the scene's camera;
- ``ortho``: ``camera_model="ortho"``, fx = fy = the pinhole focal length over the mean
  depth (7), so a Gaussian covers about as many pixels as in the pinhole image;
- ``fisheye``: ``camera_model="fisheye"`` (equidistant), the pinhole's intrinsics;
- ``pinhole_distorted``: ``radial_coeffs`` k1 = -0.05, k2 = 0.01 and ``tangential_coeffs``
  p1 = p2 = 0.001 (OpenCV's order), rendered natively.

gsplat (when importable) renders the same cases through its ``rasterization`` (classic
mode; the distorted pinhole with ``with_ut=True, with_eval3d=True``, its only way to
distort), on the same tensors; a case gsplat refuses is noted, not fatal. Medians after
warm-up of CUDA events on torch's stream; the host clock on the CPU (``--smoke``).
"""

from __future__ import annotations

import numpy as np

from benchmarks import peers, results, timing
from benchmarks.scene import REGIMES, SH_DEGREE, make_scene

MODELS = ("pinhole", "ortho", "fisheye", "pinhole_distorted")
MEAN_DEPTH = 7.0  # of the scene's Gaussians: the ortho camera's pixels per world unit = f / MEAN_DEPTH


def add_arguments(parser) -> None:
    parser.add_argument("--n", type=int, nargs="+", default=[300_000, 1_000_000])
    parser.add_argument("--regimes", nargs="+", choices=REGIMES, default=["small", "large"])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--width", type=int, default=1920)
    parser.add_argument("--height", type=int, default=1080)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-peers", action="store_true", help="skip gsplat")


def camera_case(model: str, ks: np.ndarray, device) -> tuple:
    """``(Ks, arc keywords, gsplat keywords)`` of one model (module notes) for [C, 3, 3] ``ks``."""
    import torch

    ks = ks.copy()
    if model == "ortho":
        ks[:, 0, 0] /= MEAN_DEPTH
        ks[:, 1, 1] /= MEAN_DEPTH
    common = {"camera_model": "pinhole" if model == "pinhole_distorted" else model}
    if model != "pinhole_distorted":
        return torch.tensor(ks, device=device), common, common
    c = ks.shape[0]
    radial = torch.tensor([[-0.05, 0.01, 0.0, 0.0, 0.0, 0.0]] * c, device=device)
    tangential = torch.tensor([[0.001, 0.001]] * c, device=device)
    lens = dict(common, radial_coeffs=radial, tangential_coeffs=tangential)
    return torch.tensor(ks, device=device), lens, dict(lens, with_ut=True, with_eval3d=True)


def run(args) -> dict:
    import torch

    from arc_warp_torch import RenderContext, rasterization

    if args.smoke:
        args.n, args.regimes, args.width, args.height, args.reps, args.warmup = [300], ["small"], 64, 48, 2, 1
    cuda = not args.smoke and torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    clock = timing.Clock(device, "torch")
    gsplat, note = (None, "gsplat skipped (--no-peers)") if args.no_peers else peers.optional("gsplat")
    notes = [note] + ([] if cuda else ["no CUDA device: times are the host clock's"])
    context = RenderContext(device)
    rows = []
    for n in args.n:
        for regime in args.regimes:
            scene = make_scene(n, regime, args.width, args.height)
            leaves = {k: torch.tensor(v, device=device).requires_grad_(True) for k, v in scene.activated().items()}
            viewmats = torch.tensor(scene.viewmats, device=device)
            cot = torch.tensor(np.random.default_rng(1).standard_normal((1, args.height, args.width, 3)),
                               dtype=torch.float32, device=device)
            for model in args.models:
                ks, ours, theirs = camera_case(model, scene.Ks, device)
                libraries = {"arc": lambda ks=ks, kw=ours: rasterization(
                    *leaves.values(), viewmats, ks, args.width, args.height, sh_degree=SH_DEGREE, context=context,
                    **kw)[0]}
                if gsplat is not None:
                    libraries["gsplat"] = lambda ks=ks, kw=theirs: gsplat.rasterization(
                        *leaves.values(), viewmats, ks, args.width, args.height, sh_degree=SH_DEGREE,
                        packed=False, rasterize_mode="classic", **kw)[0]
                for library, render in libraries.items():
                    try:
                        row = timing.forward_backward(render, leaves.values(), cot, clock, args.reps, args.warmup)
                    except Exception as e:  # noqa: BLE001 - a case the peer refuses is noted
                        if library == "arc":
                            raise
                        notes.append(f"gsplat {model}: {type(e).__name__}: {str(e)[:200]}")
                        continue
                    rows.append(dict(row, n=n, regime=regime, model=model, library=library))
            print(f"# N={n} {regime}: " + ", ".join(f"{r['library']} {r['model']} {r['backward_ms']:.3f}" for r in rows
                                                    if (r["n"], r["regime"]) == (n, regime)) + " ms backward")
    return {"device": torch.cuda.get_device_name() if cuda else "cpu", "width": args.width, "height": args.height,
            "notes": notes, "rows": rows}


def table(result: dict) -> str:
    rows, num, ratio = result["rows"], results.num, results.ratio

    def find(n, regime, model, library):
        return next((r for r in rows if (r["n"], r["regime"], r["model"], r["library"]) ==
                     (n, regime, model, library)), {})

    out = []
    for r in rows:
        if r["library"] != "arc":
            continue
        key = (r["n"], r["regime"])
        pin, peer, peer_pin = find(*key, "pinhole", "arc"), find(*key, r["model"], "gsplat"), \
            find(*key, "pinhole", "gsplat")
        out.append([results.count(r["n"]), r["regime"], r["model"], num(r["forward_ms"]), num(r["backward_ms"]),
                    ratio(r["forward_ms"], pin.get("forward_ms")), ratio(r["backward_ms"], pin.get("backward_ms")),
                    num(peer.get("forward_ms")), num(peer.get("backward_ms")),
                    ratio(peer.get("forward_ms"), peer_pin.get("forward_ms")),
                    ratio(peer.get("backward_ms"), peer_pin.get("backward_ms")),
                    ratio(r["forward_ms"], peer.get("forward_ms")), ratio(r["backward_ms"], peer.get("backward_ms"))])
    return results.markdown(["N", "regime", "camera", "fwd ms", "bwd ms", "fwd ÷ pinhole", "bwd ÷ pinhole",
                             "gsplat fwd ms", "gsplat bwd ms", "gsplat fwd ÷ its pinhole",
                             "gsplat bwd ÷ its pinhole", "fwd ÷ gsplat", "bwd ÷ gsplat"], out)
