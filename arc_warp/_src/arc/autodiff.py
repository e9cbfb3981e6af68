"""ARC inside Warp's generated backward: :func:`arc_adjoint` rewrites an ordinary kernel.

Warp's generated adjoint of an array read ``a[i]`` is ``adj_address``, one atomic add per
thread into ``a``'s gradient (``warp/native/array.h``); Warp reduces nothing in the warp
there. :func:`arc_adjoint` takes the user's kernel (a ``wp.Kernel`` or its Python
function), rewrites its syntax tree and builds a new ``wp.Kernel`` from it, in a module of
its own, with nothing of Warp forked or patched:

- a read ``a[i, j]`` of a float32 array argument (scalars, vectors, matrices,
  quaternions, transforms; one to four dimensions, every index given) becomes a call of a
  ``@wp.func`` that returns ``a[i, j]`` and whose custom adjoint (``wp.func_grad``) adds
  into the gradient through the ARC accumulator;
- ``wp.atomic_add(a, i, j, v)`` / ``wp.atomic_sub`` as a statement, and ``a[i, j] += v`` /
  ``-= v``, become an ARC add in the forward. Their adjoint stays Warp's: a gather
  ``adj_v += adj_a[i, j]`` with no atomic, so there is nothing to reduce there.

Left to Warp's own code (plain atomics): reads of arrays that are not kernel arguments
(struct fields, locals, views made in the kernel), partial indexing (``a[i]`` of a 2-D
array) and slices, reads inside ``@wp.func`` s the kernel calls, other dtypes (float16,
float64, integers), atomics whose old value is used, and the other atomics (min, max,
...). :func:`adjoint_sites` lists what was rewritten and what was left, with the reason.

Mode ``deterministic`` rewrites nothing: it builds the kernel with Warp's own
deterministic execution (module option ``deterministic=wp.DeterministicMode.RUN_TO_RUN``),
which on CUDA records every atomic of the forward and of the generated adjoint and sums
each target's records in a fixed order (sort by target and thread), so the gradients
are the same bits from run to run on one GPU architecture. On the CPU Warp runs a
launch's threads in a fixed order, which is deterministic already, with or without
``enable_cpu_blocks``.
"""

import ast
import dataclasses
import functools
import inspect
import itertools
import linecache
import textwrap
import weakref

import warp as wp

from .autodiff_funcs import add_func, flat_dtype, read_func
from .calibrate import kernel_mode, resolve_threshold
from .reduce_funcs import MODES

ADJOINT_MODES = tuple(m for m in MODES if m != "serial")
"""Modes of :func:`arc_adjoint`: ``atomic``, ``warp``, ``arc``, ``floor`` (benchmarks
only: covered adds add nothing) and ``deterministic``."""


@dataclasses.dataclass(frozen=True)
class AdjointSite:
    """One array access of a kernel given to :func:`arc_adjoint`.

    kind: ``"read"`` (``a[i]``: its adjoint accumulates into ``a``'s gradient) or
    ``"atomic_add"`` (``wp.atomic_add`` / ``atomic_sub`` / ``+=`` / ``-=``); array: the
    argument's name; line: line in the kernel's source file; arc: True where ARC does the
    adds, False where they stay Warp's; reason: why not. Arrays without gradients
    (integers, booleans) are not listed.
    """

    kind: str
    array: str
    line: int
    arc: bool
    reason: str = ""


_sites: "weakref.WeakKeyDictionary[wp.Kernel, tuple[AdjointSite, ...]]" = weakref.WeakKeyDictionary()
_counter = itertools.count()
_KERNEL_OPTIONS = ("launch_bounds", "cuda_max_registers", "enable_cuda_smem_spilling", "cluster_dim", "grid_stride")
"""Options of the user's ``@wp.kernel(...)`` that the rewritten kernel keeps."""


def adjoint_sites(kernel: wp.Kernel) -> tuple[AdjointSite, ...]:
    """The array accesses :func:`arc_adjoint` found in ``kernel``, in source order."""
    if kernel not in _sites:
        raise ValueError(f"{getattr(kernel, 'key', kernel)!r} was not built by arc_warp.arc_adjoint")
    return _sites[kernel]


def _closure_vars(fn) -> dict:
    names = fn.__code__.co_freevars
    return {n: c.cell_contents for n, c in zip(names, fn.__closure__ or ()) if _cell_set(c)}


def _cell_set(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _resolve(fn, node):
    """The Python object a Name / Attribute chain names in ``fn``'s scope, or None."""
    if isinstance(node, ast.Name):
        scope = _closure_vars(fn)
        return scope[node.id] if node.id in scope else fn.__globals__.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _resolve(fn, node.value)
        return getattr(base, node.attr, None) if base is not None else None
    return None


def _has_gradient(dtype) -> bool:
    scalar = getattr(dtype, "_wp_scalar_type_", dtype)
    return scalar in (float, wp.float16, wp.float32, wp.float64)


def _indices(node: ast.Subscript) -> list[ast.expr]:
    return list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]


class _Rewriter(ast.NodeTransformer):
    """Rewrites the accesses of the module notes, in place; collects the helpers the new
    source names (``_arc_index``, ``_arc_int``, ``_arc_fn<n>``) and the sites."""

    def __init__(self, fn, arrays: dict, mode: str, threshold: int):
        self.fn = fn
        self.first_line = fn.__code__.co_firstlineno  # inspect.getsource starts there too
        self.arrays = arrays  # argument name -> (dtype, ndim)
        self.mode = mode
        self.threshold = threshold
        self.helpers: dict[str, object] = {"_arc_index": wp.vec4i, "_arc_int": wp.int32}
        self.sites: list[AdjointSite] = []
        self.store_targets: set[int] = set()
        self.tid_names: frozenset = frozenset()  # names bound once to wp.tid()

    # -- bookkeeping

    def _helper(self, func) -> str:
        for name, value in self.helpers.items():
            if value is func:
                return name
        name = f"_arc_fn{len(self.helpers)}"
        self.helpers[name] = func
        return name

    def _site(self, kind, array, node, reason="") -> int:
        if _has_gradient(self.arrays[array][0]):
            self.sites.append(AdjointSite(kind, array, self.first_line + node.lineno - 1, not reason, reason))
        return len(self.sites)

    def _index_vec(self, indices) -> ast.Call:
        args = [ast.Call(ast.Name("_arc_int", ast.Load()), [i], []) for i in indices]
        args += [ast.Constant(0)] * (4 - len(indices))
        return ast.Call(ast.Name("_arc_index", ast.Load()), args, [])

    def _target(self, node) -> tuple[str | None, str]:
        """(argument name, '') if ``node`` is a subscript ARC covers, (name, reason) if it
        is left to Warp, (None, '') if it is no subscript of an array argument."""
        if not isinstance(node, ast.Subscript) or not isinstance(node.value, ast.Name):
            return None, ""
        name = node.value.id
        if name not in self.arrays:
            return None, ""
        return name, self._reason(name, _indices(node))

    def _reason(self, name: str, indices: list) -> str:
        """Why the access ``name[indices]`` stays Warp's, or '' if ARC covers it."""
        dtype, ndim = self.arrays[name]
        if any(isinstance(i, ast.Slice) for i in indices) or len(indices) != ndim:
            return f"{len(indices)} of {ndim} indices (a view): Warp's"
        if flat_dtype(dtype) is None:
            return f"dtype {getattr(dtype, '__name__', dtype)}: Warp's"
        ids = [i.id for i in indices if isinstance(i, ast.Name)]
        if self.tid_names and len(ids) == len(indices) == len(self.tid_names) and set(ids) == self.tid_names:
            return "the thread's own element (no two lanes share it): Warp's"
        return ""

    def scan(self, fdef):
        """Notes the store targets (their subscripts are not reads) and the names bound, once
        and only once, to ``wp.tid()``: an element indexed by all of them is one thread's."""
        assigned: dict[str, int] = {}
        tid = []
        for node in ast.walk(fdef):
            targets = []
            if isinstance(node, ast.Assign):
                targets = node.targets
                call = node.value.func if isinstance(node.value, ast.Call) else None
                if isinstance(call, ast.Attribute) and call.attr == "tid" and _resolve(self.fn, call.value) is wp:
                    tid = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.NamedExpr)):
                targets = [node.target]
            for t in targets:
                for sub in ast.walk(t):
                    if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                        assigned[sub.id] = assigned.get(sub.id, 0) + 1
                    if isinstance(sub, (ast.Subscript, ast.Attribute)):
                        self.store_targets.add(id(sub))
                        self.store_targets.add(id(sub.value))
        if tid and len(set(tid)) == len(tid) and all(assigned.get(n) == 1 for n in tid):
            self.tid_names = frozenset(tid)

    def _add_call(self, array, indices, value, node, negate=False) -> ast.Expr:
        dtype, ndim = self.arrays[array]
        site = self._site("atomic_add", array, node)
        if negate:
            value = ast.UnaryOp(ast.USub(), value)
        fn = self._helper(add_func(dtype, ndim, self.mode, self.threshold))
        call = ast.Call(ast.Name(fn, ast.Load()),
                        [ast.Name(array, ast.Load()), self._index_vec(indices), value, ast.Constant(site)], [])
        return ast.copy_location(ast.Expr(call), node)

    # -- visitors

    def visit_Call(self, node):
        func = _resolve(self.fn, node.func)
        if func is wp.static:
            return node  # evaluated in Python at build time
        first = node.args[0] if node.args else None
        if func in (wp.atomic_add, wp.atomic_sub) and isinstance(first, ast.Name) and first.id in self.arrays:
            self._site("atomic_add", first.id, node, "old value used: Warp's")  # statements go to visit_Expr
        return self.generic_visit(node)

    def visit_Expr(self, node):
        call = node.value
        atomic = _resolve(self.fn, call.func) if isinstance(call, ast.Call) else None
        first = call.args[0] if atomic in (wp.atomic_add, wp.atomic_sub) and call.args else None
        if not (isinstance(first, ast.Name) and first.id in self.arrays):
            return self.generic_visit(node)
        reason = "keyword arguments: Warp's" if call.keywords else self._reason(first.id, call.args[1:-1])
        args = [self.visit(a) for a in call.args]
        if not reason:
            return self._add_call(first.id, args[1:-1], args[-1], node, negate=atomic is wp.atomic_sub)
        self._site("atomic_add", first.id, node, reason)
        call.args = args
        call.keywords = [self.visit(k) for k in call.keywords]
        return node

    def visit_AugAssign(self, node):
        name, reason = self._target(node.target)
        if name is not None and isinstance(node.op, (ast.Add, ast.Sub)):
            if not reason:
                indices = [self.visit(i) for i in _indices(node.target)]
                return self._add_call(name, indices, self.visit(node.value), node, negate=isinstance(node.op, ast.Sub))
            self._site("atomic_add", name, node, reason)
        return self.generic_visit(node)

    def visit_Subscript(self, node):
        if id(node) in self.store_targets or not isinstance(node.ctx, ast.Load):
            return self.generic_visit(node)
        name, reason = self._target(node)
        if name is None:
            return self.generic_visit(node)
        if reason:
            self._site("read", name, node, reason)
            return self.generic_visit(node)
        dtype, ndim = self.arrays[name]
        indices = [self.visit(i) for i in _indices(node)]
        site = self._site("read", name, node)
        fn = self._helper(read_func(dtype, ndim, self.mode, self.threshold))
        call = ast.Call(ast.Name(fn, ast.Load()), [node.value, self._index_vec(indices), ast.Constant(site)], [])
        return ast.copy_location(call, node)


def _array_args(fn) -> dict:
    """Array arguments of ``fn`` whose annotation is a concrete ``wp.array``: name -> (dtype, ndim)."""
    annotations = inspect.get_annotations(fn, eval_str=True, locals=_closure_vars(fn))
    arrays = {}
    for name, ann in annotations.items():
        if isinstance(ann, wp.array):
            arrays[name] = (ann.dtype, ann.ndim)
    return arrays


def _transform(fn, mode: str, threshold: int):
    """(new function, sites): ``fn`` rewritten, compiled from source registered with
    ``linecache`` (Warp reads a kernel's source through ``inspect``), with the helpers and
    ``fn``'s closure variables as the closure of the new function."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    fdef = tree.body[0]
    if not isinstance(fdef, ast.FunctionDef):
        raise TypeError(f"arc_adjoint needs a kernel defined with def; got {type(fdef).__name__}")
    fdef.decorator_list = []
    clash = sorted({n.id for n in ast.walk(fdef) if isinstance(n, ast.Name) and n.id.startswith("_arc_")})
    if clash:
        raise ValueError(f"{fn.__name__} uses the names {clash}, which arc_adjoint keeps for its own helpers; "
                         "rename them")
    rewriter = _Rewriter(fn, _array_args(fn), mode, threshold)
    if mode != "deterministic":
        rewriter.scan(fdef)
        fdef.body = [rewriter.visit(stmt) for stmt in fdef.body]
    ast.fix_missing_locations(fdef)

    free = _closure_vars(fn)
    params = list(rewriter.helpers) + list(free)
    source = (f"def _arc_factory({', '.join(params)}):\n"
              + textwrap.indent(ast.unparse(fdef), "    ")
              + f"\n    return {fdef.name}\n")
    filename = f"<arc_warp.arc_adjoint {fn.__module__}.{fn.__qualname__} {mode} #{next(_counter)}>"
    # mtime None: linecache.checkcache keeps the entry (there is no file to compare with)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    scope: dict = {}
    exec(compile(source, filename, "exec"), fn.__globals__, scope)  # noqa: S102 (our own rewrite of fn)
    new_fn = scope["_arc_factory"](*rewriter.helpers.values(), *free.values())
    new_fn.__module__ = fn.__module__
    return new_fn, tuple(rewriter.sites)


def arc_adjoint(kernel=None, *, mode: str = "arc", threshold: int | None = None, device=None):
    """ARC in the ``wp.Tape`` backward of an ordinary Warp kernel, its source unchanged.

    Use it as a wrapper call or as a decorator::

        p2g_arc = arc_warp.arc_adjoint(p2g)            # p2g: a @wp.kernel, left as it is

        @arc_warp.arc_adjoint(mode="arc")             # on top of (or instead of) @wp.kernel
        @wp.kernel
        def splat(...): ...

    then launch and record the returned kernel as any other (``wp.launch`` under a
    ``wp.Tape``). Reads ``a[i, ...]`` of float32 array arguments get adjoints that
    accumulate with ARC; statement ``wp.atomic_add`` / ``+=`` into them add with ARC in the
    forward. What is covered and what is left to Warp: see :mod:`arc_warp._src.arc.autodiff`
    and :func:`adjoint_sites`.

    Args:
        kernel: a ``wp.Kernel`` (its function and options are reused) or a plain Python
            function with Warp annotations; ``None`` returns a decorator.
        mode: ``"atomic"`` (one atomic per lane, Warp's own order), ``"warp"`` (always
            reduce in the warp), ``"arc"`` (adaptive, threshold T), ``"deterministic"``
            (Warp's deterministic execution, nothing rewritten; with Warp's limits: a
            float ``wp.atomic_add`` whose old value is used raises
            ``WarpDeterminismError`` when the kernel is built) or ``"floor"``
            (benchmarks only: the rewritten adds add nothing).
        threshold: ARC threshold T for ``arc``, baked into the kernel; ``None`` takes
            :func:`arc_warp.resolve_threshold` for ``device`` now (a GPU's first call
            calibrates it, about a second, then it is cached on disk).
        device: the device whose threshold ``None`` resolves (default: Warp's default device).

    Returns:
        A new ``wp.Kernel`` with the original's arguments, in a module of its own; cached
        per (kernel, mode, threshold).

    Block widths: on CUDA the warps reduce at any ``block_dim``; on the CPU they reduce
    only with ``wp.config.enable_cpu_blocks`` and a ``block_dim`` that is a multiple of
    32 (32-lane warp emulation); otherwise each thread adds alone. CPU launches of such
    kernels from several Python threads at once must be serialised (the emulation keeps
    state in C statics).
    """
    if mode not in ADJOINT_MODES:
        raise ValueError(f"mode must be one of {ADJOINT_MODES}; got {mode!r}")
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, int)):
        raise TypeError(f"threshold must be an int or None; got {threshold!r}")
    if mode == "arc":
        threshold = resolve_threshold(device, threshold)
    else:
        threshold = 0  # unused: one compiled variant per mode
    if kernel is None:
        return lambda k: _build(k, kernel_mode(mode, threshold), threshold)
    return _build(kernel, kernel_mode(mode, threshold), threshold)


@functools.cache
def _build(kernel, mode: str, threshold: int) -> wp.Kernel:
    if isinstance(kernel, wp.Kernel):
        fn, options, module = kernel.func, dict(kernel.options), kernel.module
    elif callable(kernel) and hasattr(kernel, "__code__"):
        fn, options, module = kernel, {}, wp.get_module(kernel.__module__)
    else:
        raise TypeError(f"arc_adjoint takes a wp.Kernel or a Python function; got {type(kernel).__name__}")
    module_options = dict(module.options)  # fast_math, max_unroll, mode, ... as the user's module has them
    if options.get("enable_backward") is False or module_options.get("enable_backward") is False:
        raise ValueError(f"{fn.__name__} is built with enable_backward=False: it has no generated adjoint to "
                         "put ARC into; drop enable_backward=False")
    new_fn, sites = _transform(fn, mode, threshold)
    if mode == "deterministic":
        module_options["deterministic"] = wp.DeterministicMode.RUN_TO_RUN
    module_options["enable_backward"] = True
    out = wp.kernel(
        new_fn,
        name=f"{fn.__name__}_arc_{mode}",
        **{k: options[k] for k in _KERNEL_OPTIONS if k in options},
        module="unique",
        module_options=module_options,
    )
    _sites[out] = sites
    return out

