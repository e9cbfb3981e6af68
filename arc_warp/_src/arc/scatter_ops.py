"""Kernel-level scatter-add over (index, value) arrays through the ARC accumulators.

For simulation users: particle-to-grid transfers, force accumulation, histogram-like
updates. ``dest[indices[i]] += values[i]`` for every ``i``.
"""

import functools

import numpy as np
import warp as wp
import warp.utils

from arc_warp._src.validate import check_array

from .calibrate import resolve_threshold
from .intrinsics import cpu_launch_guard, reduce_scatter
from .reduce_funcs import _component_ops, accumulator, check_mode, vector_length

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
def _sort_pairs(indices: wp.array(dtype=wp.int32), size: int, keys: wp.array(dtype=wp.int32),
                order: wp.array(dtype=wp.int32)):
    # out-of-range indices get the key `size`, which sorts last and is skipped
    i = wp.tid()
    index = indices[i]
    if index < 0 or index >= size:
        index = size
    keys[i] = index
    order[i] = i


@wp.kernel(enable_backward=False)
def _segment_bounds(keys: wp.array(dtype=wp.int32), count: int, size: int, segments: wp.array2d(dtype=wp.int32)):
    # segments[t] = [start, end) of target t's run in the sorted keys, (0, 0) if none;
    # the two bounds are written by different threads, so they are separate words
    i = wp.tid()
    key = keys[i]
    if key < size:
        if i == 0 or keys[i - 1] != key:
            segments[key, 0] = i
        if i == count - 1 or keys[i + 1] != key:
            segments[key, 1] = i + 1


@functools.cache
def _segment_sum_kernel(dtype):
    to_vec, component_add, vec_k = _component_ops(dtype)
    k = vector_length(dtype)
    reduce_scatter_k, owned_component = reduce_scatter(k)

    def segment_sum(
        dest: wp.array(dtype=dtype),
        segments: wp.array2d(dtype=wp.int32),
        order: wp.array(dtype=wp.int32),
        values: wp.array(dtype=dtype),
        size: int,
        lanes: int,
    ):
        # `lanes` threads per target: a warp, or 1 on a CPU without blocks. Lane l adds
        # the entries l, l + lanes, ... of the target's sorted run in that order, then
        # the warp's lanes meet in the fixed reduce-scatter tree: long runs (a Gaussian
        # on thousands of tiles) are spread over 32 lanes, and the order never varies.
        tid = wp.tid()
        t = tid // lanes
        lane = tid - t * lanes
        start = int(0)
        end = int(0)
        if t < size:
            start = segments[t, 0]
            end = segments[t, 1]
        acc = vec_k()
        j = start + lane
        while j < end:
            acc += to_vec(values[order[j]])
            j += lanes
        # one writer per (target, component): the atomic adds in no contested order
        if lanes == 32:
            total = reduce_scatter_k(-1, acc)  # every lane, padding included
            comp = owned_component(lane)
            if end > start and comp >= 0:
                component_add(dest, t, comp, total)
        elif end > start:
            for c in range(wp.static(k)):
                component_add(dest, t, c, acc[c])

    return wp.kernel(segment_sum, enable_backward=False, module="unique")


def ordered_scatter_parts(count: int, size: int) -> list[tuple]:
    """(shape, dtype) of each array of :func:`ordered_scatter_add`'s scratch for up to ``count``
    entries into ``size`` targets: sort keys and entry ids ((2 * count,) int32 each:
    ``radix_sort_pairs`` needs twice the entries) and each target's [start, end) run ((size, 2))."""
    return [((2 * count,), wp.int32), ((2 * count,), wp.int32), ((size, 2), wp.int32)]


def ordered_scatter_scratch(count: int, size: int, device) -> tuple[wp.array, wp.array, wp.array]:
    """New arrays of :func:`ordered_scatter_parts`."""
    return tuple(wp.empty(shape, dtype=dtype, device=device) for shape, dtype in ordered_scatter_parts(count, size))


def ordered_scatter_add(dest: wp.array, indices: wp.array, values: wp.array, scratch: tuple | None = None):
    """``scatter_add`` in a fixed order: a stable sort of the entry ids by index, then per
    target a fixed-order sum of its entries (strided over a warp's lanes, then a fixed
    tree); no contested atomics, so the result is the same bits on every run. ``scratch``:
    :func:`ordered_scatter_scratch`'s arrays (for at least ``indices``' count and
    ``dest``'s size) to use instead of new ones, so that a repeated call allocates nothing."""
    count, size, device = indices.shape[0], dest.shape[0], dest.device
    keys, order, segments = ordered_scatter_scratch(count, size, device) if scratch is None else scratch
    segments.zero_()
    wp.launch(_sort_pairs, dim=count, inputs=[indices, size], outputs=[keys, order], device=device)
    wp.utils.radix_sort_pairs(keys, order, count, 0, size.bit_length())  # stable: ties keep entry order
    wp.launch(_segment_bounds, dim=count, inputs=[keys, count, size], outputs=[segments], device=device)
    # a warp per target where warps exist (CUDA, CPU block emulation), else a thread
    lanes = 1 if wp.get_device(device).is_cpu and not wp.config.enable_cpu_blocks else 32
    padded = (size * lanes + BLOCK_DIM - 1) // BLOCK_DIM * BLOCK_DIM
    with cpu_launch_guard(device):
        wp.launch(
            _segment_sum_kernel(dest.dtype),
            dim=padded,
            inputs=[dest, segments, order, values, size, lanes],
            device=device,
            block_dim=BLOCK_DIM,
        )


@wp.kernel(enable_backward=False)
def _count_out_of_range(indices: wp.array(dtype=wp.int32), size: int, bad: wp.array(dtype=wp.int32)):
    i = wp.tid()
    index = indices[i]
    if index < 0 or index >= size:
        wp.atomic_add(bad, 0, 1)


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
            ``"arc"`` (default), ``"deterministic"`` (bit-identical from run to run:
            a stable sort by index, then each target's values summed in a fixed
            order; no threshold) or ``"floor"`` (benchmarks only: adds nothing).
        threshold: ARC threshold T (lanes sharing a target before the warp reduces);
            ``None`` uses :func:`arc_warp.resolve_threshold` for ``dest.device``.
        check_bounds: check every index before launch and raise ``IndexError`` if
            any is out of range (one device-to-host copy). With ``False`` there is
            no check and no sync; out-of-range entries are skipped in the kernel.
            Either way nothing is written out of bounds.

    Returns:
        ``dest``.

    Sums are order-dependent only through float32 rounding: all modes agree to
    round-off, and only ``deterministic`` fixes the order. The launches are on
    ``dest.device`` and its current stream.
    """
    check_mode(mode, accumulating=False)
    if not isinstance(dest, wp.array):
        raise TypeError(f"dest must be a wp.array; got {type(dest).__name__}")
    vector_length(dest.dtype)
    check_array(dest, "dest", dest.dtype, 1)
    check_array(indices, "indices", wp.int32, 1)
    check_array(values, "values", dest.dtype, 1)
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
    if mode == "deterministic":
        ordered_scatter_add(dest, indices, values)
        return dest
    t = resolve_threshold(dest.device, threshold)
    padded = (count + BLOCK_DIM - 1) // BLOCK_DIM * BLOCK_DIM
    with cpu_launch_guard(dest.device):
        wp.launch(
            _scatter_kernel(dest.dtype, mode),
            dim=padded,
            inputs=[dest, indices, values, count, t],
            device=dest.device,
            block_dim=BLOCK_DIM,
        )
    return dest
