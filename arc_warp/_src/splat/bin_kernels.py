"""Tile binning: Gaussians in depth order, one tile key per Gaussian-tile overlap written in
that order, and per-tile ranges of the (stably) tile-sorted keys. The depth keys are
written by the projection (``project_kernels.project_one``)."""

import warp as wp

from arc_warp._src.splat.geometry_funcs import Splat2D, footprint, row_span, tile_bbox
from arc_warp._src.splat.raster_batch_funcs import batch_rank, block_sync, block_width

# depth key of a Gaussian without tiles (sorts after every depth's float bits)
INT32_MAX = 2**31 - 1


@wp.kernel(enable_backward=False)
def gather_counts(
    order: wp.array(dtype=wp.int32), tiles_per_gauss: wp.array(dtype=wp.int32), counts: wp.array(dtype=wp.int64)
):
    """Tile counts in depth order, widened to int64 for the scan (their sum may pass 2^31)."""
    j = wp.tid()
    counts[j] = wp.int64(tiles_per_gauss[order[j]])


@wp.kernel(enable_backward=False)
def store_total(src: wp.array(dtype=wp.int64), capacity: int, flags: wp.array(dtype=wp.int32), overflow_slot: int):
    """``flags[0] = min(src[-1], 2^31 - 1)``, the intersection total (saturated), next to
    the input flags for one readback; ``flags[overflow_slot] = 1`` if it exceeds
    ``capacity``, the entries the tile sort holds (the farthest Gaussians of some tiles
    are then left out of the image)."""
    total = src[src.shape[0] - 1]
    flags[0] = wp.int32(wp.min(total, wp.int64(INT32_MAX)))
    if total > wp.int64(capacity):
        flags[overflow_slot] = 1


@wp.func
def pad_filler(j: int, cum_tiles: wp.array(dtype=wp.int64), capacity: int, filler: int,
               keys: wp.array(dtype=wp.int32)):
    """Thread ``j``'s share (a grid-stride loop over the N threads) of the sort entries from
    the total up to ``capacity``: the filler tile, which sorts after every real key."""
    n = cum_tiles.shape[0]
    pad = cum_tiles[n - 1] + wp.int64(j)
    while pad < wp.int64(capacity):
        keys[int(pad)] = filler
        pad += wp.int64(n)


@wp.kernel(enable_backward=False)
def write_keys(
    order: wp.array(dtype=wp.int32),
    splats: wp.array(dtype=Splat2D),
    radii: wp.array(dtype=wp.vec2i),
    tiles_per_gauss: wp.array(dtype=wp.int32),
    cum_tiles: wp.array(dtype=wp.int64),
    tiles_x: int,
    tiles_y: int,
    capacity: int,
    keys: wp.array(dtype=wp.int32),
    gauss_ids: wp.array(dtype=wp.int32),
):
    """Tile keys of the ``j``-th Gaussian in depth order, for the tiles ``count_tiles``
    counted, in the same ``row_span`` walk; writes exactly ``tiles_per_gauss[i]`` entries
    (a shortfall, which the shared walk rules out, would get the filler tile
    ``tiles_x * tiles_y``, which sorts last and belongs to no range). Entries from
    ``capacity`` on are dropped: the sort was sized before the total was known, and the
    host re-renders when the total it reads back exceeds ``capacity``. The entries from
    the total up to ``capacity`` get the filler tile, so the sort puts only real keys
    ahead of them; the N threads share them in a grid-stride loop (one launch less).

    One thread writes its Gaussian's keys: for small splats (a few keys each), whose
    warps' ranges are short and adjacent; ``write_keys_staged`` is for large ones."""
    j = wp.tid()
    filler = tiles_x * tiles_y
    pad_filler(j, cum_tiles, capacity, filler, keys)
    i = order[j]
    count = wp.int64(tiles_per_gauss[i])
    start = cum_tiles[j] - count
    if count == wp.int64(0) or start >= wp.int64(capacity):
        return
    splat = splats[i]
    geom = splat.geom
    f = footprint(geom, splat.conic)
    box = tile_bbox(wp.vec2(geom[0], geom[1]), radii[i], tiles_x, tiles_y)
    # both fit an int32 index now: start < capacity and end is clamped to it
    end = int(wp.min(cum_tiles[j], wp.int64(capacity)))
    k = int(start)
    for ty in range(box[1], box[3]):
        span = row_span(f, ty, box)
        for tx in range(span[0], span[1]):
            if k < end:
                keys[k] = ty * tiles_x + tx
                gauss_ids[k] = i
            k += 1
    while k < end:
        keys[k] = filler
        gauss_ids[k] = i
        k += 1


# entries a ``write_keys_staged`` block stages in shared memory per round (keys and ids: 32 KiB)
STAGE_ENTRIES = 4096
# sorts of more than this many entries per Gaussian (large splats) are written staged
STAGED_KEYS_PER_GAUSSIAN = 4


@wp.func_native(
    f"""
#if defined(__CUDA_ARCH__)
    __shared__ __align__(8) int _stage[2 * {STAGE_ENTRIES}];
#else
    static int _stage[2 * {STAGE_ENTRIES}];
#endif
    return (wp::uint64)_stage;
"""
)
def stage_buffer() -> wp.uint64:
    """Address of the block's staging buffer: ``STAGE_ENTRIES`` (key, Gaussian id) pairs
    (``__shared__`` on CUDA; a static on the CPU, race-free as ``raster_batch_funcs``'
    batches are)."""
    ...


@wp.func_native(
    """
    int* _p = reinterpret_cast<int*>(buf) + 2 * slot;
    _p[0] = key;
    _p[1] = gauss_id;
"""
)
def stage_put(buf: wp.uint64, slot: int, key: int, gauss_id: int):
    """Stages one (tile key, Gaussian id) entry in ``slot`` of the staging buffer."""
    ...


@wp.func_native(
    """
#if defined(__CUDA_ARCH__)
    const int2 _v = reinterpret_cast<const int2*>(buf)[slot];
    return wp::vec2i(_v.x, _v.y);
#else
    const int* _p = reinterpret_cast<const int*>(buf) + 2 * slot;
    return wp::vec2i(_p[0], _p[1]);
#endif
"""
)
def stage_get(buf: wp.uint64, slot: int) -> wp.vec2i:
    """The (tile key, Gaussian id) entry staged in ``slot`` (one 64-bit shared load)."""
    ...


@wp.kernel(enable_backward=False)
def write_keys_staged(
    order: wp.array(dtype=wp.int32),
    splats: wp.array(dtype=Splat2D),
    radii: wp.array(dtype=wp.vec2i),
    tiles_per_gauss: wp.array(dtype=wp.int32),
    cum_tiles: wp.array(dtype=wp.int64),
    tiles_x: int,
    tiles_y: int,
    capacity: int,
    keys: wp.array(dtype=wp.int32),
    gauss_ids: wp.array(dtype=wp.int32),
):
    """``write_keys``' entries (the same, entry for entry) written through shared memory,
    for large splats, whose one-thread walks would store a 32nd of each warp's stores far
    apart from the others.

    A block's Gaussians are consecutive in depth order, so their entries are one range of
    the sort. The block writes it in rounds of ``STAGE_ENTRIES``: each thread walks its
    Gaussian's tiles into shared memory, then the block copies the round out, thread by
    thread, so the global stores are side by side. Launch whole blocks: every thread of a
    block reaches its barriers, threads from N on with nothing of their own."""
    j = wp.tid()
    n = cum_tiles.shape[0]
    filler = tiles_x * tiles_y
    rank = batch_rank()
    width = block_width()
    first = j - rank  # the block's first Gaussian in depth order
    # the block's range [lo, hi) of the sort (a CPU block of one past N: empty)
    lo = int(0)
    if first > 0:
        lo = int(wp.min(cum_tiles[wp.min(first, n) - 1], wp.int64(capacity)))
    hi = int(wp.min(cum_tiles[wp.min(first + width, n) - 1], wp.int64(capacity)))
    # this thread's entries [at, end): none past the Gaussians
    at = hi
    end = hi
    g = wp.min(j, n - 1)
    i = order[g]
    if j < n:
        pad_filler(j, cum_tiles, capacity, filler, keys)
        # both fit an int32 index: clamped to the capacity
        at = int(wp.min(cum_tiles[j] - wp.int64(tiles_per_gauss[i]), wp.int64(capacity)))
        end = int(wp.min(cum_tiles[j], wp.int64(capacity)))
    splat = splats[i]
    geom = splat.geom
    f = footprint(geom, splat.conic)
    box = tile_bbox(wp.vec2(geom[0], geom[1]), radii[i], tiles_x, tiles_y)
    # the walk's position: the next row, and the tiles [tx, tx_end) left in row ``row``
    ty = box[1]
    row = ty
    tx = int(0)
    tx_end = int(0)
    buf = stage_buffer()
    base = lo
    while base < hi:  # the same rounds in the whole block
        stop = wp.min(end, base + STAGE_ENTRIES)
        while at < stop:
            while tx >= tx_end and ty < box[3]:
                span = row_span(f, ty, box)
                tx = span[0]
                tx_end = span[1]
                row = ty
                ty += 1
            key = filler
            if tx < tx_end:
                key = row * tiles_x + tx
                tx += 1
            stage_put(buf, at - base, key, i)
            at += 1
        block_sync()
        top = wp.min(hi, base + STAGE_ENTRIES)
        slot = base + rank
        while slot < top:
            entry = stage_get(buf, slot - base)
            keys[slot] = entry[0]
            gauss_ids[slot] = entry[1]
            slot += width
        block_sync()
        base += STAGE_ENTRIES


@wp.func
def first_at_least(keys: wp.array(dtype=wp.int32), count: int, value: int) -> int:
    """Index of the first of the ``count`` sorted ``keys`` that is >= ``value``, or ``count``
    (``wp.lower_bound`` never returns past the last element)."""
    lo = int(0)
    hi = count
    while lo < hi:
        mid = lo + (hi - lo) // 2
        if keys[mid] < value:
            lo = mid + 1
        else:
            hi = mid
    return lo


@wp.kernel(enable_backward=False)
def tile_ranges(keys: wp.array(dtype=wp.int32), n_isects: int, ranges: wp.array(dtype=wp.vec2i)):
    """[start, end) of each tile in the first ``n_isects`` sorted keys, by binary search:
    thread ``t`` of ``n_tiles + 1`` finds where tile ``t`` starts, which is where tile
    ``t - 1`` ends (a few dependent loads per tile, where a thread per entry reads every
    key); a tile without entries gets an empty range (start == end)."""
    t = wp.tid()
    start = first_at_least(keys, n_isects, t)
    if t < ranges.shape[0]:
        ranges[t][0] = start
    if t > 0:
        ranges[t - 1][1] = start
