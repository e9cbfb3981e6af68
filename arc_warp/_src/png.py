"""8-bit RGB PNG writer on zlib alone (the core has no image library)."""

import struct
import zlib

import numpy as np


def write_png(path, rgb: np.ndarray) -> None:
    """Write an (H,W,3) float image in [0,1] (clipped) as an 8-bit RGB PNG at `path`."""
    img = (np.clip(np.asarray(rgb, np.float32), 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    if img.ndim != 3 or img.shape[2] != 3 or img.shape[0] < 1 or img.shape[1] < 1:
        raise ValueError(f"write_png: expected an (H,W,3) image, got shape {img.shape}")
    h, w = img.shape[:2]
    raw = b"".join(b"\x00" + img[y].tobytes() for y in range(h))

    def chunk(tag, data):
        return (struct.pack(">I", len(data)) + tag + data
                + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF))

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))
