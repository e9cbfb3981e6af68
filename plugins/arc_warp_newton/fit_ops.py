"""Image loss and a small Adam optimiser for fitting simulation parameters.

Both are meant for a handful of parameters (initial velocity, gravity): the loss is
recorded on the active ``wp.Tape``; :class:`Adam` updates parameters on the host
(a few floats copied per step), which keeps it device-agnostic.
"""

from __future__ import annotations

import math

import numpy as np
import warp as wp

from .fit_kernels import image_sq_error_kernel


def image_mse(images, targets, loss: wp.array | None = None) -> wp.array:
    """Mean squared RGB error over all pixels of all image pairs.

    images, targets: equal-length sequences of (H, W) wp.array2d(wp.vec3) on one device
    (every pair the same shape). ``loss``: (1,) float array to add into (zeroed by the
    caller), or None to allocate one with ``requires_grad=True``. Returns ``loss``, the
    mean of the squared differences over images, pixels and the 3 channels.
    """
    images, targets = list(images), list(targets)
    if not images or len(images) != len(targets):
        raise ValueError(f"need equal, non-zero numbers of images and targets, got {len(images)} and {len(targets)}")
    device = images[0].device
    for k, (img, tgt) in enumerate(zip(images, targets)):
        for name, arr in (("images", img), ("targets", tgt)):
            if not isinstance(arr, wp.array) or arr.ndim != 2 or arr.dtype != wp.vec3:
                raise TypeError(f"{name}[{k}] must be a (H, W) wp.array2d of wp.vec3")
            if arr.device != device:
                raise ValueError(f"{name}[{k}] is on {arr.device}, expected {device}")
        if img.shape != tgt.shape:
            raise ValueError(f"images[{k}] has shape {img.shape}, targets[{k}] {tgt.shape}")
    if loss is None:
        loss = wp.zeros(1, dtype=float, device=device, requires_grad=True)
    for img, tgt in zip(images, targets):
        weight = 1.0 / (3.0 * img.shape[0] * img.shape[1] * len(images))
        wp.launch(image_sq_error_kernel, dim=img.shape, inputs=[img, tgt, weight], outputs=[loss], device=device)
    return loss


class Adam:
    """Adam (Kingma & Ba) on a few small wp arrays, stepped on the host.

    params: wp arrays with ``requires_grad`` (their ``.grad`` is read by :meth:`step`).
    lr: one step size per parameter (or one for all), in the parameter's units: Adam's
    step is about ``lr`` per element, whatever the gradient's scale.
    """

    def __init__(self, params, lr, betas=(0.9, 0.999), eps: float = 1e-8):
        self.params = list(params)
        if not self.params:
            raise ValueError("Adam needs at least one parameter")
        for i, p in enumerate(self.params):
            if not isinstance(p, wp.array) or not p.requires_grad:
                raise TypeError(f"params[{i}] must be a wp.array with requires_grad=True")
        lrs = [lr] * len(self.params) if np.isscalar(lr) else list(lr)
        if len(lrs) != len(self.params) or not all(math.isfinite(v) and v > 0 for v in lrs):
            raise ValueError(f"lr must be one positive float or one per parameter, got {lr!r}")
        self.lr = lrs
        self.betas, self.eps, self.t = betas, eps, 0
        self._m = [np.zeros(p.numpy().shape, np.float64) for p in self.params]
        self._v = [np.zeros(p.numpy().shape, np.float64) for p in self.params]

    def step(self, grads=None, lr_scale: float = 1.0) -> None:
        """One update. ``grads``: one array-like per parameter, shaped like it; None
        reads the parameters' current ``.grad`` (not zeroed here)."""
        if grads is None:
            grads = [p.grad.numpy() for p in self.params]
        if len(grads) != len(self.params):
            raise ValueError(f"need {len(self.params)} gradients, got {len(grads)}")
        b1, b2 = self.betas
        self.t += 1
        for p, lr, m, v, g in zip(self.params, self.lr, self._m, self._v, grads):
            g = np.asarray(g, dtype=np.float64)
            if g.shape != m.shape:
                raise ValueError(f"gradient shape {g.shape} does not match parameter shape {m.shape}")
            m *= b1
            m += (1 - b1) * g
            v *= b2
            v += (1 - b2) * g * g
            m_hat = m / (1 - b1**self.t)
            v_hat = v / (1 - b2**self.t)
            p.assign((p.numpy() - lr * lr_scale * m_hat / (np.sqrt(v_hat) + self.eps)).astype(np.float32))
