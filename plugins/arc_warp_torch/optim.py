"""A fused Adam step in Warp for Gaussian parameters, dense or over visible rows only."""

import functools
from typing import Optional

import torch
import warp as wp

from ._autograd import RenderContext, default_context


@functools.cache
def _adam_kernel(sparse: bool):
    """One fused Adam update per float of a parameter; with ``sparse`` only rows whose
    ``visible`` byte is set are read or written (the Taming 3DGS / INRIA sparse Adam)."""

    @wp.kernel(enable_backward=False, module="unique")
    def adam_step(
        param: wp.array(dtype=wp.float32),  # (N * M,) updated in place
        grad: wp.array(dtype=wp.float32),  # (N * M,)
        exp_avg: wp.array(dtype=wp.float32),  # (N * M,) first moment, in place
        exp_avg_sq: wp.array(dtype=wp.float32),  # (N * M,) second moment, in place
        visible: wp.array(dtype=wp.uint8),  # (N,) row mask (read only when sparse)
        row_width: int,  # M
        beta2: float,
        one_minus_beta1: float,  # from the host in double precision, as torch rounds it
        one_minus_beta2: float,
        step_size: float,  # lr / (1 - beta1^t), or lr without bias correction
        bias2_sqrt: float,  # sqrt(1 - beta2^t), or 1
        eps: float,
    ):
        i = wp.tid()
        if wp.static(sparse):
            if visible[i / row_width] == wp.uint8(0):
                return
        g = grad[i]
        m = exp_avg[i]
        m = m + one_minus_beta1 * (g - m)  # = beta1 m + (1 - beta1) g, rounded as torch's lerp
        v = beta2 * exp_avg_sq[i] + one_minus_beta2 * g * g
        exp_avg[i] = m
        exp_avg_sq[i] = v
        param[i] = param[i] - step_size * (m / (wp.sqrt(v) / bias2_sqrt + eps))

    return adam_step


class SparseGaussianAdam(torch.optim.Adam):
    """Adam whose step is one fused Warp kernel per parameter, optionally over visible
    Gaussians only (Taming 3DGS's sparse Adam, as INRIA's ``--optimizer_type sparse_adam``).

    A subclass of ``torch.optim.Adam`` with the same ``param_groups`` and per-parameter
    state (``step``, ``exp_avg``, ``exp_avg_sq``), so code that edits Adam state during
    densification (INRIA's ``replace_tensor_to_optimizer``, ``cat_tensors_to_optimizer``,
    ``_prune_optimizer``) works unchanged.

    Args:
        params: parameters or param groups, as for ``torch.optim.Adam``. Each parameter
            is float32 and contiguous, with the Gaussians on its first axis.
        lr, eps, betas: as for ``torch.optim.Adam`` (no weight decay or amsgrad).
        bias_correction: False (the default) is the sparse Adam of INRIA and Taming 3DGS:
            ``p -= lr * m / (sqrt(v) + eps)``, no bias correction. True divides by
            ``1 - beta^t`` as ``torch.optim.Adam`` does, ``t`` counting every call of
            ``step`` (also those where a row was invisible); dense steps are then
            ``torch.optim.Adam`` steps.
        context: the :class:`RenderContext` whose tensor views and streams to use;
            None uses ``default_context`` of each parameter's device.

    ``step(visibility, N)``: ``visibility`` is a bool tensor [N] on the parameters'
    device (INRIA passes ``radii > 0``); rows with False keep their values AND their
    moments. ``visibility=None`` updates every row (dense Adam). A parameter whose
    ``grad`` is None is skipped. The kernel runs on torch's current stream; no host sync.
    """

    def __init__(self, params, lr: float, eps: float, betas=(0.9, 0.999), bias_correction: bool = False,
                 context: Optional[RenderContext] = None):
        super().__init__(params, lr=lr, eps=eps, betas=betas)
        self.bias_correction = bool(bias_correction)
        self._context = context
        self._frames = {}  # device -> workspace Frame holding this optimizer's prepared launches

    @torch.no_grad()
    def step(self, visibility: Optional[torch.Tensor] = None, N: Optional[int] = None):
        if visibility is not None:
            if not isinstance(visibility, torch.Tensor) or visibility.dim() != 1:
                raise ValueError("SparseGaussianAdam.step: visibility must be a 1D bool tensor [N], got "
                                 f"{getattr(visibility, 'shape', type(visibility).__name__)}")
            n = visibility.shape[0] if N is None else int(N)
            if visibility.shape[0] != n:
                raise ValueError(f"SparseGaussianAdam.step: visibility has {visibility.shape[0]} rows, N={n}")
            visible = visibility.to(torch.bool).contiguous().view(torch.uint8)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for j, param in enumerate(group["params"]):
                if param.grad is None:
                    continue
                self._check(param, None if visibility is None else visible)
                state = self.state[param]
                if len(state) == 0:
                    state["step"] = torch.tensor(0.0, dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                state["step"] += 1  # a CPU tensor, as torch.optim.Adam keeps it: no device sync
                step_size, bias2_sqrt = group["lr"], 1.0
                if self.bias_correction:
                    t = float(state["step"])
                    step_size = group["lr"] / (1.0 - beta1 ** t)
                    bias2_sqrt = (1.0 - beta2 ** t) ** 0.5
                self._launch((id(group), j), param, state, None if visibility is None else visible,
                             beta1, beta2, step_size, bias2_sqrt, group["eps"])

    @staticmethod
    def _check(param, visible):
        if param.dtype != torch.float32 or not param.is_contiguous():
            raise TypeError(f"SparseGaussianAdam: parameters must be float32 and contiguous, got "
                            f"{param.dtype} {list(param.shape)}")
        if visible is not None and (param.dim() == 0 or param.shape[0] != visible.shape[0]
                                    or visible.device != param.device):
            raise ValueError(f"SparseGaussianAdam.step: visibility [{visible.shape[0]}] on "
                             f"{visible.device} does not match a parameter {list(param.shape)} on "
                             f"{param.device}")

    def _launch(self, slot, param, state, visible, beta1, beta2, step_size, bias2_sqrt, eps):
        context = self._context or default_context(param.device)
        frame = self._frames.get(param.device)
        if frame is None:  # kept for the optimizer's lifetime: never returned to the pool
            frame = self._frames[param.device] = context.workspace.acquire()
        n = param.numel()
        if n == 0:
            return
        grad = param.grad if param.grad.is_contiguous() else param.grad.contiguous()
        flat = [context.view(t.view(-1), wp.float32) for t in (param, grad, state["exp_avg"], state["exp_avg_sq"])]
        # dense steps never read the mask: any one-byte view stands in
        mask = context.view(param.view(-1).view(torch.uint8)[:1] if visible is None else visible, wp.uint8)
        kernel = _adam_kernel(visible is not None)
        args = [*flat, mask, n // param.shape[0] if param.dim() else 1, beta2, 1.0 - beta1, 1.0 - beta2,
                step_size, bias2_sqrt, eps]
        with context.stream():
            frame.launch(kernel, n, args, key=(slot, kernel))
