"""Device-side input checks: the slots of the ``bad`` flags array and the kernels that set them.

The host reads the flags back once per render (with the intersection total in slot 0)
and ``validate.raise_on_flags`` names what was wrong.
"""

import warp as wp

# Slots of the ``bad`` flags array (slot 0 holds the intersection count).
BAD_SLOTS = ("means", "quats", "scales", "opacities", "colors", "quats (zero norm)", "cameras", "surface_colors",
             "surface_depths (NaN)")


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
