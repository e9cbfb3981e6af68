"""The ``@wp.func`` s that :func:`arc_warp.arc_adjoint` puts into a user's kernel.

Two families, each cached per (array dtype, ndim, mode, threshold):

- :func:`read_func` ``read(a, idx: wp.vec4i, site: int) -> dtype``: ``a[idx...]``. Its
  custom adjoint (``wp.func_grad``) adds the adjoint of the value into the array's
  gradient through the ARC accumulator, where Warp's generated adjoint (``adj_address``)
  issues one atomic per thread. Like ``adj_address`` it adds into the adjoint array the
  launch passes (``adj_inputs``, the tape's ``a.grad``) or else ``a.grad``, and into
  nothing when neither exists.
- :func:`add_func` ``add(a, idx: wp.vec4i, value: dtype, site: int)``: ``wp.atomic_add``
  whose old value is unused. The forward adds through the ARC accumulator; the replay in
  the backward kernel adds nothing (``wp.func_replay``), and the adjoint is Warp's own,
  a gather ``adj_value += adj_a[idx...]`` with no atomic.

An element of ``a`` is addressed through a one-dimensional view with a 4-byte stride over
the same memory (:func:`_native_funcs`): slot ``s`` is the element that starts ``4 s``
bytes past the base. Any Warp array of 32-bit floats (views and strides included) maps to
such slots, and the slot is a key that equal elements share, which is what the warp's
match-any needs. Matrices, quaternions and transforms of K <= 32 floats are added as
``wp.types.vector(K, wp.float32)`` (:func:`flat_dtype`).

Slots are 32-bit ints, as the accumulator's indices are: an array may span up to 2^31
floats. ``site`` is a compile-time number per rewritten expression. On the GPU each call
plans on its own (:func:`~.reduce_funcs.warp_plan` checks ``__activemask``). CPU warp emulation
synchronises the whole block, so a kernel whose lanes branch around different sites would
pair the wrong barriers: :func:`site_converged` compares the site of every lane first and
sends a block whose lanes stand at different sites to per-lane adds, after the same two
barriers in every lane, so the block stays in step.
"""

import functools

import warp as wp

from .intrinsics import _native
from .reduce_funcs import ACCUMULATOR_MODES, _PER_LANE_MODES, accumulator, lane_adder, lane_atomic_add

MAX_COMPONENTS = 32
"""Most float32 components one element may have (the accumulator's limit)."""


def flat_dtype(dtype):
    """The accumulator dtype for elements of ``dtype``, or ``None`` if they are left to Warp.

    ``wp.float32`` and float32 vectors map to themselves; float32 matrices, quaternions and
    transforms of K <= 32 components to ``wp.types.vector(K, wp.float32)``. Other dtypes
    (float16, float64, integers, structs) get no ARC: the accumulator adds float32 only.
    """
    if dtype is float or dtype is wp.float32:
        return wp.float32
    scalar = getattr(dtype, "_wp_scalar_type_", None)
    length = getattr(dtype, "_length_", None)
    if scalar is not wp.float32 or not isinstance(length, int) or not 1 <= length <= MAX_COMPONENTS:
        return None
    if wp.types.type_is_vector(dtype):
        return dtype
    return wp.types.vector(length, wp.float32)


@wp.func_native(
    _native(
        # the accumulator's plan checks __activemask: each call site plans on its own
        "    (void)site; return true;",
        """    (void)_lane; (void)_base; (void)_xbuf; (void)_w;
    static int _sbuf[WP_TILE_BLOCK_DIM];
    WP_TILE_SYNC();
    _sbuf[_tid] = site;
    const int _n = wp_cpu_get_active_count();
    WP_TILE_SYNC();
    bool _same = _n == WP_TILE_BLOCK_DIM;
    for (int _i = 0; _i < _n; ++_i) _same = _same && _sbuf[_i] == site;
    return _same;""",
        "    (void)site; return true;",
    )
)
def site_converged(site: int) -> bool:
    """False in CPU warp emulation unless every lane of the block is live and calls this
    with the same ``site``; True elsewhere (on CUDA the accumulator's plan checks the warp).

    Two barriers in every lane whatever the answer, so lanes at different sites (a branch
    of the user's kernel) stay paired barrier for barrier.
    """
    ...


@functools.cache
def site_adder(acc, mode: str, threshold: int):
    """``add(dest: wp.array(dtype=acc), slot: int, value: acc, valid: bool, site: int)``: the
    accumulator of ``mode`` at compile-time ``threshold``, guarded by :func:`site_converged`.
    Per-lane modes (``atomic``, ``floor``) make no collective, so no guard either."""
    if mode not in ACCUMULATOR_MODES:
        raise ValueError(f"mode must be one of {ACCUMULATOR_MODES}; got {mode!r}")
    reduce_add = accumulator(acc, mode)
    per_lane = lane_adder(acc, mode)
    atomic_add = lane_atomic_add(acc)

    def add(dest: wp.array(dtype=acc), slot: int, value: acc, valid: bool, site: int):
        if wp.static(mode in _PER_LANE_MODES):
            per_lane(dest, slot, value, valid, wp.static(threshold))
        elif site_converged(site):
            reduce_add(dest, slot, value, valid, wp.static(threshold))
        elif valid:
            atomic_add(dest, slot, value)

    tag = "f32" if acc is wp.float32 else f"v{acc._length_}"
    return wp.func(add, name=f"arc_site_add_{mode}_{threshold}_{tag}", module="unique")


def _index_list(ndim: int) -> str:
    return ", ".join(f"idx[{k}]" for k in range(ndim))


@functools.cache
def _native_funcs(dtype, ndim: int):
    """Natives over ``wp.array(dtype=dtype, ndim=ndim)``, accumulator dtype ``acc``:

    - ``grad_view(a, ga) -> wp.array(dtype=acc)``: the 4-byte-stride view of the gradient
      ``adj_address`` would add into (``ga``, the adjoint array, else ``a.grad``; null if
      neither);
    - ``grad_slot(a, ga, idx) -> int``: slot of element ``idx`` in that view;
    - ``grad_read(a, ga, idx) -> dtype``: that gradient's element, zero if none;
    - ``data_view(a)`` / ``data_slot(a, idx)``: the same for ``a`` itself;
    - ``has_data(view) -> bool``; ``flatten(x: dtype) -> acc``: the K floats of ``x``.
    """
    acc = flat_dtype(dtype)
    arr = wp.array(dtype=dtype, ndim=ndim)
    view_t = wp.array(dtype=acc)
    acc_c = "wp::float32" if acc is wp.float32 else f"wp::vec_t<{acc._length_},wp::float32>"
    ix = _index_list(ndim)
    # slots span the elements' starts: 1 + sum((shape - 1) * stride) / 4
    extent = "\n".join(
        f"    if (_a.shape.dims[{k}] > 0) _n += (_a.shape.dims[{k}] - 1) * (_a.strides[{k}] / 4);" for k in range(ndim)
    )

    def view_body(pick: str) -> str:
        return f"""{pick}
    int _n = 1;
{extent}
    wp::array_t<{acc_c}> _v(({acc_c}*)_p, _n);
    _v.strides[0] = 4;
    return _v;"""

    grad_pick = """    const auto& _a = ga.data ? ga : a;
    void* _p = ga.data ? (void*)ga.data : (void*)a.grad;"""

    @wp.func_native(view_body(grad_pick))
    def grad_view(a: arr, ga: arr) -> view_t: ...

    @wp.func_native(f"""
    if (ga.data) return (int)(((const char*)&wp::index(ga, {ix}) - (const char*)ga.data) / 4);
    if (a.grad) return (int)(((const char*)&wp::index_grad(a, {ix}) - (const char*)a.grad) / 4);
    return 0;""")
    def grad_slot(a: arr, ga: arr, idx: wp.vec4i) -> int: ...

    @wp.func_native(f"""
    if (ga.data) return wp::index(ga, {ix});
    if (a.grad) return wp::index_grad(a, {ix});
    return {{}};""")
    def grad_read(a: arr, ga: arr, idx: wp.vec4i) -> dtype: ...

    @wp.func_native(view_body("    const auto& _a = a;\n    void* _p = (void*)a.data;"))
    def data_view(a: arr) -> view_t: ...

    @wp.func_native(f"    return (int)(((const char*)&wp::index(a, {ix}) - (const char*)a.data) / 4);")
    def data_slot(a: arr, idx: wp.vec4i) -> int: ...

    @wp.func_native("    return v.data != nullptr;")
    def has_data(v: view_t) -> bool: ...

    @wp.func_native(f"    {acc_c} _r; memcpy(&_r, &x, sizeof(_r)); return _r;")
    def flatten(x: dtype) -> acc: ...

    return grad_view, grad_slot, grad_read, data_view, data_slot, has_data, flatten


def _tag(dtype, ndim: int, mode: str, threshold: int) -> str:
    name = getattr(dtype, "__name__", str(dtype)).replace(".", "_")
    return f"{name}_{ndim}d_{mode}_{threshold}"


def _check(dtype, ndim: int):
    if flat_dtype(dtype) is None:
        raise TypeError(f"ARC adjoints take float32 scalars, vectors, matrices, quaternions or transforms of up to "
                        f"{MAX_COMPONENTS} floats; got {dtype!r}")
    if ndim not in (1, 2, 3, 4):
        raise ValueError(f"arrays have 1 to 4 dimensions; got {ndim}")


@functools.cache
def read_func(dtype, ndim: int, mode: str, threshold: int):
    """``read(a: wp.array(dtype=dtype, ndim=ndim), idx: wp.vec4i, site: int) -> dtype``:
    ``a[idx[0], ..., idx[ndim - 1]]``, whose adjoint adds into the gradient of ``a`` with
    the ARC accumulator of ``mode`` (see the module notes)."""
    _check(dtype, ndim)
    grad_view, grad_slot, _, _, _, has_data, flatten = _native_funcs(dtype, ndim)
    add = site_adder(flat_dtype(dtype), mode, threshold)
    arr = wp.array(dtype=dtype, ndim=ndim)
    same = flat_dtype(dtype) is dtype

    def read(a: arr, idx: wp.vec4i, site: int) -> dtype:
        if wp.static(ndim == 1):
            return a[idx[0]]
        elif wp.static(ndim == 2):
            return a[idx[0], idx[1]]
        elif wp.static(ndim == 3):
            return a[idx[0], idx[1], idx[2]]
        else:
            return a[idx[0], idx[1], idx[2], idx[3]]

    def adj_read(a: arr, idx: wp.vec4i, site: int, adj_ret: dtype):
        view = grad_view(a, wp.adjoint[a])
        if has_data(view):  # the same in every thread of the launch: no lane diverges here
            if wp.static(same):
                add(view, grad_slot(a, wp.adjoint[a], idx), adj_ret, True, site)
            else:
                add(view, grad_slot(a, wp.adjoint[a], idx), flatten(adj_ret), True, site)

    read = wp.func(read, name=f"arc_read_{_tag(dtype, ndim, mode, threshold)}", module="unique")
    wp.func_grad(read)(adj_read)
    return read


@functools.cache
def add_func(dtype, ndim: int, mode: str, threshold: int):
    """``add(a: wp.array(dtype=dtype, ndim=ndim), idx: wp.vec4i, value: dtype, site: int)``:
    ``wp.atomic_add(a, idx..., value)`` through the ARC accumulator of ``mode``, with
    Warp's adjoint (``adj_value += adj_a[idx...]``) and no add when the backward kernel
    replays the forward."""
    _check(dtype, ndim)
    _, _, grad_read, data_view, data_slot, _, flatten = _native_funcs(dtype, ndim)
    add_fn = site_adder(flat_dtype(dtype), mode, threshold)
    arr = wp.array(dtype=dtype, ndim=ndim)
    same = flat_dtype(dtype) is dtype

    def add(a: arr, idx: wp.vec4i, value: dtype, site: int):
        if wp.static(same):
            add_fn(data_view(a), data_slot(a, idx), value, True, site)
        else:
            add_fn(data_view(a), data_slot(a, idx), flatten(value), True, site)

    def replay_add(a: arr, idx: wp.vec4i, value: dtype, site: int):
        pass

    def adj_add(a: arr, idx: wp.vec4i, value: dtype, site: int):
        wp.adjoint[value] += grad_read(a, wp.adjoint[a], idx)

    add = wp.func(add, name=f"arc_atomic_add_{_tag(dtype, ndim, mode, threshold)}", module="unique")
    wp.func_replay(add)(replay_add)
    wp.func_grad(add)(adj_add)
    return add
