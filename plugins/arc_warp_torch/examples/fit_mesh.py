"""Fit a textured, vertex-coloured sphere to target renders from several views, in the
manner of nvdiffrast's "earth" and "cube" samples, with the arc_warp_torch.mesh drop-in.

Stage 1 fits a texture and per-vertex colours (the photo ``grace_hopper.jpg`` that
matplotlib ships is the target texture); stage 2 then fits the vertex positions from a
dented start (silhouettes differentiate through ``antialias``). Prints the PSNR curve,
writes before/after PNGs and a PSNR plot. A few minutes on a CPU at the default size::

    python -m arc_warp_torch.examples.fit_mesh --out fit_mesh_out
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import torch
import warp as wp

import arc_warp.mesh as core
import arc_warp_torch.mesh as dr


def perspective(fov_x: float = 0.9, near: float = 0.5, far: float = 20.0) -> np.ndarray:
    """OpenGL-style projection (x right, y up, looking down -z)."""
    f = 1.0 / math.tan(fov_x / 2)
    return np.array([[f, 0, 0, 0], [0, f, 0, 0],
                     [0, 0, -(far + near) / (far - near), -2 * far * near / (far - near)], [0, 0, -1, 0]])


def view_matrix(yaw: float, pitch: float, distance: float = 3.2) -> np.ndarray:
    cy, sy, cp, sp = math.cos(yaw), math.sin(yaw), math.cos(pitch), math.sin(pitch)
    rot_y = np.array([[cy, 0, sy, 0], [0, 1, 0, 0], [-sy, 0, cy, 0], [0, 0, 0, 1]])
    rot_x = np.array([[1, 0, 0, 0], [0, cp, -sp, 0], [0, sp, cp, 0], [0, 0, 0, 1]])
    move = np.eye(4)
    move[2, 3] = -distance
    return move @ rot_x @ rot_y


def load_photo(size: int) -> torch.Tensor:
    """[1, size, size, 3] float32 in [0, 1], row 0 = v 0 (the photo's bottom)."""
    from matplotlib import cbook
    from PIL import Image

    with cbook.get_sample_data("grace_hopper.jpg") as f:
        img = Image.open(f).convert("RGB").resize((size, size), Image.BILINEAR)
    return torch.from_numpy(np.asarray(img, np.float32)[::-1].copy() / 255.0)[None]


def render(pos_obj, tri, uv, vcol, tex, mvps, res, topo):
    """Textured x vertex-coloured sphere in each view: [B, H, W, 3]."""
    homo = torch.cat([pos_obj, torch.ones_like(pos_obj[:, :1])], 1)
    clip = torch.einsum("bij,vj->bvi", mvps, homo).contiguous()
    rast, rast_db = dr.rasterize(None, clip, tri, (res, res))
    attrs, attrs_da = dr.interpolate(torch.cat([uv, vcol], 1)[None], rast, tri, rast_db=rast_db, diff_attrs=[0, 1])
    texc = attrs[..., :2].contiguous()
    color = dr.texture(tex, texc, attrs_da, filter_mode="linear-mipmap-linear") * attrs[..., 2:]
    color = torch.where(rast[..., 3:] > 0, color, torch.ones_like(color))  # white background
    return dr.antialias(color.contiguous(), rast, clip, tri, topology_hash=topo)


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(-10 * torch.log10(((a - b) ** 2).mean()))


def save_png(img: torch.Tensor, path: Path):
    from PIL import Image

    rows = [torch.cat(list(img[i:i + 4].flip(1)), 1) for i in range(0, len(img), 4)]  # flip: row 0 is the bottom
    Image.fromarray((torch.cat(rows, 0).clamp(0, 1).detach().numpy() * 255).astype(np.uint8)).save(path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--res", type=int, default=64, help="render resolution (square)")
    ap.add_argument("--tex", type=int, default=64, help="texture resolution (square, power of two)")
    ap.add_argument("--views", type=int, default=8)
    ap.add_argument("--steps", type=int, nargs=2, default=(150, 200), metavar=("COLOUR", "SHAPE"))
    ap.add_argument("--out", type=Path, default=Path("fit_mesh_out"))
    ap.add_argument("--reduce", default="arc")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    wp.config.log_level = wp.LOG_WARNING  # no per-module load lines
    torch.manual_seed(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)

    v, uv, f = core.uv_sphere(16, 32)
    pos_true = torch.from_numpy(v)
    tri = torch.from_numpy(f)
    uv = torch.from_numpy(uv)
    topo = dr.antialias_construct_topology_hash(tri)
    rng = np.random.default_rng(args.seed)
    proj = perspective()
    mvps = torch.tensor(np.stack([proj @ view_matrix(rng.uniform(0, 2 * math.pi), rng.uniform(-0.6, 0.6))
                                  for _ in range(args.views)]), dtype=torch.float32)
    # target: the photo as texture, tinted per vertex by height, on a slightly squashed sphere
    tex_true = load_photo(args.tex)
    vcol_true = (0.6 + 0.4 * torch.stack([0.5 + 0.5 * pos_true[:, 1], 1 - 0.3 * pos_true[:, 1].abs(),
                                          0.5 - 0.5 * pos_true[:, 1]], 1)).float()
    pos_true = pos_true * torch.tensor([1.0, 0.85, 1.0])
    with torch.no_grad():
        target = render(pos_true, tri, uv, vcol_true, tex_true, mvps, args.res, topo)

    tex = torch.full_like(tex_true, 0.5).requires_grad_(True)
    vcol = torch.ones_like(vcol_true).requires_grad_(True)
    offset = torch.zeros_like(pos_true).requires_grad_(True)
    pos_start = torch.from_numpy(v) * 1.05  # too big and round: stage 2 must shrink and squash it
    curve = []
    with torch.no_grad():
        save_png(render(pos_start, tri, uv, vcol, tex, mvps, args.res, topo), args.out / "before.png")
    save_png(target, args.out / "target.png")

    t0 = time.time()
    done = 0  # steps over both stages, for the curve
    stages = [("colour", [tex, vcol], 0.03, args.steps[0]), ("shape", [offset], 0.01, args.steps[1])]
    # stage 1 sees the true shape (as nvdiffrast's earth sample); stage 2 starts from the wrong one
    for name, params, lr, steps in stages:
        opt = torch.optim.Adam(params, lr=lr)
        base = pos_true if name == "colour" else pos_start
        for step in range(steps + 1):
            img = render(base + offset, tri, uv, vcol, tex, mvps, args.res, topo)
            loss = ((img - target) ** 2).mean()
            if step % 25 == 0:
                curve.append((done + step, name, psnr(img.detach(), target)))
                print(f"{name:6s} step {step:4d}  PSNR {curve[-1][2]:6.2f} dB  ({time.time() - t0:5.1f} s)", flush=True)
            if step == steps:
                done += steps
                break
            opt.zero_grad()
            loss.backward()
            opt.step()
            with torch.no_grad():
                tex.clamp_(0, 1)
    with torch.no_grad():
        final = render(pos_start + offset, tri, uv, vcol, tex, mvps, args.res, topo)
    save_png(final, args.out / "after.png")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        plt.figure(figsize=(5, 3))
        plt.plot([c[0] for c in curve], [c[2] for c in curve], marker="o")
        plt.xlabel("step")
        plt.ylabel("PSNR (dB)")
        plt.tight_layout()
        plt.savefig(args.out / "psnr.png", dpi=100)
    except ImportError:
        pass
    print(f"final PSNR {psnr(final, target):.2f} dB; images in {args.out}/ (target, before, after, psnr)")
    return curve


if __name__ == "__main__":
    main()
