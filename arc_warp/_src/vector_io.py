"""Vector loads and stores of float32 rows for any kernel (splat and mesh alike).

Warp's own ``a[i]`` moves a vector one float at a time; :func:`vector_io` moves it in
128-bit or 64-bit accesses on CUDA where the memory allows.
"""

import functools

import warp as wp


def _io_snippets(k: int) -> tuple[str, str]:
    """CUDA/C++ bodies of :func:`vector_io`'s load and store of K floats."""
    width = 4 if k % 4 == 0 else 2 if k % 2 == 0 else 1
    if width == 1:
        return "return a.data[i];", "a.data[i] = v;"
    vt, lanes, parts = f"float{width}", "xyzw"[:width], k // width
    gather = " ".join(f"_r.c[{width} * _j + {n}] = _v.{ch};" for n, ch in enumerate(lanes))
    scatter = ", ".join(f"v.c[{width} * _j + {n}]" for n in range(width))
    aligned = f"(reinterpret_cast<unsigned long long>(a.data) & {4 * width - 1}) == 0"
    load = f"""
#if defined(__CUDA_ARCH__)
    if ({aligned}) {{
        const {vt}* _p = reinterpret_cast<const {vt}*>(a.data) + (long long)i * {parts};
        wp::vec_t<{k}, wp::float32> _r;
        for (int _j = 0; _j < {parts}; ++_j) {{ const {vt} _v = __ldg(_p + _j); {gather} }}
        return _r;
    }}
#endif
    return a.data[i];
"""
    store = f"""
#if defined(__CUDA_ARCH__)
    if ({aligned}) {{
        {vt}* _p = reinterpret_cast<{vt}*>(a.data) + (long long)i * {parts};
        for (int _j = 0; _j < {parts}; ++_j) _p[_j] = make_{vt}({scatter});
        return;
    }}
#endif
    a.data[i] = v;
"""
    return load, store


@functools.cache
def vector_io(k: int):
    """(load, store) of K-float32 vectors in a flat contiguous array: ``load(a, i) -> v``
    reads ``a[i]`` of an array the kernel does not write (CUDA's read-only cache);
    ``store(a, i, v)`` writes it.

    Warp's own ``a[i]`` moves a vector one float at a time and wraps negative indices.
    These do neither: on CUDA, K floats move in 128-bit accesses (K a multiple of 4) or
    64-bit ones (K even) when the array's base is aligned to them, as every Warp and
    torch allocation is; a view at another offset falls back to floats (one uniform
    branch). Contract: ``a`` is 1-D and contiguous, ``0 <= i < a.shape[0]``."""
    vec_k = wp.types.vector(k, wp.float32)
    load_src, store_src = _io_snippets(k)

    @wp.func_native(load_src)
    def load(a: wp.array(dtype=vec_k), i: int) -> vec_k: ...

    @wp.func_native(store_src)
    def store(a: wp.array(dtype=vec_k), i: int, v: vec_k): ...

    return load, store
