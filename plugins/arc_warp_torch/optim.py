"""A fused Adam step in Warp for Gaussian parameters, dense or over visible rows only."""

import ctypes
import functools
import math
from typing import Optional

import numpy as np
import torch
import warp as wp

from arc_warp import RenderStatus
from arc_warp.splat import FLAG_SLOTS

from ._autograd import RenderContext, default_context

MAX_SEGMENTS = 16  # parameters one launch updates: at most Warp's max_unroll (16), so the segment
# search unrolls into constant table indices; its table is then ~1 KiB of kernel parameters
MAX_ELEMENTS = 2**31 - 1  # floats one launch updates (wp.tid() is an int32)
CPU_SPAN = 4096  # floats per thread on the CPU (one per thread on CUDA; see `_adam_kernel`)
SCALARS = 8  # per parameter: beta2, 1 - beta1, 1 - beta2, step_size, bias2_sqrt, eps, and the logs of
# the bases of the bias corrections the kernel works out from the step count on the device (capturable)


@wp.func
def _one_minus_exp(y: float):
    """1 - exp(y) for y < 0 (1 - beta^t = 1 - exp(t log beta)) to a few float32 ulps, also
    where exp(y) is near 1: Kahan's expm1, whose quotient cancels the rounding error of
    exp(y). (1 - pow(beta, t) in float32 would round beta first: 1 - 0.999 then comes out
    1.3e-5 off, an error that a training run amplifies.)"""
    u = wp.exp(y)
    if u == 1.0:
        return -y
    if u == 0.0:  # underflow (t log beta < -104): log(u) would be -inf
        return 1.0
    return (1.0 - u) * y / wp.log(u)


@wp.func
def _adam_update(
    param: wp.array(dtype=wp.float32),  # updated in place
    grad: wp.array(dtype=wp.float32),
    exp_avg: wp.array(dtype=wp.float32),  # first moment, in place
    exp_avg_sq: wp.array(dtype=wp.float32),  # second moment, in place
    j: int,  # the float to update
    beta2: float,
    one_minus_beta1: float,  # from the host in double precision, as torch rounds it
    one_minus_beta2: float,
    step_size: float,  # lr / (1 - beta1^t), or lr without bias correction
    bias2_sqrt: float,  # sqrt(1 - beta2^t), or 1
    eps: float,
):
    """One float of Adam: the moments, then the parameter (``step_size`` and ``bias2_sqrt``
    hold the bias corrections, if any)."""
    g = grad[j]
    m = exp_avg[j]
    m = m + one_minus_beta1 * (g - m)  # = beta1 m + (1 - beta1) g, rounded as torch's lerp
    v = beta2 * exp_avg_sq[j] + one_minus_beta2 * g * g
    exp_avg[j] = m
    exp_avg_sq[j] = v
    param[j] = param[j] - step_size * (m / (wp.sqrt(v) / bias2_sqrt + eps))


def _table_fields(capacity: int) -> dict:
    """The fields of the segment table of a launch over up to ``capacity`` parameters
    ("segments"), name -> Warp vector type. A Warp vector type is also a ctypes array
    type, so the kernel's struct and the host's ctypes struct (`_table_type`) are made
    of the same fields, in the same order: their layouts agree.

    - ``pointers``, uint64 [6 * capacity + 2]: segment k's parameter, gradient, exp_avg and
      exp_avg_sq (float32, contiguous, n_k floats each) at 4k .. 4k + 3; the visible mask
      (uint8 [N], read only when sparse) at 4 * capacity; segment k's step count (a float32
      on the device, read only by the capturable kernel) at 4 * capacity + 1 + k; segment
      k's learning rate on the device (its group's ``lr`` tensor, one float32; 0: the lr is
      the scalar; read only by the capturable kernel) at 5 * capacity + 1 + k; the renders'
      status flags (int32, ``skip`` on the device; 0: none) last;
    - ``ints``, int32 [3 * capacity + 3]: ``starts`` at 0 .. capacity (segment k has the
      threads starts[k] <= i < starts[k + 1]; unused segments are empty, at the end), n_k at
      capacity + 1 + k, segment k's row width M_k (floats per Gaussian) at 2 * capacity + 1 + k,
      N at 3 * capacity + 1, and the number of status flags last;
    - ``scalars``, float32 [SCALARS * capacity]: segment k's beta2, 1 - beta1, 1 - beta2,
      step_size, bias2_sqrt and eps at SCALARS * k .. SCALARS * k + 5 (see `_adam_update`);
      for the capturable kernel, step_size and bias2_sqrt without the bias corrections (lr
      and 1), whose bases' logarithms (log beta1 and log beta2, from the host in double
      precision, with bias correction; 0 without) follow at SCALARS * k + 6 and + 7: it
      multiplies step_size by the learning rate on the device (when its pointer is set;
      step_size is then 1), divides it by 1 - beta1^t and multiplies bias2_sqrt by
      sqrt(1 - beta2^t) (`_one_minus_exp`), t the step count read on the device.
    """
    return {"pointers": wp.types.vector(length=6 * capacity + 2, dtype=wp.uint64),
            "ints": wp.types.vector(length=3 * capacity + 3, dtype=wp.int32),
            "scalars": wp.types.vector(length=SCALARS * capacity, dtype=wp.float32)}


@functools.cache
def _table_type(capacity: int) -> type:
    """The host side of the segment table of ``capacity`` segments: a ctypes struct."""
    return type(f"AdamTable{capacity}", (ctypes.Structure,), {"_fields_": list(_table_fields(capacity).items())})


@functools.cache
def _adam_kernel(capacity: int, sparse: bool, span: int, capturable: bool):
    """The fused Adam update of up to ``capacity`` parameters in one launch, whose segment
    table (`_table_fields`) is its one argument, passed by value: a kernel parameter, so
    each launch carries its own values, with no host-to-device copy to order or wait for.

    One thread per block of ``span`` consecutive floats of a segment (1 on CUDA: coalesced
    loads; thousands on the CPU, whose threads run one after another: the per-thread table
    lookup is paid once per block). With ``sparse`` only rows whose ``visible`` byte is set
    are read or written (the Taming 3DGS / INRIA sparse Adam). With ``capturable`` the bias
    corrections come from each segment's step count on the device, and its learning rate
    from a tensor when its group holds one (`_table_fields`), so the launch's arguments do
    not change from step to step (a CUDA graph can replay it, a schedule included)."""
    K = capacity
    Table = wp.struct(type(f"AdamTable{capacity}", (), {"__annotations__": _table_fields(capacity)}))

    @wp.kernel(enable_backward=False, module="unique")
    def adam_step(table: Table):
        i = wp.tid()
        if table.pointers[6 * K + 1] != wp.uint64(0):  # skip the step if a render flagged anything
            flags = wp.array(ptr=table.pointers[6 * K + 1], shape=(table.ints[3 * K + 2],), dtype=wp.int32)
            for f in range(table.ints[3 * K + 2]):
                if f % wp.static(FLAG_SLOTS) != 0 and flags[f] != 0:
                    return
        for k in range(K):  # unrolled: every table index is a constant (no local-memory copy)
            if i < table.ints[k + 1]:
                n = table.ints[K + 1 + k]
                param = wp.array(ptr=table.pointers[4 * k], shape=(n,), dtype=wp.float32)
                grad = wp.array(ptr=table.pointers[4 * k + 1], shape=(n,), dtype=wp.float32)
                exp_avg = wp.array(ptr=table.pointers[4 * k + 2], shape=(n,), dtype=wp.float32)
                exp_avg_sq = wp.array(ptr=table.pointers[4 * k + 3], shape=(n,), dtype=wp.float32)
                visible = wp.array(ptr=table.pointers[4 * K], shape=(table.ints[3 * K + 1],), dtype=wp.uint8)
                step_size = table.scalars[SCALARS * k + 3]
                bias2_sqrt = table.scalars[SCALARS * k + 4]
                if wp.static(capturable):
                    if table.pointers[5 * K + 1 + k] != wp.uint64(0):  # lr on the device (step_size is 1)
                        step_size = step_size * wp.array(ptr=table.pointers[5 * K + 1 + k], shape=(1,),
                                                         dtype=wp.float32)[0]
                    t = wp.array(ptr=table.pointers[4 * K + 1 + k], shape=(1,), dtype=wp.float32)[0]
                    if table.scalars[SCALARS * k + 6] != 0.0:  # log beta1, log beta2: bias correction
                        step_size = step_size / _one_minus_exp(t * table.scalars[SCALARS * k + 6])
                        bias2_sqrt = bias2_sqrt * wp.sqrt(_one_minus_exp(t * table.scalars[SCALARS * k + 7]))
                first = (i - table.ints[k]) * span
                stop = first + span  # span 1 (CUDA): a loop of one float, which the compiler removes
                if wp.static(span > 1):
                    stop = wp.min(stop, n)
                for j in range(first, stop):
                    if wp.static(sparse):
                        if visible[j / table.ints[2 * K + 1 + k]] == wp.uint8(0):
                            continue
                    _adam_update(param, grad, exp_avg, exp_avg_sq, j, table.scalars[SCALARS * k],
                                 table.scalars[SCALARS * k + 1], table.scalars[SCALARS * k + 2],
                                 step_size, bias2_sqrt, table.scalars[SCALARS * k + 5])
                return

    return adam_step


def _capacity(count: int) -> int:
    """The kernel capacity for ``count`` segments: the next power of two (few kernel variants)."""
    return 1 << (count - 1).bit_length()


class _Launch:
    """A prepared launch of the fused kernel for the active parameters ``lo`` to ``hi`` (by
    their order in the step), on one device, with its segment table.

    ``bind`` writes what changes only with the tensors (pointers, sizes); ``run`` writes
    the per-step scalars and the mask pointer, and launches."""

    def __init__(self, context: RenderContext, capacity: int, sparse: bool, capturable: bool):
        device = wp.device_from_torch(context.device)
        self.span = 1 if device.is_cuda else CPU_SPAN
        kernel = _adam_kernel(capacity, sparse, self.span, capturable)
        self.context = context
        self.capacity = capacity
        self.table = _table_type(capacity)()
        # numpy views that write into the table
        self.pointers, self.ints, self.scalars = (np.ctypeslib.as_array(getattr(self.table, name))
                                                  for name in _table_fields(capacity))
        # prepared with a zero table, replaced by ours (same layout) at each `run`
        self.cmd = wp.launch(kernel, dim=1, inputs=[kernel.adj.args[0].type()], device=device, record_cmd=True)
        self.lo = self.hi = self.threads = 0

    def bind(self, lo: int, hi: int, segments: list, n_rows: int) -> None:
        """Segments ``lo`` to ``hi`` of ``segments``, (param, grad, exp_avg, exp_avg_sq,
        step, row width) each (step: the count's tensor, read by pointer when capturable);
        ``n_rows`` is N of a sparse step (0 when dense)."""
        self.lo, self.hi = lo, hi
        pointers, steps, starts, counts, widths = [], [], [0], [], []
        for p, g, m, v, step, width in segments[lo:hi]:
            n = p.numel()
            pointers += (p.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr())
            steps.append(step.data_ptr())
            starts.append(starts[-1] + -(-n // self.span))
            counts.append(n)
            widths.append(width)
        pad = self.capacity - (hi - lo)
        self.threads = starts[-1]
        self.pointers[:] = [*pointers, *[0] * (4 * pad), 0, *steps, *[0] * pad, *[0] * self.capacity, 0]
        self.ints[:] = [*starts, *[self.threads] * pad, *counts, *[0] * pad, *widths, *[1] * pad, n_rows, 0]
        if self.threads:
            self.cmd.set_dim(self.threads)

    def run(self, scalars: list, lrs: list, mask_ptr: int, flags: wp.array | None) -> None:
        """Launch with ``scalars`` (SCALARS per active parameter, all of the step's), the
        addresses of the learning rates on the device (one per active parameter, 0 where
        the scalar holds it), the visible mask at ``mask_ptr`` (0 when dense) and the
        status ``flags`` to skip on (None: none), on torch's current stream."""
        if not self.threads:
            return
        self.scalars[:SCALARS * (self.hi - self.lo)] = scalars[SCALARS * self.lo:SCALARS * self.hi]
        self.pointers[5 * self.capacity + 1:5 * self.capacity + 1 + self.hi - self.lo] = lrs[self.lo:self.hi]
        self.pointers[4 * self.capacity] = mask_ptr
        self.pointers[6 * self.capacity + 1] = 0 if flags is None else flags.ptr
        self.ints[3 * self.capacity + 2] = 0 if flags is None else flags.size
        self.cmd.set_param_at_index_from_ctype(0, self.table)  # read when launched: launches copy it
        with self.context.stream():
            self.cmd.launch()


class SparseGaussianAdam(torch.optim.Adam):
    """Adam whose step is one fused Warp kernel over all its parameters, optionally over
    visible Gaussians only (Taming 3DGS's sparse Adam, as INRIA's ``--optimizer_type sparse_adam``).

    A subclass of ``torch.optim.Adam`` with the same ``param_groups`` and per-parameter
    state (``step``, a float32 tensor on the CPU, or with ``capturable`` on the
    parameter's device; ``exp_avg``, ``exp_avg_sq``), so code that edits
    Adam state during densification (INRIA's ``replace_tensor_to_optimizer``,
    ``cat_tensors_to_optimizer``, ``_prune_optimizer``) works unchanged.

    Args:
        params: parameters or param groups, as for ``torch.optim.Adam``. Each parameter
            is float32 and contiguous, with the Gaussians on its first axis.
        lr, eps, betas: as for ``torch.optim.Adam`` (no weight decay or amsgrad).
        bias_correction: False (the default) is the sparse Adam of INRIA and Taming 3DGS:
            ``p -= lr * m / (sqrt(v) + eps)``, no bias correction. True divides by
            ``1 - beta^t`` as ``torch.optim.Adam`` does, ``t`` counting every call of
            ``step`` (also those where a row was invisible); dense steps are then
            ``torch.optim.Adam`` steps.
        context: the :class:`RenderContext` whose streams to use; None uses
            ``default_context`` of each parameter's device.
        capturable: True keeps each ``step`` count on the parameter's device, where the
            kernel reads it for the bias corrections, as ``torch.optim.Adam(capturable=True)``
            does: nothing in ``step`` then depends on the host, so it can be captured in a
            CUDA graph (``torch.cuda.graph`` with ``arc_warp_torch.capture_step``) and
            replayed, each replay counting one step. A group's ``lr`` may then be a
            float32 tensor of one element on its parameter's device, which the kernel
            reads at each step: a replay uses the value it holds then, so a schedule
            written into it in place (or inside the graph) needs no new capture, where a
            float lr is baked into the graph. The graph also holds the betas and eps of
            the capture, and the addresses of the tensors: capture again after changing
            any of them (densification, another lr tensor). False (default) keeps the
            counts on the host; ``step`` then raises RuntimeError if called during a
            CUDA graph capture (a replay could not count its step), and TypeError for a
            tensor lr.

    ``step(visibility, N, skip)``: ``visibility`` is a bool tensor [N] on the parameters'
    device (INRIA passes ``radii > 0``); rows with False keep their values AND their
    moments. ``visibility=None`` updates every row (dense Adam). ``skip``: the
    :class:`arc_warp.RenderStatus` of the step's render (``meta["status"]``), or a list of
    them: if one found bad inputs or overflowed its sort (an image that lacked Gaussians),
    the step changes nothing and is not counted, as torch's GradScaler skips a step with
    infinite gradients. With ``capturable`` this is decided on the device (in a CUDA graph
    too); with host counts the status is read on the host (by then the device is long
    past the render's flags). A parameter whose
    ``grad`` is None is skipped (its ``step`` is not counted). Every parameter of every
    group is updated by one kernel launch (one per device, or per ``MAX_SEGMENTS``
    parameters), on torch's current stream; no host sync. The tensors are checked, and
    their pointers and sizes written to the launch's table, only when the memory or shape
    of one changes (densification, new gradient memory); learning rates, betas and eps
    are read at every step.
    """

    def __init__(self, params, lr: float, eps: float, betas=(0.9, 0.999), bias_correction: bool = False,
                 context: Optional[RenderContext] = None, capturable: bool = False):
        # torch's capturable flag too: its load_state_dict then keeps the counts on the device
        super().__init__(params, lr=lr, eps=eps, betas=betas, capturable=bool(capturable))
        self.bias_correction = bool(bias_correction)
        self.capturable = bool(capturable)
        self._context = context
        self._key = None  # what the bound launches were built for (see `step`)
        self._bound = []  # the _Launch of each run of segments, in order
        self._launches = {}  # (device, position, capacity, sparse) -> _Launch, reused across rebuilds

    @torch.no_grad()
    def step(self, visibility: Optional[torch.Tensor] = None, N: Optional[int] = None, skip=None):
        statuses = [] if skip is None else [skip] if isinstance(skip, RenderStatus) else list(skip)
        if any(not isinstance(s, RenderStatus) for s in statuses):
            raise TypeError("SparseGaussianAdam.step: skip must be a RenderStatus (meta['status']) or a list of them")
        if len(statuses) > 1:
            raise ValueError("SparseGaussianAdam.step: skip takes one render's status; render the step's cameras in "
                             "one call")
        flags = statuses[0].flags if statuses else None
        if flags is not None and not self.capturable:
            if statuses[0].read()[:, 1:].any():
                return  # as GradScaler: no update, no count
            flags = None
        capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
        if capturing and not self.capturable:
            raise RuntimeError("SparseGaussianAdam.step is being captured in a CUDA graph, but its step counts "
                               "are on the host, where a replay would not advance them: make the optimizer "
                               "with capturable=True")
        visible = None if visibility is None else self._visible(visibility, N)
        active = []  # (param, grad, state, group) of each parameter with a gradient
        lrs = []  # the address of each one's lr tensor (0: a float lr)
        key = [None if visible is None else (visible.shape[0], visible.device)]
        for group in self.param_groups:
            for p in group["params"]:
                grad = p.grad
                if grad is None:
                    continue
                if not grad.is_contiguous():  # kept alive in `active` until launched
                    grad = grad.contiguous()
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = torch.tensor(0.0, dtype=torch.float32, device=p.device if self.capturable else None)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                elif self.capturable and (state["step"].device != p.device or state["step"].dtype != torch.float32):
                    self._move_step(state, p.device, capturing)
                active.append((p, grad, state, group))
                lrs.append(self._lr_address(group["lr"], p) if isinstance(group["lr"], torch.Tensor) else 0)
                m, v = state["exp_avg"], state["exp_avg_sq"]
                key.append((p.data_ptr(), grad.data_ptr(), m.data_ptr(), v.data_ptr(), state["step"].data_ptr(),
                            p.shape, m.shape, v.shape))
        if not active:
            return
        key = tuple(key)
        if key != self._key:  # new memory or shapes: check the tensors, rewrite the tables
            self._key = None
            self._bound = self._bind(active, visible)
            self._key = key
        steps = [state["step"] for _, _, state, _ in active]
        # on the host, as torch.optim.Adam keeps them (no device sync), or on the device (capturable)
        if flags is None:
            torch._foreach_add_(steps, 1.0)
        else:  # counted where no render flagged anything (decided on the device)
            kept = (wp.to_torch(flags)[:, 1:] == 0).all().to(torch.float32)
            torch._foreach_add_(steps, [kept.to(s.device) for s in steps])
        scalars = []
        for (_, _, _, group), step, lr in zip(active, steps, lrs):
            beta1, beta2 = group["betas"]
            # a tensor lr: the kernel multiplies a step_size of 1 by it
            step_size, bias2_sqrt, logs = 1.0 if lr else group["lr"], 1.0, (0.0, 0.0)
            if self.bias_correction and self.capturable:
                logs = (math.log(beta1), math.log(beta2))  # the kernel divides by 1 - beta^t, t read on the device
            elif self.bias_correction:
                t = float(step)
                step_size = group["lr"] / (1.0 - beta1 ** t)
                bias2_sqrt = (1.0 - beta2 ** t) ** 0.5
            scalars += (beta2, 1.0 - beta1, 1.0 - beta2, step_size, bias2_sqrt, group["eps"], *logs)
        mask_ptr = 0 if visible is None else visible.data_ptr()
        for launch in self._bound:
            launch.run(scalars, lrs, mask_ptr, flags)

    def _lr_address(self, lr: torch.Tensor, param: torch.Tensor) -> int:
        """The address of a group's learning rate tensor, checked (TypeError/ValueError)."""
        if not self.capturable:
            raise TypeError("SparseGaussianAdam: a group's lr is a tensor, which only the capturable kernel reads "
                            "(on the device); make the optimizer with capturable=True, or give a float lr")
        if lr.dtype != torch.float32 or lr.numel() != 1 or lr.device != param.device:
            raise ValueError(f"SparseGaussianAdam: a tensor lr must be one float32 on its parameter's device "
                             f"({param.device}), got {lr.dtype} {list(lr.shape)} on {lr.device}")
        return lr.data_ptr()

    @staticmethod
    def _move_step(state: dict, device: torch.device, capturing: bool) -> None:
        """A step count loaded from elsewhere (a checkpoint of a host-count optimizer) moved
        to ``device`` as a float32, which the capturable kernel reads; RuntimeError while capturing, where the
        copy could not be replayed."""
        if capturing:
            raise RuntimeError("SparseGaussianAdam(capturable=True): a step count is on "
                               f"{state['step'].device}, not its parameter's device {device}; run one step "
                               "outside the CUDA graph capture first (it moves the counts)")
        state["step"] = state["step"].to(device=device, dtype=torch.float32)

    @staticmethod
    def _visible(visibility, N) -> torch.Tensor:
        """The checked mask [N], bool and contiguous (the kernel reads a byte per row)."""
        if not isinstance(visibility, torch.Tensor) or visibility.dim() != 1:
            raise ValueError("SparseGaussianAdam.step: visibility must be a 1D bool tensor [N], got "
                             f"{getattr(visibility, 'shape', type(visibility).__name__)}")
        n = visibility.shape[0] if N is None else int(N)
        if visibility.shape[0] != n:
            raise ValueError(f"SparseGaussianAdam.step: visibility has {visibility.shape[0]} rows, N={n}")
        if visibility.dtype is not torch.bool or not visibility.is_contiguous():
            visibility = visibility.to(torch.bool).contiguous()
        return visibility

    def _bind(self, active: list, visible: Optional[torch.Tensor]) -> list:
        """Checks the active parameters, their gradients and moments, and binds them to
        launches: runs of consecutive parameters on one device, at most ``MAX_SEGMENTS``
        parameters and ``MAX_ELEMENTS`` floats each."""
        segments, devices = [], []
        for p, grad, state, _ in active:
            self._check(p, grad, state, visible)
            width = p.numel() // p.shape[0] if p.dim() and p.shape[0] else 1
            segments.append((p, grad, state["exp_avg"], state["exp_avg_sq"], state["step"], width))
            devices.append(p.device)
        bound, lo = [], 0
        while lo < len(segments):
            hi, total = lo, 0
            while (hi < len(segments) and hi - lo < MAX_SEGMENTS and devices[hi] == devices[lo]
                   and (hi == lo or total + segments[hi][0].numel() <= MAX_ELEMENTS)):
                total += segments[hi][0].numel()
                hi += 1
            capacity = _capacity(hi - lo)
            slot = (devices[lo], len(bound), capacity, visible is not None)
            launch = self._launches.get(slot)
            if launch is None:
                launch = self._launches[slot] = _Launch(self._context_of(devices[lo]), capacity,
                                                        visible is not None, self.capturable)
            launch.bind(lo, hi, segments, 0 if visible is None else visible.shape[0])
            bound.append(launch)
            lo = hi
        return bound

    def _context_of(self, device: torch.device) -> RenderContext:
        if self._context is None:
            return default_context(device)
        if self._context.device != device:
            raise ValueError(f"SparseGaussianAdam: a parameter is on {device}, the optimizer's context on "
                             f"{self._context.device}")
        return self._context

    @staticmethod
    def _check(param, grad, state, visible) -> None:
        """Raises unless the kernel can update ``param`` from these tensors."""
        if param.dtype != torch.float32 or not param.is_contiguous():
            raise TypeError(f"SparseGaussianAdam: parameters must be float32 and contiguous, got "
                            f"{param.dtype} {list(param.shape)}")
        for name, t in (("grad", grad), ("exp_avg", state["exp_avg"]), ("exp_avg_sq", state["exp_avg_sq"])):
            if (t.dtype != torch.float32 or not t.is_contiguous() or t.shape != param.shape
                    or t.device != param.device):
                raise ValueError(f"SparseGaussianAdam: the {name} of a parameter {list(param.shape)} on "
                                 f"{param.device} is {t.dtype} {list(t.shape)} on {t.device}"
                                 f"{'' if t.is_contiguous() else ', not contiguous'}; it must be float32, "
                                 "contiguous and shaped like the parameter, on its device (edit the "
                                 "optimizer state together with the parameter)")
        if visible is not None and (param.dim() == 0 or param.shape[0] != visible.shape[0]
                                    or visible.device != param.device):
            raise ValueError(f"SparseGaussianAdam.step: visibility [{visible.shape[0]}] on "
                             f"{visible.device} does not match a parameter {list(param.shape)} on "
                             f"{param.device}")
