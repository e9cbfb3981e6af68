"""Adaptive density control of 3DGS: clone, split, prune and opacity reset.

Driven by the running mean of the screen-space mean gradient norm of each Gaussian
(in NDC units, i.e. pixel gradient times W/2 and H/2, as INRIA and gsplat measure it),
over the views where it was visible. Parameter rows and their Adam moments are edited
together, in place of the optimizer's state (the optimizer of `model.make_optimizer`: one
param group per parameter, named; INRIA's `cat_tensors_to_optimizer` and `_prune_optimizer`);
new rows start with zero moments.
"""

import math
from dataclasses import dataclass

import torch
from torch.optim import Optimizer


@dataclass
class DensifyConfig:
    """Densification schedule and thresholds (gsplat's defaults for 30k steps).

    grow_grad2d: mean NDC gradient norm above which a Gaussian is cloned or split.
    grow_scale3d: largest std-dev (x scene_scale) up to which it is cloned, above split.
    prune_opa: opacity below which it is removed.
    prune_scale3d: largest std-dev (x scene_scale) above which it is removed, checked
        once an opacity reset has happened.
    refine_start / refine_stop / refine_every: refine on steps in (start, stop) that are
        multiples of refine_every. reset_every: opacity reset period (0 = never).
    absgrad: use the per-pixel absolute gradient sum (AbsGS) instead of the gradient.
    max_gaussians: growth stops at this count (highest gradients first); None = no cap.
    """

    grow_grad2d: float = 0.0002
    grow_scale3d: float = 0.01
    prune_opa: float = 0.005
    prune_scale3d: float = 0.1
    refine_start: int = 500
    refine_stop: int = 15000
    refine_every: int = 100
    reset_every: int = 3000
    absgrad: bool = False
    max_gaussians: int = None


class DensifyStats:
    """Accumulated gradient statistics: grad2d (N,) sum of NDC gradient norms and count (N,)
    number of views where each Gaussian was visible."""

    def __init__(self, n: int, device="cpu"):
        self.grad2d = torch.zeros(n, device=device)
        self.count = torch.zeros(n, device=device)

    def accumulate(self, grad2d: torch.Tensor, radii: torch.Tensor, width: int, height: int):
        """Add one render's statistics: grad2d (C,N,2) pixel gradients of the 2D means,
        radii (C,N,2) (0 = culled) of images `width` x `height`."""
        c = grad2d.shape[0]
        g = grad2d.detach().to(self.grad2d.dtype).clone()
        g[..., 0] *= 0.5 * width * c
        g[..., 1] *= 0.5 * height * c
        # masked sums, no nonzero/boolean indexing: nothing here waits for the device
        visible = (radii > 0).all(dim=-1).to(self.grad2d.dtype)
        self.grad2d += (g.norm(dim=-1) * visible).sum(dim=0)
        self.count += visible.sum(dim=0)

    def reset(self, n: int):
        self.__init__(n, self.grad2d.device)

    def state_dict(self) -> dict:
        return {"grad2d": self.grad2d.clone(), "count": self.count.clone()}

    def load_state_dict(self, state: dict):
        self.grad2d, self.count = state["grad2d"].clone(), state["count"].clone()


def _edit(params: dict, optimizer: Optimizer, param_fn, state_fn) -> None:
    """Replace every parameter by param_fn(name, tensor), in `params` and in its param group
    (named `name`) of `optimizer`, and each of its Adam moments by state_fn(moment); the
    step counts are kept."""
    for group in optimizer.param_groups:
        name = group["name"]
        (old,) = group["params"]
        new = torch.nn.Parameter(param_fn(name, old.detach()).contiguous())
        state = optimizer.state.pop(old, None)
        if state is not None:
            for key in ("exp_avg", "exp_avg_sq"):
                state[key] = state_fn(state[key]).contiguous()
            optimizer.state[new] = state
        group["params"] = [new]
        params[name] = new


def duplicate(params: dict, optimizer: Optimizer, mask: torch.Tensor) -> int:
    """Clone the masked Gaussians in place (copies appended at the end)."""
    sel = torch.nonzero(mask, as_tuple=True)[0]
    _edit(params, optimizer, lambda _, p: torch.cat([p, p[sel]]),
          lambda s: torch.cat([s, torch.zeros_like(s[sel])]))
    return int(sel.numel())


def _quat_to_rotmat(q: torch.Tensor) -> torch.Tensor:
    w, x, y, z = torch.nn.functional.normalize(q, dim=-1).unbind(-1)
    return torch.stack([
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1).reshape(-1, 3, 3)


def split(params: dict, optimizer: Optimizer, mask: torch.Tensor,
          generator: torch.Generator) -> int:
    """Replace each masked Gaussian by two, centred at samples of itself, with std-devs
    divided by 1.6 (the 3DGS rule); the new ones go at the end."""
    sel = torch.nonzero(mask, as_tuple=True)[0]
    rest = torch.nonzero(~mask, as_tuple=True)[0]
    m = sel.numel()
    scales = torch.exp(params["scales"].detach()[sel])
    rot = _quat_to_rotmat(params["quats"].detach()[sel])
    noise = torch.randn(2, m, 3, generator=generator).to(scales.device)
    offsets = torch.einsum("mij,bmj->bmi", rot, noise * scales)

    def param_fn(name, p):
        if name == "means":
            new = (p[sel] + offsets).reshape(-1, 3)
        elif name == "scales":
            new = torch.log(scales / 1.6).repeat(2, 1)
        else:
            new = p[sel].repeat(2, *([1] * (p.dim() - 1)))
        return torch.cat([p[rest], new])

    _edit(params, optimizer, param_fn,
          lambda s: torch.cat([s[rest], torch.zeros((2 * m,) + s.shape[1:], dtype=s.dtype,
                                                    device=s.device)]))
    return m


def remove(params: dict, optimizer: Optimizer, mask: torch.Tensor) -> int:
    """Delete the masked Gaussians."""
    keep = torch.nonzero(~mask, as_tuple=True)[0]
    _edit(params, optimizer, lambda _, p: p[keep], lambda s: s[keep])
    return int(mask.sum())


def reset_opacity(params: dict, optimizer: Optimizer, cfg: DensifyConfig) -> None:
    """Clamp opacities to at most 2 x prune_opa and zero the opacity Adam moments."""
    cap = math.log(2 * cfg.prune_opa / (1 - 2 * cfg.prune_opa))
    p = params["opacities"]
    with torch.no_grad():
        p.clamp_(max=cap)
    state = optimizer.state.get(p)
    if state:
        state["exp_avg"].zero_()
        state["exp_avg_sq"].zero_()


def _limit_growth(grads: torch.Tensor, grow: torch.Tensor, budget: int) -> torch.Tensor:
    """Keep only the `budget` highest-gradient entries of the `grow` mask."""
    if int(grow.sum()) <= budget:
        return grow
    limited = torch.zeros_like(grow)
    if budget > 0:
        idx = torch.nonzero(grow, as_tuple=True)[0]
        limited[idx[grads[idx].topk(budget).indices]] = True
    return limited


def refine(params: dict, optimizer: Optimizer, stats: DensifyStats, cfg: DensifyConfig,
           step: int, scene_scale: float, generator: torch.Generator) -> dict:
    """Clone small high-gradient Gaussians, split large ones, then prune transparent (and,
    after the first opacity reset, huge) ones. Resets `stats`. Returns the counts."""
    grads = stats.grad2d / stats.count.clamp_min(1)
    max_scale = torch.exp(params["scales"].detach()).max(dim=-1).values
    grow = grads > cfg.grow_grad2d
    if cfg.max_gaussians is not None:
        grow = _limit_growth(grads, grow, cfg.max_gaussians - grads.numel())
    small = max_scale <= cfg.grow_scale3d * scene_scale
    n_clone = duplicate(params, optimizer, grow & small)
    split_mask = torch.cat([grow & ~small, torch.zeros(n_clone, dtype=torch.bool,
                                                       device=grow.device)])
    n_split = split(params, optimizer, split_mask, generator)

    opacity = torch.sigmoid(params["opacities"].detach())
    prune = opacity < cfg.prune_opa
    if cfg.reset_every and step > cfg.reset_every:
        prune |= torch.exp(params["scales"].detach()).max(-1).values > cfg.prune_scale3d * scene_scale
    n_prune = remove(params, optimizer, prune)
    stats.reset(params["means"].shape[0])
    return {"cloned": n_clone, "split": n_split, "pruned": n_prune}


def refines_at(cfg: DensifyConfig, step: int) -> bool:
    """Whether `step_post_backward` refines (reads `stats`) after step `step`."""
    return cfg.refine_start < step < cfg.refine_stop and step % cfg.refine_every == 0


def step_post_backward(params: dict, optimizer: Optimizer, stats: DensifyStats, cfg: DensifyConfig,
                       step: int, scene_scale: float, generator: torch.Generator):
    """After the backward of step `step` (0-based, already accumulated into `stats`):
    refine and/or reset opacities on schedule. Returns refine counts or None."""
    if step >= cfg.refine_stop:
        return None
    counts = None
    if refines_at(cfg, step):
        counts = refine(params, optimizer, stats, cfg, step, scene_scale, generator)
    if cfg.reset_every and step > 0 and step % cfg.reset_every == 0:
        reset_opacity(params, optimizer, cfg)
    return counts
