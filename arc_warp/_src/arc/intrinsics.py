"""Warp-level intrinsics as ``wp.func_native`` snippets, with a CPU emulation.

On CUDA these map one-to-one onto the warp intrinsics (``__activemask``,
``__ballot_sync``, ``__shfl_*_sync``, ``__match_any_sync``). Each compiles for every
generation Warp targets: ``__match_any_sync`` (sm_70) has a shuffle fallback below it,
the others exist on all of them. On the CPU a thread
is normally a warp of one lane. When ``wp.config.enable_cpu_blocks`` is on and a
kernel is launched with a ``block_dim`` that is a multiple of 32, Warp runs the
block's threads as cooperative fibers; the snippets then emulate 32-lane warps
through a static exchange buffer and ``WP_TILE_SYNC`` barriers, so the CPU
executes the same reduction logic as the GPU. Lanes past the end of a partial
block read as absent (false / zero); the live-lane count is read between the two
barriers of an exchange, where no fiber can have returned.

Contract: every lane of the warp calls these functions together, in the same
order. In CPU emulation the barriers are block-wide, so every lane of the
*block* must make the same sequence of calls (see :func:`cpu_warp_emulation`).
Masks are 32-bit lane masks carried in ``int`` (bit 31 makes the value negative).

Threads: the CPU exchange buffers are C statics, shared by every OS thread (Warp's CPU
JIT cannot link ``thread_local``: it rejects TLS relocations, and Warp keeps its own
CPU tile arena pointer in a static for the same reason). Launch CPU kernels that call
these snippets, or Warp tiles, under :func:`cpu_launch_guard`.
"""

import contextlib
import functools
import threading

import warp as wp

_CPU_LAUNCH_LOCK = threading.Lock()


def cpu_launch_guard(device):
    """Context manager that serialises CPU launches across Python threads; a no-op on CUDA.

    Hold it around CPU launches of kernels whose snippets keep CPU state in C statics
    (see the module docstring); two threads launching at once would share it.
    """
    if wp.get_device(device).is_cpu:
        return _CPU_LAUNCH_LOCK
    return contextlib.nullcontext()


# Shared prologue of the CPU emulation: lane index within the emulated warp,
# warp width, first lane of this warp within the block, and an exchange buffer.
# A CPU launch runs blocks one at a time on one OS thread and fibers switch only
# at WP_TILE_SYNC, so a static buffer guarded by barriers is race-free within a
# launch; cpu_launch_guard keeps launches of other Python threads out.
_CPU_PROLOGUE = """
    const int _w = 32;
    const int _tid = WP_TILE_THREAD_IDX;
    const int _lane = _tid & 31;
    const int _base = _tid - _lane;
    static float _xbuf[WP_TILE_BLOCK_DIM];
"""


def _native(cuda_body: str, cpu_block_body: str, cpu_lane_body: str) -> str:
    """Assembles one snippet: CUDA, emulated CPU block, and single-lane CPU."""
    return f"""
#if defined(__CUDA_ARCH__)
{cuda_body}
#elif WP_TILE_BLOCK_DIM >= 32 && WP_TILE_BLOCK_DIM % 32 == 0
{_CPU_PROLOGUE}
{cpu_block_body}
#else
{cpu_lane_body}
#endif
"""


@wp.func_native(
    _native(
        "    return (int)(threadIdx.x & 31);",
        "    (void)_base; (void)_xbuf; return _lane;",
        "    return 0;",
    )
)
def lane_id() -> int:
    """Index of the calling lane within its warp (``0`` for single-lane CPU warps)."""
    ...


@wp.func_native(
    """
#if !defined(__CUDA_ARCH__) && WP_TILE_BLOCK_DIM >= 32 && WP_TILE_BLOCK_DIM % 32 == 0
    return true;
#else
    return false;
#endif
"""
)
def cpu_warp_emulation() -> bool:
    """True where warps are emulated on the CPU (``enable_cpu_blocks``, ``block_dim % 32 == 0``).

    Emulated shuffles synchronise the whole block, so code that branches around a
    collective must run it anyway when this is true, to keep every warp of the
    block on the same sequence of barriers.
    """
    ...


@wp.func_native(
    _native(
        "    return (int)__activemask();",
        """    (void)_lane; (void)_base; (void)_xbuf; (void)_w;
    WP_TILE_SYNC();
    return (int)0xffffffffu;""",
        "    return 1;",
    )
)
def active_mask() -> int:
    """Mask of the lanes executing this call together (``__activemask``)."""
    ...


@wp.func_native(
    _native(
        "    return 32;",
        "    (void)_lane; (void)_base; (void)_xbuf; return _w;",
        "    return 1;",
    )
)
def warp_width() -> int:
    """Number of lanes in a warp: 32 on CUDA and in CPU emulation, else 1."""
    ...


@wp.func_native(
    _native(
        "    return (int)__ballot_sync((unsigned int)mask, pred);",
        """    (void)mask;
    WP_TILE_SYNC();
    static bool _pbuf[WP_TILE_BLOCK_DIM];
    _pbuf[_tid] = pred;
    const int _n = wp_cpu_get_active_count() - _base;
    WP_TILE_SYNC();
    unsigned int _r = 0;
    for (int _i = 0; _i < _w && _i < _n; ++_i) _r |= (_pbuf[_base + _i] ? 1u : 0u) << _i;
    return (int)_r;""",
        "    (void)mask; return pred ? 1 : 0;",
    )
)
def ballot(mask: int, pred: bool) -> int:
    """Mask of the lanes in ``mask`` whose ``pred`` is true (``__ballot_sync``)."""
    ...


@wp.func_native(
    _native(
        """#if __CUDA_ARCH__ >= 700
    return (int)__match_any_sync((unsigned int)mask, key);
#else
    // no match.sync before sm_70: compare with every lane of the mask in turn
    const unsigned int _m = (unsigned int)mask;
    unsigned int _r = 0;
    for (int _i = 0; _i < 32; ++_i)
        if (((_m >> _i) & 1u) && __shfl_sync(_m, key, _i) == key) _r |= 1u << _i;
    return (int)_r;
#endif""",
        """    (void)mask;
    WP_TILE_SYNC();
    static int _kbuf[WP_TILE_BLOCK_DIM];
    _kbuf[_tid] = key;
    const int _n = wp_cpu_get_active_count() - _base;
    WP_TILE_SYNC();
    unsigned int _r = 0;
    for (int _i = 0; _i < _w && _i < _n; ++_i) _r |= (_kbuf[_base + _i] == key ? 1u : 0u) << _i;
    return (int)_r;""",
        "    (void)mask; (void)key; return 1;",
    )
)
def match_any(mask: int, key: int) -> int:
    """Mask of the lanes in ``mask`` holding the same ``key`` (``__match_any_sync``)."""
    ...


@wp.func_native(
    _native(
        "    return __shfl_sync((unsigned int)mask, value, src_lane);",
        """    (void)mask;
    WP_TILE_SYNC();
    static int _ibuf[WP_TILE_BLOCK_DIM];
    _ibuf[_tid] = value;
    const int _n = wp_cpu_get_active_count();
    WP_TILE_SYNC();
    int _r = 0;
    if (src_lane >= 0 && src_lane < _w && _base + src_lane < _n) _r = _ibuf[_base + src_lane];
    return _r;""",
        "    (void)mask; (void)src_lane; return value;",
    )
)
def shfl_int(mask: int, value: int, src_lane: int) -> int:
    """Integer ``value`` of lane ``src_lane`` (``__shfl_sync``)."""
    ...


@wp.func_native(
    """
#if defined(__CUDA_ARCH__)
    return __popc((unsigned int)bits);
#else
    return __builtin_popcount((unsigned int)bits);
#endif
"""
)
def popc(bits: int) -> int:
    """Number of set bits of a 32-bit mask."""
    ...


@wp.func_native(
    """
#if defined(__CUDA_ARCH__)
    return __ffs(bits) - 1;
#else
    return __builtin_ffs(bits) - 1;
#endif
"""
)
def lowest_lane(bits: int) -> int:
    """Index of the lowest set bit of a 32-bit mask, ``-1`` for an empty mask."""
    ...


@wp.func_native("return (int)((unsigned int)bits & ((unsigned int)bits - 1u));")
def drop_lowest(bits: int) -> int:
    """``bits`` without its lowest set bit (in unsigned arithmetic: bit 31 is an ordinary lane)."""
    ...


def reduce_scatter_plan(k: int) -> tuple[list[tuple[int, int]], list[int], int]:
    """The static schedule of the ``k``-component reduce-scatter.

    Returns ``(steps, weights, owners)``:

    - ``steps[s] = (n, c)`` for the exchange with xor-partner ``16 >> s``: each lane
      holds ``n`` slots (zero-padded) and keeps ``c = ceil(n / 2)`` of them; ``n == 1``
      is a plain butterfly step;
    - lane ``l`` ends with the total of component ``sum(weights[s] * bit(l, 4 - s))``;
    - ``owners`` is the 32-bit mask of the lanes that hold a real component and are
      the lowest lane holding it (one owner per component).
    """
    if not 1 <= k <= 32:
        raise ValueError(f"reduce_scatter handles 1..32 components; got {k}")
    steps, weights, n = [], [], k
    for _ in range(5):
        c = (n + 1) // 2
        steps.append((n, c))
        weights.append(c if n > 1 else 0)
        n = c
    owners = 0
    for lane in range(32):
        base, end = 0, k
        for s, (n, c) in enumerate(steps):
            if n == 1:
                if lane & (16 >> s):
                    base = end  # a butterfly's upper lane holds a copy: not an owner
            elif lane & (16 >> s):
                base += c
            else:
                end = min(end, base + c)
        if base < end:
            owners |= 1 << lane
    return steps, weights, owners


def _reduce_scatter_snippet(k: int) -> str:
    """C++ body of the recursive-halving reduce-scatter of ``k`` floats.

    Each step exchanges ``ceil(n/2)`` of the ``n`` live slots with the xor-partner and
    keeps the others (slots past ``n`` read as zero): 12 shuffles for ``k = 9``
    (5+3+2+1+1) against 45 for nine butterflies, and close to the ``k`` shuffles any
    warp sum of ``k`` values needs. The code is emitted straight-line over scalar
    registers: loops over a register array whose bounds depend on an outer loop were
    left rolled by NVRTC and spilled to local memory.
    """
    steps, _, _ = reduce_scatter_plan(k)

    def body(exchange) -> list[str]:
        lines = [f"float _v{i} = x.c[{i}];" for i in range(k)]
        for s, (n, c) in enumerate(steps):
            o = 16 >> s
            if n > 1:
                hi = [f"_v{c + j}" if c + j < n else "0.0f" for j in range(c)]
                lines.append(f"{{ const bool _up = (_lane & {o}) != 0;")
                lines += [f"  const float _s{j} = _up ? _v{j} : {hi[j]};" for j in range(c)]
                lines += exchange(c, o)
                lines += [f"  _v{j} = (_up ? {hi[j]} : _v{j}) + _r{j};" for j in range(c)]
                lines.append("}")
            else:
                lines.append("{ const float _s0 = _v0;")
                lines += exchange(1, o)
                lines.append("  _v0 += _r0; }")
        lines.append("return _v0;")
        return ["    " + line for line in lines]

    def cuda_exchange(h, o):
        return [f"  const float _r{j} = __shfl_xor_sync((unsigned int)mask, _s{j}, {o});" for j in range(h)]

    def cpu_exchange(h, o):
        return (
            ["  WP_TILE_SYNC();"]
            + [f"  _xb[_tid * 16 + {j}] = _s{j};" for j in range(h)]
            + ["  { const int _alive = wp_cpu_get_active_count(); WP_TILE_SYNC();"]
            + [f"  _rr[{j}] = (_tid ^ {o}) < _alive ? _xb[(_tid ^ {o}) * 16 + {j}] : 0.0f;" for j in range(h)]
            + ["  }"]
            + [f"  const float _r{j} = _rr[{j}];" for j in range(h)]
        )

    cuda = "\n".join(["    const int _lane = threadIdx.x & 31;"] + body(cuda_exchange))
    cpu = "\n".join(
        [
            "    (void)mask; const int _tid = WP_TILE_THREAD_IDX; const int _lane = _tid & 31;",
            "    static float _xb[WP_TILE_BLOCK_DIM * 16]; float _rr[16];",
        ]
        + body(cpu_exchange)
    )
    return f"""
#if defined(__CUDA_ARCH__)
{cuda}
#elif WP_TILE_BLOCK_DIM >= 32 && WP_TILE_BLOCK_DIM % 32 == 0
{cpu}
#else
    (void)mask; return x.c[0];
#endif
"""


@functools.cache
def reduce_scatter(k: int):
    """``(reduce_scatter_vec, owned_component)`` for ``k``-component vectors, ``1 <= k <= 32``.

    ``reduce_scatter_vec(mask: int, x: vector(k)) -> float`` sums ``x`` over a full
    32-lane warp (CUDA, or CPU emulation with ``block_dim >= 32``) and returns to each
    lane the total of one component. ``owned_component(lane: int) -> int`` is the
    component whose total that lane should write, or ``-1``: every component has
    exactly one owner lane, so the ``k`` writes are spread over ``k`` lanes.
    """
    _, weights, owners = reduce_scatter_plan(k)
    vec_k = wp.types.vector(k, wp.float32)

    # One stub name for every k: Warp resolves them as overloads by the type of x.
    @wp.func_native(_reduce_scatter_snippet(k))
    def reduce_scatter_vec(mask: int, x: vec_k) -> float: ...

    owners_int = owners - (1 << 32) if owners >> 31 else owners  # as a signed 32-bit int
    w4, w3, w2, w1, w0 = weights

    def owned_component(lane: int) -> int:
        if ((wp.static(owners_int) >> lane) & 1) == 0:
            return -1
        return (
            ((lane >> 4) & 1) * wp.static(w4)
            + ((lane >> 3) & 1) * wp.static(w3)
            + ((lane >> 2) & 1) * wp.static(w2)
            + ((lane >> 1) & 1) * wp.static(w1)
            + (lane & 1) * wp.static(w0)
        )

    return reduce_scatter_vec, wp.func(owned_component, name=f"arc_owned_component_{k}", module="unique")


@wp.func_native(
    _native(
        "    return value;",
        """    (void)_lane; (void)_xbuf;
    static int _mbuf[WP_TILE_BLOCK_DIM];
    WP_TILE_SYNC();
    _mbuf[_tid] = value;
    const int _n = wp_cpu_get_active_count();
    WP_TILE_SYNC();
    int _r = value;
    for (int _i = 0; _i < _n; ++_i) _r = _mbuf[_i] > _r ? _mbuf[_i] : _r;
    (void)_base; (void)_w;
    return _r;""",
        "    return value;",
    )
)
def emulation_block_max(value: int) -> int:
    """Block-wide maximum in CPU warp emulation; ``value`` unchanged elsewhere.

    Emulated collectives synchronise the whole block, so a loop that runs them must
    have the same trip count in every warp of the block: take the block maximum.
    """
    ...


@wp.func_native(
    """
#if defined(__CUDA_ARCH__)
    return __activemask() == 0xffffffffu;
#elif WP_TILE_BLOCK_DIM >= 32 && WP_TILE_BLOCK_DIM % 32 == 0
    WP_TILE_SYNC();
    const int _n = wp_cpu_get_active_count();
    WP_TILE_SYNC();
    return _n == WP_TILE_BLOCK_DIM;
#else
    return false;
#endif
"""
)
def warp_converged() -> bool:
    """True when full-mask warp collectives are defined at this call.

    CUDA: all 32 lanes execute the call together (``__activemask()`` is full), so
    a ragged launch tail, an early ``return`` or a divergent call site gives false.
    CPU emulation: emulated collectives sync the block and assume its live lanes
    are a prefix, so it is true only while every lane of the block is live (the
    count is read between two barriers; the answer is the same in the whole block).
    A one-lane CPU warp: false.
    """
    ...
