"""Per-lane atomic add of a float32 vector as float4 / float2 / float atomics.

``wp.atomic_add(dest, index, value)`` on a ``K``-float vector emits ``K`` scalar
``atomicAdd`` s. Compute capability 9.0 and later add ``float2`` and ``float4``
``atomicAdd`` on global memory, 8- and 16-byte aligned (PTX ``atom.global.add.v2.f32`` /
``.v4.f32``, which ptxas issues as ``REDG.E.ADD.F32x2`` / ``F32x4`` when the old value is
unused, as here). :func:`vector_atomic_add` issues the components of one element
in the fewest such chunks its address allows: element ``index`` of a ``K``-float array
starts ``4 * K * index`` bytes past the base, and a view may start at any 4-byte offset,
so the chunking is chosen at run time from the address's *phase*, its 4-byte words past
a 16-byte boundary (``(address >> 2) & 3``). For each of the four phases the chunks are
a static, straight-line sequence (:func:`chunk_plan`): a leading float and/or float2 to
reach 16-byte alignment, float4s, then a float2 and/or float tail. A 12-float gradient at
phase 0 is 3 atomics instead of 12; at phase 1, 5 (1 + 2 + 4 + 4 + 1).

Where it runs:

- CUDA, ``__CUDA_ARCH__ >= 900`` (Hopper, Blackwell): the chunk atomics above. The
  destination must be global memory, which every Warp array is.
- CUDA before sm_90: one scalar ``atomicAdd`` per component, what Warp emits.
- CPU: the same phase switch and chunk sequence as sm_90, with plain adds (what Warp's
  CPU ``atomic_add`` does: a CPU launch runs one fiber at a time), so CPU tests run the
  chunking. Each chunk checks the alignment its GPU atomic would need and writes NaN
  into the element if it is not met: on the GPU that chunk would fault with a
  misaligned address, on the CPU the fault shows in the sums.
"""

import functools

import warp as wp

CHUNK_WIDTHS = (4, 2, 1)
"""Floats per atomic: float4 (16-byte aligned), float2 (8-byte aligned), float."""


def chunk_plan(k: int, phase: int) -> list[tuple[int, int]]:
    """The atomics adding ``k`` floats that start ``phase`` 4-byte words past a 16-byte boundary.

    Returns ``[(offset, width), ...]`` in float components: at each position the widest
    chunk in :data:`CHUNK_WIDTHS` that fits in what is left and whose address is aligned
    to its size. Every component is covered once, in order.
    """
    if k < 1 or phase not in (0, 1, 2, 3):
        raise ValueError(f"chunk_plan needs k >= 1 and phase in 0..3; got k={k}, phase={phase}")
    plan, i = [], 0
    while i < k:
        word = (phase + i) % 4  # 4-byte word within the 16-byte line
        w = next(w for w in CHUNK_WIDTHS if w <= k - i and word % w == 0)
        plan.append((i, w))
        i += w
    return plan


def atomics_per_element(k: int) -> dict[int, int]:
    """Number of atomics :func:`vector_atomic_add` issues on sm_90, by phase (scalar: ``k``)."""
    return {phase: len(chunk_plan(k, phase)) for phase in range(4)}


def _chunk_values(offset: int, width: int) -> list[str]:
    """The components one chunk adds, in address order (shared by the CUDA and CPU arms)."""
    return [f"value.c[{offset + j}]" for j in range(width)]


def _cuda_chunk(offset: int, width: int) -> str:
    """One float4 / float2 / float ``atomicAdd`` (sm_90 SASS: ``REDG.E.ADD.F32x4`` ...)."""
    c = _chunk_values(offset, width)
    if width == 1:
        return f"atomicAdd(_p + {offset}, {c[0]});"
    return f"atomicAdd((float{width}*)(_p + {offset}), make_float{width}({', '.join(c)}));"


def _cpu_chunk(offset: int, width: int) -> str:
    """The chunk as plain adds, after checking the alignment its GPU atomic needs."""
    adds = " ".join(f"_p[{offset + j}] += {c};" for j, c in enumerate(_chunk_values(offset, width)))
    if width == 1:
        return adds
    return f"if (((unsigned long long)(_p + {offset})) % {4 * width} != 0) _bad = true; {adds}"


def _phase_switch(k: int, chunk) -> str:
    """``switch`` over the address phase: one straight-line arm per distinct chunk plan.

    Phases with the same plan share an arm (for ``k = 3``, 0 and 2 are float2 + float, 1
    and 3 float + float2), so lanes of a warp with different phases diverge into at most
    as many arms as there are distinct plans; lanes sharing an index never diverge.
    """
    arms: dict[tuple, list[int]] = {}
    for phase in range(4):
        arms.setdefault(tuple(chunk_plan(k, phase)), []).append(phase)
    lines = ["    switch ((int)(((unsigned long long)_p >> 2) & 3)) {"]
    for plan, phases in arms.items():
        labels = " ".join(f"case {phase}:" for phase in phases)
        body = " ".join(chunk(o, w) for o, w in plan)
        lines.append(f"    {labels} {{ {body} break; }}")
    lines.append("    }")
    return "\n".join(lines)


def _snippet(k: int) -> str:
    """C++ body of the ``k``-component vector atomic add (see the module docstring)."""
    scalar = "\n".join(f"    atomicAdd(_p + {i}, value.c[{i}]);" for i in range(k))
    return f"""
    float* _p = (float*)wp::address(dest, index);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
{_phase_switch(k, _cuda_chunk)}
#elif defined(__CUDA_ARCH__)
{scalar}
#else
    bool _bad = false;
{_phase_switch(k, _cpu_chunk)}
    if (_bad) for (int _i = 0; _i < {k}; ++_i) _p[_i] = NAN;
#endif
"""


@functools.cache
def vector_atomic_add(dtype):
    """``add(dest: wp.array(dtype=dtype), index: int, value: dtype)``: atomic ``dest[index] += value``.

    For a float32 vector ``dtype`` of ``K >= 2`` components (``wp.vec2`` ... any
    ``wp.types.vector(K, wp.float32)``): the ``K`` components go out as float4 / float2 /
    float atomics on sm_90 and later, picked per element by the runtime alignment of its
    address (:func:`chunk_plan`); scalar atomics before sm_90; plain adds on the CPU, by
    the same chunks. The same sum as ``wp.atomic_add``; each chunk is atomic, the element
    as a whole is not (nor is it with scalar atomics). Returns nothing: with the old value
    unused the GPU issues reductions (``RED``), not ``ATOM``. Cached per dtype.
    """
    if not (wp.types.type_is_vector(dtype) and dtype._wp_scalar_type_ is wp.float32 and dtype._length_ >= 2):
        raise TypeError(f"vector_atomic_add needs a float32 vector of 2 or more components; got {dtype!r}")
    k = int(dtype._length_)

    # One stub name for every dtype: Warp resolves them as overloads by the type of dest.
    @wp.func_native(_snippet(k))
    def arc_vector_atomic_add(dest: wp.array(dtype=dtype), index: int, value: dtype): ...

    return arc_vector_atomic_add
