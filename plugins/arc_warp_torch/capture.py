"""A training step with arc_warp renders captured whole in ``torch.cuda.graph``
(``with torch.cuda.graph(graph), capture_step(context) as captured: step()``).

Through the torch API each render and backward costs a few hundred microseconds of
Python; a step replayed from a CUDA graph costs one graph launch. The renders of a
captured step cannot wait for the device, so their checks run after replays, when asked
(:meth:`CapturedStep.check`). docs/torch.md has the whole example (a warm-up on a side
stream first, as torch advises; inputs changed in place between replays).
"""

from __future__ import annotations

import torch
import warp as wp

from ._autograd import RenderContext

# torch.cuda.graph's capture_error_mode -> Warp's value of the same cudaStreamCaptureMode
_CAPTURE_MODES = {"global": wp.CaptureMode.GLOBAL, "thread_local": wp.CaptureMode.THREAD_LOCAL,
                  "relaxed": wp.CaptureMode.RELAXED}


class CapturedStep:
    """The arc_warp renders of one ``torch.cuda.graph`` capture (:func:`capture_step`). While
    it is entered, the context's renderers never wait for the device (a renderer whose
    capacity is unknown raises RuntimeError), and Warp is told of torch's capture (its sorts'
    memory becomes allocation nodes of the graph). The graph replays with the capture's
    capacities; a replay that outgrows them sets the overflow flag, which
    ``SparseGaussianAdam.step(skip=meta["status"])`` reads in the graph and :meth:`check`
    reports."""

    def __init__(self, context: RenderContext, capture_error_mode: str):
        if context.device.type != "cuda":
            raise ValueError(f"capture_step: CUDA graphs need a CUDA RenderContext, got one on {context.device}")
        if capture_error_mode not in _CAPTURE_MODES:
            raise ValueError(f"capture_step: capture_error_mode must be one of {tuple(_CAPTURE_MODES)} (as given "
                             f"to torch.cuda.graph), got {capture_error_mode!r}")
        self.context = context
        self.renders: list = []  # (renderer, capacity) of each render in the graph
        self._mode = _CAPTURE_MODES[capture_error_mode]
        self._stream, self._renderers = None, []  # while entered: the capture's stream, the renderers marked

    def __enter__(self) -> CapturedStep:
        if not torch.cuda.is_current_stream_capturing():
            raise RuntimeError("capture_step: enter it inside torch.cuda.graph(...), after the graph: "
                               "`with torch.cuda.graph(g), capture_step(context) as captured:`")
        self._renderers = self.context.workspace.renderers()
        for renderer in self._renderers:
            renderer.capturing = True
        self._stream = self.context.warp_stream()
        wp.capture_begin(self.context.wp_device, stream=self._stream, external=True, capture_mode=self._mode)
        return self

    def __exit__(self, *exc) -> bool:
        try:
            wp.capture_end(self.context.wp_device, stream=self._stream)
        finally:
            for renderer in self._renderers:
                renderer.capturing = False
                status, renderer._pending = renderer._pending, None
                if status is not None:  # rendered in the graph: each replay copies its flags again
                    self.renders.append((renderer, status.capacity))
        return False

    def check(self) -> None:
        """Wait for the last replay (torch's current stream) and check its renders
        (``RenderStatus.check``): ValueError for bad inputs; RuntimeError if a render
        outgrew its captured sort: capture the step again then, after one step outside the
        graph (which grows the renderer's capacity). Call it right after a replay: a render
        outside the graph on the same renderer rewrites the flags it reads."""
        torch.cuda.current_stream(self.context.device).synchronize()
        for renderer, capacity in self.renders:
            renderer.host_status(capacity).check("captured render")


def capture_step(context: RenderContext, capture_error_mode: str = "global") -> CapturedStep:
    """A :class:`CapturedStep` to enter inside ``torch.cuda.graph`` around a step whose
    renders use ``context`` (run the step once before, with the same tensors and sizes).
    ``capture_error_mode``: the one passed to ``torch.cuda.graph`` (its default here too)."""
    return CapturedStep(context, capture_error_mode)
