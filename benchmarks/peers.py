"""The peers, imported where available, and the torch renderers the step benchmarks drive.

Peers are optional: :func:`optional` imports one and returns ``(module, note)``, the
module None and the note saying why when it is absent. :func:`libraries` gives the torch
renderers by label:

- ``arc``: ``arc_warp_torch.rasterization`` with the activations (normalise, exp,
  sigmoid) in torch;
- ``arc_fused``: the same on the raw parameters, the activations inside the projection
  (``scales_activation="exp"``, ``opacities_activation="sigmoid"``);
- ``gsplat`` / ``gsplat_packed``: gsplat's ``rasterization`` (classic mode), labelled with
  its version (``gsplat-1.5.3``);
- ``fastergs``: Faster-GS's ``FasterGSCudaBackend.torch_bindings.diff_rasterize``, on the
  raw parameters as its trainer keeps them (SH split [N,1,3] + [N,15,3], opacities
  [N,1]), one call per camera (each stacked into [C, H, W, 3]).

For the arc renderers :data:`ARC_HOST` adds up the host milliseconds spent in arc_warp's
code: the ``rasterization`` call and its autograd node's backward (timed by the node's
pre- and post-hooks), and :data:`WAITS` the part spent in ``wp.synchronize_event``
(arc_warp's wait for a render's checks), once :func:`count_waits` has wrapped it.
"""

from __future__ import annotations

import importlib
import time
from typing import Callable, NamedTuple

from benchmarks.scene import FAR, NEAR, SH_DEGREE

ARC_HOST = [0.0]  # ms in arc_warp code since the last reset (see the module notes)
WAITS = [0.0]  # ms in wp.synchronize_event since the last reset
LRS = {"means": 1.6e-4, "quats": 1e-3, "log_scales": 5e-3, "logit_opacities": 5e-2, "sh": 2.5e-3,
       "sh_rest": 2.5e-3 / 20}  # 3DGS's rates (Faster-GS keeps SH degrees 1-3 apart, at 1/20 of the DC rate)
FUSED = {"scales_activation": "exp", "opacities_activation": "sigmoid"}
LIBRARIES = ("arc", "arc_fused", "gsplat", "gsplat_packed", "fastergs")


def optional(module: str):
    """``(module, note)``: the imported module and its version, or None and why not."""
    try:
        found = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - a peer that fails to import in any way is absent
        return None, f"{module} not importable ({type(e).__name__}: {e})"
    return found, f"{module} {getattr(found, '__version__', '')}".strip()


class Library(NamedTuple):
    """How a benchmark drives one renderer: ``render(params, viewmats [C,4,4], Ks [C,3,3])
    -> [C, H, W, 3]``; ``params(scene, device)`` makes its leaf tensors (its training
    layout); ``optimizers``: the optimizer kinds (:func:`optimizer`) its step is timed with."""

    render: Callable
    params: Callable
    optimizers: tuple = ("torch_adam",)


def torch_params(raw: dict, device) -> dict:
    """Leaf tensors (requires_grad) of numpy parameters on a torch device."""
    import torch

    return {k: torch.tensor(v, device=device).requires_grad_(True) for k, v in raw.items()}


def activated(p: dict) -> tuple:
    """(means, quats, scales, opacities, sh) with the activations applied in torch."""
    import torch

    return (p["means"], torch.nn.functional.normalize(p["quats"], dim=-1), torch.exp(p["log_scales"]),
            torch.sigmoid(p["logit_opacities"]), p["sh"])


def _render_node(tensor):
    """The autograd node of arc_warp's render behind ``tensor`` (its output or a view of it)."""
    node, seen = tensor.grad_fn, []
    while node is not None and "Render" not in node.name():
        seen += [n for n, _ in node.next_functions if n is not None]
        node = seen.pop(0) if seen else None
    return node


def _timed_backward(image) -> None:
    """Adds the host time of the render node's backward to ARC_HOST when it runs."""
    node = _render_node(image) if image.requires_grad else None
    if node is None:
        return
    start = []
    node.register_prehook(lambda grad_outputs: start.append(time.perf_counter()))

    def done(grad_inputs, grad_outputs):
        ARC_HOST[0] += (time.perf_counter() - start[0]) * 1e3

    node.register_hook(done)


def arc_library(width: int, height: int, fused: bool, contexts: dict, **options) -> Library:
    """``arc`` or ``arc_fused`` (module notes) with a RenderContext per device, made on
    first use (outside the timed calls: it calibrates); ``options`` go to ``rasterization``."""
    from arc_warp_torch import RenderContext, rasterization

    def render(p, viewmats, ks):
        dev = p["means"].device
        if dev not in contexts:
            contexts[dev] = RenderContext(dev)
        args = (p["means"], p["quats"], p["log_scales"], p["logit_opacities"], p["sh"]) if fused else activated(p)
        t0 = time.perf_counter()
        image = rasterization(*args, viewmats, ks, width, height, sh_degree=SH_DEGREE, context=contexts[dev],
                              **(FUSED if fused else {}), **options)[0]
        ARC_HOST[0] += (time.perf_counter() - t0) * 1e3
        _timed_backward(image)
        return image

    return Library(render, torch_params, ("torch_adam", "fused_adam", "sparse_adam"))


def gsplat_library(gsplat, width: int, height: int, packed: bool) -> Library:
    def render(p, viewmats, ks):
        return gsplat.rasterization(*activated(p), viewmats, ks, width, height, sh_degree=SH_DEGREE, packed=packed,
                                    rasterize_mode="classic")[0]

    return Library(render, torch_params)


def fastergs_library(bindings, width: int, height: int) -> Library:
    """Faster-GS as its ``Renderer.render_image_training`` calls it (module notes): classic
    mode (0.3 px dilation, as arc and gsplat classic), black background, arc's planes."""
    import torch

    cache = {}

    def settings(viewmats, ks):
        """One RasterizerSettings per camera, made on first use (host copies) and kept with
        the camera tensors, so the pointers in the key cannot be reused."""
        key = (viewmats.data_ptr(), ks.data_ptr(), viewmats.shape[0])
        if key not in cache:
            dev = viewmats.device
            vm, k = viewmats.detach().double().cpu(), ks.detach().double().cpu()
            cams = [bindings.RasterizerSettings(
                w2c=vm[c].float().contiguous().to(dev),  # rows 0-2 are read as float4: [R | t]
                cam_position=torch.linalg.inv(vm[c])[:3, 3].float().contiguous().to(dev),
                bg_color=torch.zeros(3, device=dev), active_sh_bases=(SH_DEGREE + 1) ** 2,
                width=width, height=height, focal_x=float(k[c, 0, 0]), focal_y=float(k[c, 1, 1]),
                center_x=float(k[c, 0, 2]), center_y=float(k[c, 1, 2]), near_plane=NEAR,
                far_plane=FAR, proper_antialiasing=False) for c in range(vm.shape[0])]
            cache[key] = (viewmats, ks, cams)
        return cache[key][2]

    no_densification = torch.empty(0)  # size 0: its backward skips the densification statistics

    def render(p, viewmats, ks):
        images = [bindings.diff_rasterize(p["means"], p["log_scales"], p["quats"], p["logit_opacities"], p["sh"],
                                          p["sh_rest"], no_densification, s) for s in settings(viewmats, ks)]
        return torch.stack(images).permute(0, 2, 3, 1)

    def params(raw, device):
        split = dict(raw, logit_opacities=raw["logit_opacities"][:, None], sh=raw["sh"][:, :1],
                     sh_rest=raw["sh"][:, 1:])
        return torch_params({k: v.copy() for k, v in split.items()}, device)  # contiguous: raw pointers

    return Library(render, params, ("torch_adam", "fastergs_adam"))


def libraries(labels, width: int, height: int) -> tuple[dict, list[str]]:
    """``({label: Library}, notes)`` for the ``labels`` of :data:`LIBRARIES` available;
    gsplat's labels carry its version. The notes say which peers are absent and why."""
    out, notes, contexts = {}, [], {}
    for label, fused in (("arc", False), ("arc_fused", True)):
        if label in labels:
            out[label] = arc_library(width, height, fused, contexts)
    if {"gsplat", "gsplat_packed"} & set(labels):
        gsplat, note = optional("gsplat")
        notes.append(note)
        for label, packed in (("gsplat", False), ("gsplat_packed", True)):
            if gsplat is not None and label in labels:
                out[f"gsplat-{gsplat.__version__}" + ("-packed" if packed else "")] = \
                    gsplat_library(gsplat, width, height, packed)
    if "fastergs" in labels:
        bindings, note = optional("FasterGSCudaBackend.torch_bindings")
        notes.append("Faster-GS" if bindings is not None else note)
        if bindings is not None:
            out["fastergs"] = fastergs_library(bindings, width, height)
    return out, notes


def optimizer(kind: str, params: dict, device, capturable: bool = False):
    """``torch_adam`` (torch.optim.Adam; fused and capturable when ``capturable``),
    ``fused_adam`` / ``sparse_adam`` (arc_warp_torch.SparseGaussianAdam) or ``fastergs_adam``
    (Faster-GS's FusedAdam), one group per parameter at :data:`LRS`."""
    import torch

    groups = [{"params": [v], "lr": LRS[k]} for k, v in params.items()]
    if kind == "torch_adam":
        return torch.optim.Adam(groups, eps=1e-15, **({"capturable": True, "fused": True} if capturable else {}))
    if kind == "fastergs_adam":
        from FasterGSCudaBackend.torch_bindings import FusedAdam

        return FusedAdam(groups, lr=0.0, eps=1e-15)
    if kind not in ("fused_adam", "sparse_adam"):
        raise ValueError(f"unknown optimizer kind {kind!r}")
    from arc_warp_torch import SparseGaussianAdam

    return SparseGaussianAdam(groups, lr=0.0, eps=1e-15, bias_correction=True, capturable=capturable)


def count_waits() -> None:
    """Wraps ``wp.synchronize_event`` to add the time spent in it to :data:`WAITS` (once)."""
    import warp as wp

    sync = wp.synchronize_event
    if getattr(sync, "counts_waits", False):
        return

    def timed(event):
        t0 = time.perf_counter()
        try:
            return sync(event)
        finally:
            WAITS[0] += (time.perf_counter() - t0) * 1e3

    timed.counts_waits = True
    wp.synchronize_event = timed
