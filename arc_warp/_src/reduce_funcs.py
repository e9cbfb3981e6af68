"""ARC accumulators: add per-lane values into an array, reducing in the warp first.

``accumulator(dtype, mode)`` returns a ``@wp.func`` ::

    add(dest: wp.array(dtype=dtype), index: int, value: dtype, valid: bool, threshold: int)

that adds ``value`` into ``dest[index]`` for every lane whose ``valid`` is true.
Modes (compile-time specialisations of one body):

``atomic``
    One atomic per lane per component: what Warp's generated adjoints do.
``warp``
    Always reduce in the warp. When all valid lanes share one index (the common
    case in a tiled rasterizer) a butterfly of shuffles sums the warp and K lanes
    issue the K component atomics. Mixed indices fall back to the grouped path.
``serial``
    Group lanes by index with match-any and reduce every group with a segmented
    shuffle tree; each group's K atomics are spread over its lanes.
``arc``
    Adaptive: reduce only the lanes whose index is shared by at least
    ``threshold`` valid lanes of the warp; the others issue raw atomics, which
    are cheaper when few lanes are active. ``threshold`` comes from
    :func:`arc_warp.resolve_threshold` (calibrated per GPU).
``floor``
    Benchmark-only: computes nothing and adds nothing. It keeps ``value`` alive so
    a kernel built with it costs what the same kernel would cost with free atomics.

Every lane of the warp must reach the call (no early ``return`` before it). On
the GPU a warp that is not fully converged at the call uses raw atomics, so the
sum is always right; only the speed depends on convergence.
"""

import functools

import warp as wp

from .intrinsics import (
    active_mask,
    ballot,
    cpu_warp_emulation,
    lane_id,
    lanes_above,
    lanes_below,
    lowest_lane,
    match_any,
    popc,
    reduce_scatter,
    shfl,
    shfl_int,
    warp_width,
)

MODES = ("atomic", "warp", "serial", "arc", "floor")
"""Reduction modes accepted by :func:`accumulator` (``floor`` is for benchmarks only)."""

# A value no real gradient takes: `floor` stores only if a component equals it,
# which never happens but stops the compiler from deleting the computation.
_FLOOR_SENTINEL = 3.0e38


def vector_length(dtype) -> int:
    """Number of float32 components of an accumulator dtype; raises for anything else."""
    if dtype is wp.float32 or dtype is float:
        return 1
    if wp.types.type_is_vector(dtype) and dtype._wp_scalar_type_ is wp.float32:
        return int(dtype._length_)
    raise TypeError(
        f"accumulator dtype must be wp.float32 or a float32 vector (wp.vec2, wp.vec3, wp.vec4, "
        f"wp.types.vector(K, wp.float32)); got {dtype!r}"
    )


def check_mode(mode: str) -> str:
    """Returns ``mode`` if it is one of :data:`MODES`, else raises ``ValueError``."""
    if mode not in MODES:
        raise ValueError(f"reduce mode must be one of {MODES}; got {mode!r}")
    return mode


@functools.cache
def _component_ops(dtype):
    """Typed helpers for one dtype: (to_vec, component_add, VecK)."""
    k = vector_length(dtype)
    vec_k = wp.types.vector(k, wp.float32)
    tname = "f32" if k == 1 and not wp.types.type_is_vector(dtype) else f"v{k}"

    # One stub name for every dtype: Warp resolves them as overloads by the type of dest.
    @wp.func_native("wp::atomic_add(((float*)wp::address(dest, index)) + comp, value);")
    def component_add(dest: wp.array(dtype=dtype), index: int, comp: int, value: float): ...

    def to_vec(value: dtype):
        return vec_k(value)

    to_vec = wp.func(to_vec, name=f"arc_to_vec_{tname}", module="unique")
    return to_vec, component_add, vec_k


@functools.cache
def accumulator(dtype, mode: str = "arc"):
    """Returns the ``@wp.func`` ``add(dest, index, value, valid, threshold)`` for ``dtype``.

    Args:
        dtype: ``wp.float32``, ``wp.vec2``, ``wp.vec3``, ``wp.vec4`` or any
            ``wp.types.vector(K, wp.float32)`` (for example the 9 per-splat
            gradients of 3DGS packed in one vector).
        mode: one of :data:`MODES`.

    The returned function has the signature
    ``add(dest: wp.array(dtype=dtype), index: int, value: dtype, valid: bool, threshold: int)``;
    ``threshold`` matters only for ``arc``. Cached: one function per (dtype, mode).
    """
    check_mode(mode)
    k = vector_length(dtype)
    to_vec, component_add, vec_k = _component_ops(dtype)
    tname = f"v{k}" if wp.types.type_is_vector(dtype) else "f32"
    reduce_scatter_k = reduce_scatter(k)
    shift = 5 - ((1 << (k - 1).bit_length()).bit_length() - 1)

    def spread_atomics(dest: wp.array(dtype=dtype), index: int, total: vec_k, group_size: int, rank: int):
        # Lane `rank` of the group issues components rank, rank+size, ...: K atomics from K lanes.
        for c in range(wp.static(k)):
            if c % group_size == rank:
                component_add(dest, index, c, total[c])

    def grouped(dest: wp.array(dtype=dtype), index: int, x: vec_k, peers: int, mask: int, lane: int, emulate: bool):
        # Segmented shuffle tree over arbitrary lane groups (`peers` = my group, 0 = not
        # participating): each round a lane adds the partial sum of its next live peer.
        # Six rounds always suffice for 32 lanes; CPU emulation runs all six.
        rank = popc(lanes_below(peers, lane))
        size = popc(peers)
        leader = lowest_lane(peers)
        rest = lanes_above(peers, lane)
        part = x
        r = rank
        rounds = int(0)
        while ballot(mask, rest != 0) != 0 or (emulate and rounds < 6):
            nxt = lowest_lane(rest)
            src = lane
            if nxt >= 0:
                src = nxt
            t = vec_k()
            for c in range(wp.static(k)):
                t[c] = shfl(mask, part[c], src)
            if nxt >= 0:
                part = part + t
            rest = rest & ballot(mask, (r & 1) == 0)
            r = r >> 1
            rounds += 1
        src = lane
        if leader >= 0:
            src = leader
        total = vec_k()
        for c in range(wp.static(k)):
            total[c] = shfl(mask, part[c], src)
        if size > 0:
            spread_atomics(dest, index, total, size, rank)

    def add(dest: wp.array(dtype=dtype), index: int, value: dtype, valid: bool, threshold: int):
        if wp.static(mode == "atomic"):
            if valid:
                wp.atomic_add(dest, index, value)
        elif wp.static(mode == "floor"):
            v = to_vec(value)
            if valid and v[0] == wp.static(_FLOOR_SENTINEL):
                dest[index] = value
        else:
            mask = active_mask()
            if mask != -1 or warp_width() != 32:
                # Not a converged 32-lane warp (or a CPU warp of one lane): shuffles
                # would read absent lanes, so every lane adds for itself.
                if valid:
                    wp.atomic_add(dest, index, value)
            else:
                # CPU emulation syncs the whole block: run every collective regardless
                # of the branch taken, so all warps of a block meet the same barriers.
                emulate = cpu_warp_emulation()
                vmask = ballot(mask, valid)
                few = wp.static(mode == "arc") and popc(vmask) < threshold
                if few and not emulate:
                    # Too few lanes for any group to reach T: raw atomics, decided
                    # with one ballot (the common case when coverage is sparse).
                    if valid:
                        wp.atomic_add(dest, index, value)
                    return
                lane = lane_id()
                x = vec_k()
                if valid:
                    x = to_vec(value)
                uniform = False
                key = index
                if wp.static(mode != "serial"):
                    key = shfl_int(mask, index, lowest_lane(vmask))
                    strays = ballot(mask, valid and index != key)
                    uniform = vmask != 0 and strays == 0
                reduce_all = uniform and (wp.static(mode == "warp") or popc(vmask) >= threshold)
                if reduce_all or emulate:
                    # Lane l holds the total of component l >> shift; one lane per component adds.
                    total = reduce_scatter_k(mask, x)
                    comp = lane >> wp.static(shift)
                    if reduce_all and (lane & wp.static((1 << shift) - 1)) == 0 and comp < wp.static(k):
                        component_add(dest, key, comp, total)
                if uniform and not reduce_all and valid:
                    wp.atomic_add(dest, index, value)
                if (vmask != 0 and not uniform) or emulate:
                    peers = match_any(mask, index) & vmask
                    if uniform or not valid:
                        peers = 0
                    if wp.static(mode == "arc"):
                        if peers != 0 and popc(peers) < threshold:
                            wp.atomic_add(dest, index, value)
                            peers = 0
                    grouped(dest, index, x, peers, mask, lane, emulate)

    suffix = f"{mode}_{tname}"
    spread_atomics = wp.func(spread_atomics, name=f"arc_spread_{suffix}", module="unique")
    grouped = wp.func(grouped, name=f"arc_grouped_{suffix}", module="unique")
    return wp.func(add, name=f"arc_add_{suffix}", module="unique")
