"""Warp-level intrinsics as ``wp.func_native`` snippets, with a CPU emulation.

On CUDA these map one-to-one onto the warp intrinsics (``__activemask``,
``__ballot_sync``, ``__shfl_*_sync``, ``__match_any_sync``). On the CPU a thread
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
"""

import functools

import warp as wp

# Shared prologue of the CPU emulation: lane index within the emulated warp,
# warp width, first lane of this warp within the block, and an exchange buffer.
# CPU launches run blocks one at a time on one OS thread and fibers switch only
# at WP_TILE_SYNC, so a static buffer guarded by barriers is race-free.
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
        "    return (int)__match_any_sync((unsigned int)mask, key);",
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
        "    return __shfl_xor_sync((unsigned int)mask, value, lane_mask);",
        """    (void)mask;
    WP_TILE_SYNC();
    _xbuf[_tid] = value;
    const int _n = wp_cpu_get_active_count();
    WP_TILE_SYNC();
    const int _src = _lane ^ lane_mask;
    float _r = 0.0f;
    if (_base + _src < _n) _r = _xbuf[_base + _src];
    return _r;""",
        "    (void)mask; (void)lane_mask; return 0.0f;",
    )
)
def shfl_xor(mask: int, value: float, lane_mask: int) -> float:
    """``value`` of lane ``lane_id() ^ lane_mask`` (``__shfl_xor_sync``).

    A source lane outside an emulated CPU warp narrower than 32 reads ``0``, which
    is what a butterfly sum needs from lanes that do not exist.
    """
    ...


@wp.func_native(
    _native(
        "    return __shfl_sync((unsigned int)mask, value, src_lane);",
        """    (void)mask;
    WP_TILE_SYNC();
    _xbuf[_tid] = value;
    const int _n = wp_cpu_get_active_count();
    WP_TILE_SYNC();
    float _r = 0.0f;
    if (src_lane >= 0 && src_lane < _w && _base + src_lane < _n) _r = _xbuf[_base + src_lane];
    return _r;""",
        "    (void)mask; (void)src_lane; return value;",
    )
)
def shfl(mask: int, value: float, src_lane: int) -> float:
    """``value`` of lane ``src_lane`` (``__shfl_sync``)."""
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


@wp.func_native(
    """
    unsigned int _m = (unsigned int)bits;
    return lane >= 31 ? 0 : (int)(_m & (0xfffffffeu << lane));
"""
)
def lanes_above(bits: int, lane: int) -> int:
    """The lanes of ``bits`` strictly above ``lane``."""
    ...


@wp.func_native(
    """
    unsigned int _m = (unsigned int)bits;
    return lane <= 0 ? 0 : (int)(_m & (0xffffffffu >> (32 - lane)));
"""
)
def lanes_below(bits: int, lane: int) -> int:
    """The lanes of ``bits`` strictly below ``lane``."""
    ...


def _reduce_scatter_snippet(k: int, p: int) -> str:
    """C++ body of a recursive-halving reduce-scatter of ``k`` floats (padded to ``p``).

    Each step exchanges half of the live components with the xor-partner and keeps
    the other half: ``p/2 + p/4 + ... + 1`` shuffles plus the plain butterfly steps
    left over, instead of ``5 k`` for ``k`` separate butterflies. Lane ``l`` ends
    with the warp total of component ``l >> (5 - log2 p)``. The code is emitted
    straight-line over scalar registers: loops over a register array whose bounds
    depend on an outer loop were left rolled by NVRTC and spilled to local memory.
    """
    log_p = p.bit_length() - 1

    def body(exchange) -> list[str]:
        lines = [f"float _v{i} = {'x.c[%d]' % i if i < k else '0.0f'};" for i in range(p)]
        for step in range(5):
            o = 16 >> step
            h = p >> (step + 1) if step < log_p else 0
            if h:
                lines.append(f"{{ const bool _up = (_lane & {o}) != 0;")
                lines += [f"  const float _s{j} = _up ? _v{j} : _v{j + h};" for j in range(h)]
                lines += exchange(h, o)
                lines += [f"  _v{j} = (_up ? _v{j + h} : _v{j}) + _r{j};" for j in range(h)]
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
    """``@wp.func`` ``reduce_scatter(mask: int, x: vector(k)) -> float`` for a full 32-lane warp.

    Sums ``x`` over the warp; lane ``l`` returns the total of component
    ``l >> (5 - log2 p)`` where ``p`` is ``k`` rounded up to a power of two, so
    each component is held by ``32 / p`` lanes. Needs a full warp of 32 lanes
    (CUDA, or CPU emulation with ``block_dim >= 32``).
    """
    if not 1 <= k <= 32:
        raise ValueError(f"reduce_scatter handles 1..32 components; got {k}")
    p = 1 << (k - 1).bit_length()
    vec_k = wp.types.vector(k, wp.float32)

    # One stub name for every k: Warp resolves them as overloads by the type of x.
    @wp.func_native(_reduce_scatter_snippet(k, p))
    def reduce_scatter_vec(mask: int, x: vec_k) -> float: ...

    return reduce_scatter_vec


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
