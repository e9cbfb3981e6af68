"""Kernel-level scatter-add over (index, value) arrays through the ARC accumulators.

For simulation users: particle-to-grid transfers, force accumulation, histogram-like
updates. ``dest[indices[i]] += values[i]`` for every ``i``.
"""

import functools

import numpy as np
import warp as wp

from .calibrate import resolve_threshold
from .reduce_funcs import accumulator, check_mode, vector_length

BLOCK_DIM = 256
"""Threads per block of the scatter kernel (a multiple of the 32-lane warp)."""


@functools.cache
def _scatter_kernel(dtype, mode: str):
    add = accumulator(dtype, mode)

    def scatter_add_kernel(
        dest: wp.array(dtype=dtype),
        indices: wp.array(dtype=wp.int32),
        values: wp.array(dtype=dtype),
        count: int,
        threshold: int,
    ):
        i = wp.tid()
        # The launch is padded to whole blocks: padding lanes and out-of-range
        # indices still reach the accumulator, as invalid lanes.
        valid = i < count
        index = int(0)
        value = dtype(0.0)
        if valid:
            index = indices[i]
            value = values[i]
            valid = index >= 0 and index < dest.shape[0]
        add(dest, index, value, valid, threshold)

    return wp.kernel(scatter_add_kernel, enable_backward=False, module="unique")


@wp.kernel(enable_backward=False)
def _count_out_of_range(indices: wp.array(dtype=wp.int32), size: int, bad: wp.array(dtype=wp.int32)):
    i = wp.tid()
    index = indices[i]
    if index < 0 or index >= size:
        wp.atomic_add(bad, 0, 1)


def _check_array(name: str, a, dtype=None, ndim: int = 1):
    if not isinstance(a, wp.array):
        raise TypeError(f"{name} must be a wp.array; got {type(a).__name__}")
    if a.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D; got shape {a.shape}")
    if dtype is not None and not wp.types.types_equal(a.dtype, dtype):
        raise TypeError(
            f"{name} must have dtype {wp.types.type_repr(dtype)}; got {wp.types.type_repr(a.dtype)}"
        )
    if not a.is_contiguous:
        raise ValueError(f"{name} must be contiguous; copy it with .contiguous() first")


def scatter_add(
    dest: wp.array,  # (M,) float32 / vec2 / vec3 / vec4 / vector(K, float32)
    indices: wp.array,  # (N,) int32 in [0, M)
    values: wp.array,  # (N,) same dtype as dest
    mode: str = "arc",
    threshold: int | None = None,
    check_bounds: bool = True,
) -> wp.array:
    """Adds ``values[i]`` into ``dest[indices[i]]`` for every ``i``, in place.

    Args:
        dest: ``(M,)`` array of ``wp.float32`` or a float32 vector type; updated in place.
        indices: ``(N,)`` ``wp.int32`` array of targets in ``[0, M)``.
        values: ``(N,)`` array with the dtype of ``dest``.
        mode: reduction mode, one of ``"atomic"``, ``"warp"``, ``"serial"``,
            ``"arc"`` (default) or ``"floor"`` (benchmarks only: adds nothing).
        threshold: ARC threshold T (lanes sharing a target before the warp reduces);
            ``None`` uses :func:`arc_warp.resolve_threshold` for ``dest.device``.
        check_bounds: check every index before launch and raise ``IndexError`` if
            any is out of range (one device-to-host copy). With ``False`` there is
            no check and no sync; out-of-range entries are skipped in the kernel.
            Either way nothing is written out of bounds.

    Returns:
        ``dest``.

    Sums are order-dependent only through float32 rounding: all modes agree to
    round-off. The launch is on ``dest.device`` and its current stream.
    """
    check_mode(mode)
    if not isinstance(dest, wp.array):
        raise TypeError(f"dest must be a wp.array; got {type(dest).__name__}")
    vector_length(dest.dtype)
    _check_array("dest", dest)
    _check_array("indices", indices, wp.int32)
    _check_array("values", values, dest.dtype)
    if indices.shape[0] != values.shape[0]:
        raise ValueError(
            f"indices and values must have the same length; got {indices.shape[0]} and {values.shape[0]}"
        )
    if indices.device != dest.device or values.device != dest.device:
        raise ValueError(
            f"dest, indices and values must be on one device; got {dest.device}, {indices.device}, {values.device}"
        )
    count = indices.shape[0]
    if count == 0:
        return dest
    if check_bounds:
        bad = wp.zeros(1, dtype=wp.int32, device=dest.device)
        wp.launch(_count_out_of_range, dim=count, inputs=[indices, dest.shape[0], bad], device=dest.device)
        n_bad = int(bad.numpy()[0])
        if n_bad:
            lo, hi = int(np.min(indices.numpy())), int(np.max(indices.numpy()))
            raise IndexError(
                f"{n_bad} of {count} indices are outside [0, {dest.shape[0]}) (min {lo}, max {hi}); "
                "nothing was written"
            )
    t = resolve_threshold(dest.device, threshold)
    padded = (count + BLOCK_DIM - 1) // BLOCK_DIM * BLOCK_DIM
    wp.launch(
        _scatter_kernel(dest.dtype, mode),
        dim=padded,
        inputs=[dest, indices, values, count, t],
        device=dest.device,
        block_dim=BLOCK_DIM,
    )
    return dest
