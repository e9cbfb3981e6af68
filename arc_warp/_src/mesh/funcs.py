"""@wp.func helpers shared by the mesh kernels: bit casts, fused multiply-add, triangle-id
codec, per-pixel launch tiling (vector loads and stores: ``arc_warp._src.vector_io``)."""

import warp as wp


@wp.func_native("union { float f; int i; } u; u.f = x; return u.i;")
def float_bits(x: float) -> int:
    """Bit pattern of ``x``."""
    ...


@wp.func_native("union { float f; int i; } u; u.i = x; return u.f;")
def bits_float(x: int) -> float:
    """The float whose bit pattern is ``x``."""
    ...


@wp.func
def same_sign(a: float, b: float) -> bool:
    """Sign bits equal (so +0 and -0 differ), as nvdiffrast's antialias compares them."""
    return (float_bits(a) ^ float_bits(b)) >= 0


@wp.func
def id_to_float(x: int) -> float:
    """nvdiffrast's float encoding of ``triangle_id + 1``: exact up to 2^24, bit-shifted above."""
    if x <= 16777216:
        return float(x)
    return bits_float(1249902592 + x)  # 0x4a800000 + x


@wp.func
def float_to_id(x: float) -> int:
    """Inverse of :func:`id_to_float` (0 = empty)."""
    if x <= 16777216.0:
        return int(x)
    return float_bits(x) - 1249902592


@wp.func_native("return fmaf(a, b, c);")
def fma32(a: float, b: float, c: float) -> float:
    """a * b + c rounded once, on the CPU as on the GPU (where nvcc would contract it)."""
    ...


TILE = 16
"""A 256-thread block covers a TILE x TILE pixel tile, each 32-lane warp an 8 x 4 patch of it:
lanes of a warp then hit nearby triangles and texels, which is what ARC merges."""


@wp.func
def tile_pixel(i: int, width: int, height: int) -> wp.vec4i:
    """(image, y, x, inside) of thread ``i`` of a tiled per-pixel launch (see
    :func:`arc_warp._src.mesh.common.tiled_dim`); y, x are clamped into the image for
    threads past its edge (inside = 0), so their loads stay in bounds."""
    tiles_x = (width + 15) // 16
    tiles_y = (height + 15) // 16
    block = i // 256
    lane = i % 256
    warp = lane // 32
    x = (block % tiles_x) * 16 + (warp % 2) * 8 + lane % 8
    y = ((block // tiles_x) % tiles_y) * 16 + (warp // 2) * 4 + (lane % 32) // 8
    inside = int(0)
    if x < width and y < height:
        inside = 1
    return wp.vec4i(block // (tiles_x * tiles_y), wp.min(y, height - 1), wp.min(x, width - 1), inside)
