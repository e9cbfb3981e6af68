"""Training outputs: labelled comparison images, the PSNR plot, metrics JSON.

PNGs are written by the core's `arc_warp.write_png`; pillow only draws the labels. Every
file is written atomically (`write_atomically`): a reader, or a run started after a kill,
finds the previous complete file or the new complete one.
"""

import json
import os

import numpy as np

from arc_warp import write_png
from arc_warp._src.files import write_atomically

ERROR_GAIN = 4.0
"""The error panel shows mean |render - truth| over RGB times this gain (clipped to 1)."""

MIN_PANEL_WIDTH = 96
"""Panels narrower than this are enlarged by a whole factor (nearest pixel) for the labels
to fit; larger images are shown at their own size."""


def error_image(truth: np.ndarray, render: np.ndarray) -> np.ndarray:
    """(H,W,3) grey image of ERROR_GAIN x the per-pixel mean absolute RGB error."""
    err = np.abs(np.asarray(render, np.float32) - np.asarray(truth, np.float32)).mean(-1)
    return np.repeat(np.clip(ERROR_GAIN * err, 0.0, 1.0)[..., None], 3, axis=-1)


def labelled_row(images, labels, gap: int = 2) -> np.ndarray:
    """(H,W,3) float images in [0,1], shown side by side at full resolution (or a whole
    multiple, see MIN_PANEL_WIDTH) with `labels` in a caption strip above each, drawn in
    pillow's default font -> one (H',W',3) float32 image."""
    from PIL import Image, ImageDraw

    if len(images) != len(labels) or not images:
        raise ValueError(f"labelled_row: {len(images)} images for {len(labels)} labels")
    shape = images[0].shape
    if any(im.shape != shape for im in images):
        raise ValueError(f"labelled_row: shapes differ, {[im.shape for im in images]}")
    scale = max(1, -(-MIN_PANEL_WIDTH // shape[1]))
    panels = [np.repeat(np.repeat(np.asarray(im, np.float32), scale, 0), scale, 1)
              for im in images]
    h, w = panels[0].shape[:2]
    caption = 14
    canvas = Image.new("RGB", (len(panels) * (w + gap) - gap, h + caption), "white")
    draw = ImageDraw.Draw(canvas)
    for k, (panel, label) in enumerate(zip(panels, labels)):
        x = k * (w + gap)
        rgb = (np.clip(panel, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
        canvas.paste(Image.fromarray(rgb, "RGB"), (x, caption))
        draw.text((x + 2, 1), label, fill="black")
    return np.asarray(canvas, np.float32) / 255.0


def comparison(truth: np.ndarray, render: np.ndarray, psnr_db: float = None) -> np.ndarray:
    """Ground truth | render | error, labelled (the render's PSNR in its label if given)."""
    render_label = "render" if psnr_db is None else f"render {psnr_db:.2f} dB"
    return labelled_row([truth, render, error_image(truth, render)],
                        ["ground truth", render_label, f"|error| x{ERROR_GAIN:g}"])


def plot_psnr(path, curves: dict, title: str = "PSNR over training") -> None:
    """Plot PSNR curves {label: [(step, psnr_db), ...]} against steps into a PNG at `path`
    (matplotlib, Agg backend); single-point curves are drawn as markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    for label, points in curves.items():
        if points:
            steps, values = zip(*points)
            ax.plot(steps, values, "o-" if len(points) < 40 else "-", ms=4, lw=1.2, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("PSNR (dB)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    with write_atomically(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


def write_json(path, data: dict) -> None:
    with write_atomically(path) as tmp, open(tmp, "w") as f:
        json.dump(data, f, indent=2)


def write_image(path, rgb: np.ndarray) -> None:
    """`arc_warp.write_png` (an (H,W,3) float image in [0,1]), atomically."""
    with write_atomically(path) as tmp:
        write_png(tmp, rgb)


def ensure_dir(path) -> str:
    os.makedirs(path, exist_ok=True)
    return path
