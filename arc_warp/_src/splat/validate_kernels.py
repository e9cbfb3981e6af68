"""Device-side input checks: the slots of a render's flags and the kernels that set them.

Each camera of a render has one int32 row of ``FLAG_SLOTS`` flags: slot 0 holds the tile
intersection total (saturated at 2^31 - 1), slots 1.. the input checks of ``BAD_SLOTS``,
and ``OVERFLOW_SLOT`` is set when the total exceeded the sort's capacity. The host reads
the row back (``status.RenderStatus``); on the device, a fused optimizer step can skip
its update when any slot past 0 is set.
"""

import warp as wp

# Slots 1.. of the flags (slot 0 holds the intersection total).
BAD_SLOTS = ("means", "quats", "scales", "opacities", "colors", "quats (zero norm)", "cameras", "camera distortion",
             "surface_colors", "surface_depths (NaN)")
OVERFLOW_SLOT = 1 + len(BAD_SLOTS)
FLAG_SLOTS = OVERFLOW_SLOT + 1


@wp.func
def nonfinite3(v: wp.vec3) -> bool:
    return not (wp.isfinite(v[0]) and wp.isfinite(v[1]) and wp.isfinite(v[2]))


@wp.kernel(enable_backward=False)
def flag_nonfinite(values: wp.array(dtype=float), bad: wp.array(dtype=wp.int32), slot: int):
    """Sets ``bad[slot] = 1`` if any value is NaN or Inf (flat float view of an input)."""
    i = wp.tid()
    if not wp.isfinite(values[i]):
        bad[slot] = 1


@wp.kernel(enable_backward=False)
def flag_nan(values: wp.array(dtype=float), bad: wp.array(dtype=wp.int32), slot: int):
    """Sets ``bad[slot] = 1`` if any value is NaN (+-Inf pass: surface depths use +inf)."""
    i = wp.tid()
    if wp.isnan(values[i]):
        bad[slot] = 1
