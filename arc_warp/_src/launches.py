"""Prepared device work: kernel launches recorded once and run again, and whole calls kept
as plans (a list of steps, replayed on the CPU, as one CUDA graph on a GPU).

A renderer or a mesh op launches the same kernels with mostly the same arguments on every
call. ``wp.launch`` checks and packs every argument each time (about 25 us of host time
for a dozen arguments); a recorded ``wp.Launch`` (``record_cmd=True``) runs again in a
few, and :meth:`Launches.launch` repacks only the arguments whose pointer, shape,
strides or value changed. A call repeated on the same memory (a training loop's steady
state) need not even run its Python: :meth:`Launches.recording` records its device work
into a :class:`Plan` that replays it.
"""

from __future__ import annotations

import contextlib
import functools

import warp as wp

_REPACK = object()  # the signature of an argument that is always repacked (structs, vectors)


def signature(arg):
    """What must be unchanged for a packed launch argument to be reused."""
    if isinstance(arg, wp.array):
        return (arg.ptr, arg.shape, arg.strides)
    if arg is None or isinstance(arg, (bool, int, float)):
        return arg
    return _REPACK


class Launches:
    """The prepared launches of one object, by launch site.

    Args:
        device: the Warp device every launch runs on (on its current stream).
        record: False launches through ``wp.launch`` every time: an object used for one
            call (a render without a workspace) would pay for recording and gain nothing.
    """

    def __init__(self, device, record: bool = True):
        self.device = wp.get_device(device)
        self.record = record
        self._sites: dict = {}  # (kernel, key) -> [wp.Launch, dim, argument signatures]
        self._steps: list | None = None  # the steps of the plan being recorded

    def launch(self, kernel, dim, args: list, block_dim: int | None = None, key=None) -> None:
        """``wp.launch(kernel, dim, inputs=args, block_dim=block_dim)`` on the device's
        current stream, off any tape. ``key`` names the launch site where one kernel is
        launched at several places of a call (per camera, say); a site is recorded per
        kernel, so a site whose kernel variant changes (another setting) gets its own."""
        if dim == 0:
            return  # Warp records no command for an empty launch
        if not self.record:
            wp.launch(kernel, dim=dim, inputs=args, device=self.device, block_dim=block_dim, record_tape=False)
            return
        if self._steps is not None:  # a plan's launch of its own: its arguments never change
            cmd = wp.launch(kernel, dim=dim, inputs=args, device=self.device, block_dim=block_dim,
                            record_cmd=True, record_tape=False)
            cmd.fwd_args = None  # kept by Warp only for APIC capture; it would pin the arrays
            cmd.launch()
            self._steps.append(cmd.launch)
            return
        key = (kernel, key)
        site = self._sites.get(key)
        if site is None:
            cmd = wp.launch(kernel, dim=dim, inputs=args, device=self.device, block_dim=block_dim,
                            record_cmd=True, record_tape=False)
            cmd.fwd_args = None
            self._sites[key] = [cmd, dim, [signature(a) for a in args]]
        else:
            cmd, old_dim, signatures = site
            if dim != old_dim:
                cmd.set_dim(dim)
                site[1] = dim
            for i, arg in enumerate(args):
                sig = signature(arg)
                if sig is _REPACK or sig != signatures[i]:
                    cmd.set_param_at_index(i, arg)
                    signatures[i] = sig
        cmd.launch()

    def call(self, fn, *args, **kwargs) -> None:
        """``fn(*args, **kwargs)``: device work that is not a kernel launch (a fill, a copy,
        a sort, an event), made part of the plan being recorded."""
        fn(*args, **kwargs)
        if self._steps is not None:
            self._steps.append(functools.partial(fn, *args, **kwargs))

    @contextlib.contextmanager
    def recording(self):
        """The device work queued through this object inside the block, also kept as the
        steps of a plan: ``with launches.recording() as steps: ...``."""
        self._steps = steps = []
        try:
            yield steps
        finally:
            self._steps = None


class Plan:
    """A call's device work kept to be run again on the same memory: its recorded steps,
    run one by one on the CPU; on CUDA captured into a graph the first time it repeats
    (on the caller's capture stream: torch's legacy default stream cannot capture; in
    relaxed mode, since a garbage collection during the capture may free CUDA memory),
    then launched whole on the device's current stream."""

    __slots__ = ("steps", "graph", "device")

    def __init__(self, steps: list, device):
        self.steps, self.device, self.graph = steps, device, None

    def run(self, capture_stream: wp.Stream | None = None) -> None:
        """The steps again; with a ``capture_stream`` (CUDA) as one graph launch."""
        if self.graph is not None and capture_stream is not None:
            wp.capture_launch(self.graph)
            return
        if capture_stream is None:
            for step in self.steps:
                step()
            return
        with wp.ScopedCapture(self.device, stream=capture_stream, force_module_load=False,
                              capture_mode=wp.CaptureMode.RELAXED) as capture:
            for step in self.steps:
                step()
        self.graph = capture.graph
        wp.capture_launch(self.graph)
