"""Renders and backwards of one workspace recorded into a CUDA graph that the caller
captures (a whole training step in ``torch.cuda.graph``, say), and the checks of their
replays.

A render checks its inputs and sizes its tile sort from flags the device copies to the
host (render.py `_settle`). Inside a capture nothing may wait for the device, so the
captured renders must be ones whose checks can wait (`render_checked(defer=True)` with
the workspace's previous inputs: the steady state of a training loop), and they are
checked after a replay, on request (:meth:`CapturedRenders.check`), from the flags that
every replay copies again.
"""

from __future__ import annotations

from .render import settle_deferred
from .validate import raise_on_flags
from .workspace import Workspace


class CapturedRenders:
    """``with CapturedRenders(workspace) as renders:`` around the calls that a CUDA graph
    capture records, then ``renders.check()`` after replays.

    While it is entered, ``workspace.capturing`` is True: the renders' checks are kept
    for :meth:`check` instead of running in their backward, and a render that would have
    to wait for the device (inputs other than the previous render's, an image size not
    rendered before, checks that cannot be deferred) raises RuntimeError before it
    queues anything. Render once with the same inputs before capturing (a warm-up step)
    so that everything the step needs is allocated and its sort size is known.

    The workspace must launch kernel by kernel (``graphs=False``: a CUDA graph of Warp's
    own cannot be a child of the caller's, since it allocates and frees memory) and keep
    its buffers (no ``allocator``): the captured graph holds their addresses. A capture
    that made the workspace allocate (a buffer it had to grow) raises RuntimeError on
    exit; warm up with the same sizes first.

    The graph replays with the kept sort sizes. :meth:`check` raises if a replay found
    bad inputs or more intersections than a kept size (the farthest Gaussians of some
    tiles were left out of its images): capture again then, after a warm-up step with
    the new values.

    Renders before it whose checks were deferred (a render whose backward has not run)
    are checked when it is entered. That waits for the device, so enter it before the
    capture begins, or pass ``synchronized=True`` where the device finished all earlier
    work before the capture began (``torch.cuda.graph`` synchronises it first): their
    flags are then read without a wait, and one that overflowed its sort raises
    RuntimeError (it cannot be rendered again inside the capture).
    """

    def __init__(self, workspace: Workspace, synchronized: bool = False):
        if workspace.graphs:
            raise ValueError("CapturedRenders: the workspace replays CUDA graphs of its own, which cannot be "
                             "captured into another graph; use a workspace made with graphs=False "
                             "(arc_warp_torch: RenderContext(device, graphs=False, release_workspace=False))")
        if workspace.allocator is not None:
            raise ValueError("CapturedRenders: the workspace hands its memory back to an outside allocator "
                             "between steps, so a captured graph would hold addresses it gave away; use a "
                             "workspace without an allocator (arc_warp_torch: release_workspace=False)")
        self.workspace = workspace
        self.synchronized = synchronized
        self.pending: list = []  # the captured renders' pending checks (render.py `_Pending`)
        self._allocations = None

    def __enter__(self) -> CapturedRenders:
        workspace = self.workspace
        if workspace.capturing:
            raise RuntimeError("CapturedRenders: the workspace is already capturing; captures do not nest")
        # earlier renders are checked now, not counted as captured
        settle_deferred(workspace, wait=not self.synchronized)
        self._allocations = workspace.allocations
        workspace.capturing = True
        return self

    def __exit__(self, *exc) -> bool:
        workspace = self.workspace
        workspace.capturing = False
        self.pending = [p for _, p, _ in workspace.deferred]
        workspace.deferred = []
        if exc[0] is None and workspace.allocations != self._allocations:
            raise RuntimeError(
                f"CapturedRenders: the workspace allocated {workspace.allocations - self._allocations} buffer(s) "
                "during the capture, which the graph would then own; run the captured step once more before "
                "capturing it (with the same Gaussians and cameras), so that its buffers exist already")
        return False

    def check(self) -> None:
        """Check the last replay's renders, once it has finished (the caller synchronises):
        ValueError for bad inputs (non-finite values, zero quaternions, bad device
        cameras), RuntimeError if a render had more intersections than its kept sort size."""
        for p in self.pending:
            flags = p.host_flags.tolist()
            raise_on_flags(flags)
            if flags[0] > p.sort_size:
                raise RuntimeError(
                    f"arc_warp: a replayed render had {flags[0]} tile intersections, more than the {p.sort_size} "
                    "its captured sort holds, so the farthest Gaussians of some tiles were left out of its "
                    "images (the Gaussians grew or moved since the capture); run the step once outside the "
                    "graph and capture it again")
