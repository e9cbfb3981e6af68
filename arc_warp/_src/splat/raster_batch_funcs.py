"""Block-shared batches of splats for the tile rasteriser (``wp.func_native`` snippets).

A rasteriser block (one 16x16 tile, one thread per pixel) walks the tile's depth-sorted
Gaussians in batches of ``block_dim`` entries: each thread stages one entry in shared
memory (``batch_stage``), the block meets at a barrier, then every thread reads the
whole batch from there (``batch_get``, a broadcast 128-bit shared load). Each entry is
three quads of four floats: ``GEOM`` = (x, y, opacity, depth), ``CONIC`` = (a, b, c,
Gaussian id as float bits, see ``float_bits``), ``RGB`` = (r, g, b, subtile mask as float
bits, ``batch_subtiles``: which warps' pixel blocks the splat can reach; 0 when unused).

On CUDA the batch lives in ``__shared__`` memory and the barriers are ``__syncthreads``.
Every snippet compiles for every CUDA generation Warp targets: intrinsics of a later
one (``__reduce_max_sync``, sm_80) are guarded by ``__CUDA_ARCH__`` with a fallback.
On the CPU the same code runs with a static buffer: with ``enable_cpu_blocks`` the
block's fibers share it and ``WP_TILE_SYNC`` is the barrier; without, a block is one
thread and batches have one entry. A CPU launch runs one block at a time on one OS
thread, so a static buffer is race-free within it; launches from several Python
threads must hold ``cpu_launch_guard`` (Warp's CPU JIT links no ``thread_local``).

Contract: every thread of the block calls ``block_sync``/``block_count`` the same
number of times (pixels outside the image included; no early ``return``).
"""

import functools

import warp as wp

from arc_warp._src.splat.geometry_funcs import Splat2D

GEOM = 0
CONIC = 1
RGB = 2


@wp.func_native(
    """
#if defined(__CUDA_ARCH__)
    __shared__ __align__(16) float4 _batch[3 * WP_TILE_BLOCK_DIM];
#else
    static float _batch[12 * WP_TILE_BLOCK_DIM];
#endif
    return (wp::uint64)_batch;
"""
)
def batch_buffer() -> wp.uint64:
    """Address of the block's batch storage (3 quads x ``block_dim`` entries)."""
    ...


@wp.func_native(
    """
    union { int i; float f; } _id, _subtiles;
    _id.i = gauss_id;
    _subtiles.i = subtiles;
    float* _p = reinterpret_cast<float*>(buf) + 4 * slot;
#if defined(__CUDA_ARCH__)
    float4* _q = reinterpret_cast<float4*>(_p);
    _q[0] = make_float4(geom[0], geom[1], geom[2], geom[3]);
    _q[WP_TILE_BLOCK_DIM] = make_float4(conic[0], conic[1], conic[2], _id.f);
    _q[2 * WP_TILE_BLOCK_DIM] = make_float4(rgb[0], rgb[1], rgb[2], _subtiles.f);
#else
    float* _c = _p + 4 * WP_TILE_BLOCK_DIM;
    float* _r = _p + 8 * WP_TILE_BLOCK_DIM;
    for (int _i = 0; _i < 4; ++_i) _p[_i] = geom[_i];
    for (int _i = 0; _i < 3; ++_i) _c[_i] = conic[_i];
    _c[3] = _id.f;
    for (int _i = 0; _i < 3; ++_i) _r[_i] = rgb[_i];
    _r[3] = _subtiles.f;
#endif
"""
)
def batch_stage(buf: wp.uint64, slot: int, geom: wp.vec4, conic: wp.vec4, rgb: wp.vec3, gauss_id: int, subtiles: int):
    """Writes one entry into batch ``slot``; ``conic[3]`` is replaced by the id's bits, the
    RGB quad's fourth float by the bits of ``subtiles``."""
    ...


@wp.func_native(
    """
    const float* _p = reinterpret_cast<const float*>(buf) + 4 * (quad * WP_TILE_BLOCK_DIM + slot);
#if defined(__CUDA_ARCH__)
    const float4 _v = *reinterpret_cast<const float4*>(_p);
    return wp::vec4(_v.x, _v.y, _v.z, _v.w);
#else
    return wp::vec4(_p[0], _p[1], _p[2], _p[3]);
#endif
"""
)
def batch_get(buf: wp.uint64, quad: int, slot: int) -> wp.vec4:
    """Quad ``quad`` (``GEOM``, ``CONIC`` or ``RGB``) of the entry in batch ``slot``."""
    ...


@wp.func_native(
    """
    return reinterpret_cast<const int*>(buf)[4 * (2 * WP_TILE_BLOCK_DIM + slot) + 3];
"""
)
def batch_subtiles(buf: wp.uint64, slot: int) -> int:
    """The subtile mask staged with the entry in batch ``slot`` (one 32-bit shared load)."""
    ...


@wp.func_native(
    """
#if defined(__CUDA_ARCH__)
    return (int)threadIdx.x;
#else
    return WP_TILE_THREAD_IDX;
#endif
"""
)
def batch_rank() -> int:
    """Index of the calling thread in its block: the batch slot it stages."""
    ...


@wp.func_native(
    """
#if defined(__CUDA_ARCH__)
    __syncthreads();
#else
    WP_TILE_SYNC();
#endif
"""
)
def block_sync():
    """Barrier of the whole block."""
    ...


@wp.func_native("return WP_TILE_BLOCK_DIM;")
def block_width() -> int:
    """Number of threads in the calling block (1 for a CPU block without ``enable_cpu_blocks``)."""
    ...


@wp.func_native(
    """
#if defined(__CUDA_ARCH__)
    return __syncthreads_count(pred);
#elif WP_TILE_BLOCK_DIM > 1
    static int _flags[WP_TILE_BLOCK_DIM];
    WP_TILE_SYNC();
    _flags[WP_TILE_THREAD_IDX] = pred ? 1 : 0;
    const int _n = wp_cpu_get_active_count();
    WP_TILE_SYNC();
    int _count = 0;
    for (int _i = 0; _i < _n; ++_i) _count += _flags[_i];
    return _count;
#else
    return pred ? 1 : 0;
#endif
"""
)
def block_count(pred: bool) -> int:
    """Barrier of the whole block that returns how many of its threads pass ``pred``."""
    ...


@wp.func_native(
    """
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    return __reduce_max_sync(0xffffffffu, value);
#elif defined(__CUDA_ARCH__)
    int _max = value;  // no redux.sync before sm_80: a shuffle butterfly
    for (int _o = 16; _o > 0; _o >>= 1) {
        const int _other = __shfl_xor_sync(0xffffffffu, _max, _o);
        _max = _other > _max ? _other : _max;
    }
    return _max;
#elif WP_TILE_BLOCK_DIM > 1
    static int _values[WP_TILE_BLOCK_DIM];
    WP_TILE_SYNC();
    _values[WP_TILE_THREAD_IDX] = value;
    const int _n = wp_cpu_get_active_count();
    WP_TILE_SYNC();
    int _max = value;
    for (int _i = 0; _i < _n; ++_i) _max = _values[_i] > _max ? _values[_i] : _max;
    return _max;
#else
    return value;
#endif
"""
)
def lockstep_max(value: int) -> int:
    """Maximum of ``value`` over the threads that run in lockstep with the caller.

    That is the 32-lane warp on CUDA (every lane must call), the whole block under
    CPU block emulation (whose warp collectives synchronise the block, so all fibers
    must run the same loop trips), and the thread itself otherwise.
    """
    ...


@wp.func_native(
    """
#if defined(__CUDA_ARCH__)
    return __any_sync(0xffffffffu, pred);
#elif WP_TILE_BLOCK_DIM > 1
    static bool _preds[WP_TILE_BLOCK_DIM];
    WP_TILE_SYNC();
    _preds[WP_TILE_THREAD_IDX] = pred;
    const int _n = wp_cpu_get_active_count();
    WP_TILE_SYNC();
    bool _any = false;
    for (int _i = 0; _i < _n; ++_i) _any = _any || _preds[_i];
    return _any;
#else
    return pred;
#endif
"""
)
def lockstep_any(pred: bool) -> bool:
    """Whether ``pred`` holds for any thread running in lockstep with the caller
    (the same groups as :func:`lockstep_max`)."""
    ...


@wp.func_native(
    """
#if defined(__CUDA_ARCH__)
    const float4 _v = reinterpret_cast<const float4*>(wp::address(splats, index))[quad];
    return wp::vec4(_v.x, _v.y, _v.z, _v.w);
#else
    const float* _p = reinterpret_cast<const float*>(wp::address(splats, index)) + 4 * quad;
    return wp::vec4(_p[0], _p[1], _p[2], _p[3]);
#endif
"""
)
def splat_quad(splats: wp.array(dtype=Splat2D), index: int, quad: int) -> wp.vec4:
    """``splats[index].geom`` (quad 0) or ``.conic`` (quad 1) as one 128-bit load.

    ``Splat2D`` is 32 bytes and Warp allocations are 256-byte aligned, so each quad
    of a contiguous array is 16-byte aligned.
    """
    ...


# Deterministic backward: per-warp partial gradients of a chunk of batch entries, in
# shared memory laid out [slot][warp][component]; PARTIAL_WIDTH components per cell.
PARTIAL_CHUNK = 32
PARTIAL_WIDTH = 12


@wp.func_native(
    f"""
    const int _nw = (WP_TILE_BLOCK_DIM + 31) / 32;
#if defined(__CUDA_ARCH__)
    __shared__ float _part[{PARTIAL_CHUNK} * _nw * {PARTIAL_WIDTH}];
    const int _rank = (int)threadIdx.x;
#else
    static float _part[{PARTIAL_CHUNK} * _nw * {PARTIAL_WIDTH}];
    const int _rank = WP_TILE_THREAD_IDX;
#endif
    for (int _i = _rank; _i < {PARTIAL_CHUNK} * _nw * {PARTIAL_WIDTH}; _i += WP_TILE_BLOCK_DIM) _part[_i] = 0.0f;
    return (wp::uint64)_part;
"""
)
def partial_buffer() -> wp.uint64:
    """Zeroes this thread's share of the block's partial-gradient cells and returns their
    address; a ``block_sync`` must follow before any ``partial_put``."""
    ...


@wp.func_native(
    f"""
#if defined(__CUDA_ARCH__)
    const int _warp = (int)threadIdx.x >> 5;
#else
    const int _warp = WP_TILE_THREAD_IDX >> 5;
#endif
    const int _nw = (WP_TILE_BLOCK_DIM + 31) / 32;
    reinterpret_cast<float*>(buf)[(slot * _nw + _warp) * {PARTIAL_WIDTH} + comp] = value;
"""
)
def partial_put(buf: wp.uint64, slot: int, comp: int, value: float):
    """Stores the calling warp's total of component ``comp`` for chunk slot ``slot``."""
    ...


@wp.func_native(
    f"""
    const int _nw = (WP_TILE_BLOCK_DIM + 31) / 32;
    float* _p = reinterpret_cast<float*>(buf) + slot * _nw * {PARTIAL_WIDTH} + comp;
    float _sum = 0.0f;
    for (int _w = 0; _w < _nw; ++_w) {{
        _sum += _p[_w * {PARTIAL_WIDTH}];
        _p[_w * {PARTIAL_WIDTH}] = 0.0f;
    }}
    return _sum;
"""
)
def partial_take(buf: wp.uint64, slot: int, comp: int) -> float:
    """Sum over the block's warps, in warp order, of one cell; leaves the cells zero."""
    ...


_STORE_COMPONENT = """
    float* _d = ((float*)wp::address(dest, index)) + comp;
#if !defined(__CUDA_ARCH__) && WP_TILE_BLOCK_DIM == 1
    *_d += value;
#else
    *_d = value;
#endif
"""


@functools.cache
def partial_store(grad_t):
    """``store(dest, index, comp, value)``: writes one component of ``dest[index]``.

    Each (index, comp) has one writer per block, and a tile's entries belong to one block;
    a CPU block of one thread (no ``enable_cpu_blocks``) is one pixel, so there the pixels
    of a tile add in launch order instead.
    """

    @wp.func_native(_STORE_COMPONENT)
    def store_component(dest: wp.array(dtype=grad_t), index: int, comp: int, value: float): ...

    return store_component
