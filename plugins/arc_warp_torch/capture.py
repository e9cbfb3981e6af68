"""A training step with arc_warp renders captured whole in ``torch.cuda.graph``.

Through the torch API each render and backward costs a few hundred microseconds of
Python (BENCHMARKS.md); a step replayed from a CUDA graph costs one graph launch. The
renders of a captured step cannot wait for the device, so their checks run after
replays, when asked (:meth:`CapturedStep.check`). Example (warm-up on a side stream, as
torch's CUDA graph notes advise)::

    context = RenderContext("cuda", graphs=False, release_workspace=False)
    optimizer = torch.optim.Adam(params, lr=1e-3, capturable=True)

    def step():
        image = rasterization(..., context=context)[0]
        (image - target).abs().mean().backward()
        optimizer.step()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    optimizer.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), capture_step(context) as captured:
        step()
    for i in range(iterations):
        target.copy_(next_image())  # inputs change in place; the graph reads the same memory
        graph.replay()
        if i % 100 == 0:
            captured.check()
"""

import torch
import warp as wp

from arc_warp._src.splat.capture import CapturedRenders

from ._autograd import RenderContext

# torch.cuda.graph's capture_error_mode -> Warp's value of the same cudaStreamCaptureMode
_CAPTURE_MODES = {"global": wp.CaptureMode.GLOBAL, "thread_local": wp.CaptureMode.THREAD_LOCAL,
                  "relaxed": wp.CaptureMode.RELAXED}


class CapturedStep:
    """The arc_warp renders of one ``torch.cuda.graph`` capture (:func:`capture_step`).

    While the graph may be replayed, its context belongs to it: a render through the
    context outside the capture raises RuntimeError (it could grow or reuse the buffers
    the graph reads) until :meth:`release`. Use another RenderContext for other renders
    (an evaluation view, say)."""

    def __init__(self, context: RenderContext, capture_error_mode: str):
        if context.device.type != "cuda":
            raise ValueError(f"capture_step: CUDA graphs need a CUDA RenderContext, got one on {context.device}")
        if capture_error_mode not in _CAPTURE_MODES:
            raise ValueError(f"capture_step: capture_error_mode must be one of {tuple(_CAPTURE_MODES)} (as given "
                             f"to torch.cuda.graph), got {capture_error_mode!r}")
        self.context = context
        # torch.cuda.graph synchronises the device before its capture begins, so renders
        # from before it are checked without a wait, which the capture would forbid
        self.renders = CapturedRenders(context.workspace, synchronized=True)
        self._mode = _CAPTURE_MODES[capture_error_mode]
        self._stream = None

    def __enter__(self) -> "CapturedStep":
        context = self.context
        if not torch.cuda.is_current_stream_capturing():
            raise RuntimeError("capture_step: enter it inside torch.cuda.graph(...), after the graph: "
                               "`with torch.cuda.graph(g), capture_step(context) as captured:`")
        if context.captured is not None:
            raise RuntimeError("capture_step: this RenderContext already belongs to a captured graph; call "
                               "release() on its CapturedStep first, or capture with another context")
        self._stream = context.warp_stream()  # torch's capturing stream
        self.renders.__enter__()
        try:
            # Warp learns of torch's capture, so the memory its sorts and scans take and
            # give back inside it becomes allocation and free nodes of the graph
            wp.capture_begin(context._wdevice, stream=self._stream, external=True, capture_mode=self._mode)
        except BaseException:
            self.renders.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> bool:
        try:
            wp.capture_end(self.context._wdevice, stream=self._stream)
        finally:
            self.renders.__exit__(*exc)
        if exc[0] is None:
            self.context.captured = self
        return False

    def check(self) -> None:
        """Wait for the last replay (torch's current stream) and check its renders:
        ValueError for non-finite inputs, zero quaternions or bad cameras; RuntimeError
        if a render had more tile intersections than its captured sort holds (its images
        left out the farthest Gaussians of some tiles): capture the step again then,
        after one step outside the graph."""
        torch.cuda.current_stream(self.context.device).synchronize()
        self.renders.check()

    def release(self) -> None:
        """Give the context back for renders outside the graph (the graph must not be
        replayed after; its buffers may be reused or grown)."""
        if self.context.captured is self:
            self.context.captured = None


def capture_step(context: RenderContext, capture_error_mode: str = "global") -> CapturedStep:
    """A :class:`CapturedStep` to enter inside ``torch.cuda.graph`` around a step whose
    renders use ``context``. ``capture_error_mode``: the one passed to
    ``torch.cuda.graph`` (its default, "global", here too).

    The context must be made with ``graphs=False`` (its renders launch kernel by kernel
    into the capture) and ``release_workspace=False`` (it keeps its buffers, whose
    addresses the graph holds), with ``defer_checks`` on (the default on CUDA), so a
    default context (graphs on) cannot be captured. Run the step once before capturing
    it, with the same tensors: a captured render must repeat its context's previous
    render, whose sizes are known, or it raises RuntimeError."""
    return CapturedStep(context, capture_error_mode)
