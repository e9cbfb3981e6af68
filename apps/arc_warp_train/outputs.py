"""Training outputs: PNG images, side-by-side comparisons, the PSNR plot, metrics JSON."""

import json
import os

import numpy as np


def save_png(path, image: np.ndarray) -> None:
    """Write an (H,W,3) float image in [0,1] (clipped) as an 8-bit RGB PNG."""
    from PIL import Image

    rgb = (np.clip(np.asarray(image, np.float32), 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    Image.fromarray(rgb, "RGB").save(path)


def side_by_side(left: np.ndarray, right: np.ndarray, gap: int = 2) -> np.ndarray:
    """Two (H,W,3) images joined horizontally with a white `gap`-pixel separator."""
    if left.shape != right.shape:
        raise ValueError(f"side_by_side: shapes differ, {left.shape} vs {right.shape}")
    sep = np.ones((left.shape[0], gap, 3), np.float32)
    return np.concatenate([left, sep, right], axis=1)


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
    fig.savefig(path)
    plt.close(fig)


def write_json(path, data: dict) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=2)


def ensure_dir(path) -> str:
    os.makedirs(path, exist_ok=True)
    return path
