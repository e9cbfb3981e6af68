"""Timing: host and device milliseconds of calls, medians after warm-up.

On CUDA a call is bracketed by timing events on the current stream (torch's, or Warp's
for core benchmarks): the device time is the events' interval, and the host time is
``time.perf_counter`` around the call, read before any sync (what the CPU spent issuing
the work, including any wait inside the call). On the CPU there are no events and the
work is done when the call returns (Warp's and torch's CPU kernels run inside it), so
both are the host clock: the device column then repeats the host time (``has_events``
is False, and each result file says which timer it used).
"""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass


@dataclass
class Sample:
    host_ms: float
    device_ms: float
    result: object = None


class Clock:
    """Times calls on one device. ``device``: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` (or a
    torch / Warp device); ``events``: ``"torch"`` (events on torch's current stream) or
    ``"warp"`` (on Warp's current stream of the device)."""

    def __init__(self, device, events: str = "torch"):
        if events not in ("torch", "warp"):
            raise ValueError(f"events must be 'torch' or 'warp', got {events!r}")
        self.device = str(device)
        self.has_events = self.device.startswith("cuda")
        self.events = events

    @property
    def name(self) -> str:
        return "CUDA events" if self.has_events else "perf_counter (no device events on the CPU)"

    def _event(self):
        if self.events == "torch":
            import torch

            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        import warp as wp

        event = wp.Event(self.device, enable_timing=True)
        wp.record_event(event)
        return event

    def _elapsed(self, start, end) -> float:
        if self.events == "torch":
            end.synchronize()
            return start.elapsed_time(end)
        import warp as wp

        wp.synchronize_event(end)
        return wp.get_event_elapsed_time(start, end)

    def sync(self) -> None:
        """Waits for the device (nothing to wait for on the CPU)."""
        if not self.has_events:
            return
        if self.events == "torch":
            import torch

            torch.cuda.synchronize(self.device)
        else:
            import warp as wp

            wp.synchronize_device(self.device)

    def time(self, call) -> Sample:
        """One call of ``call()``, timed."""
        start = self._event() if self.has_events else None
        t0 = time.perf_counter()
        result = call()
        host = (time.perf_counter() - t0) * 1e3
        if not self.has_events:
            return Sample(host, host, result)
        return Sample(host, self._elapsed(start, self._event()), result)


def medians(clock: Clock, fns: dict, warmup: int = 3, reps: int = 10, hidden: bool = False) -> dict:
    """``{name: {"host_ms", "device_ms"}}``: the medians of ``reps`` timed calls of each
    ``fns[name]()``, each call made on an idle device (``hidden``: queued behind a spin,
    :func:`behind_spin`, CUDA and torch only), after ``warmup`` untimed calls of each. The
    variants are interleaved, every repetition in an order rotated from the last, so clock
    and thermal drift fall on all of them alike and their ratios hold."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times = {name: [] for name in names}
    for rep in range(reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            clock.sync()
            times[name].append(behind_spin(fns[name]) if hidden else clock.time(fns[name]))
    return {name: {"host_ms": statistics.median(s.host_ms for s in samples),
                   "device_ms": statistics.median(s.device_ms for s in samples)} for name, samples in times.items()}


SPIN_MS = 5.0  # longer than any library's host time to queue one forward or backward


@functools.cache
def _spin_cycles_per_ms() -> float:
    """``torch.cuda._sleep`` cycles per ms on the current device (timed once)."""
    import torch

    cycles = 10_000_000
    torch.cuda._sleep(cycles)  # warm-up
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / start.elapsed_time(end)


def behind_spin(call) -> Sample:
    """``call()`` queued behind a ``SPIN_MS`` spin kernel on torch's current CUDA stream,
    its device time taken from the spin's end: the device time of the call when the host
    has queued it ahead (as a training loop does), without the host's latency before its
    first launch. CUDA only (the caller skips it on the CPU)."""
    import torch

    torch.cuda.synchronize()
    torch.cuda._sleep(int(SPIN_MS * _spin_cycles_per_ms()))
    return Clock("cuda", "torch").time(call)


def forward_backward(render, leaves, cotangent, clock: Clock, reps: int, warmup: int) -> dict:
    """Medians of a torch render ``render() -> image`` and of its ``(image * cotangent).sum()``
    backward, each timed on its own (``{forward_ms, backward_ms, forward_host_ms,
    backward_host_ms}``); the gradients of ``leaves`` are dropped after each backward."""
    fwd, bwd = [], []
    for i in range(warmup + reps):
        clock.sync()
        f = clock.time(render)
        loss = (f.result * cotangent).sum()
        clock.sync()
        b = clock.time(loss.backward)
        for t in leaves:
            t.grad = None
        if i >= warmup:
            fwd.append(f)
            bwd.append(b)
    med = statistics.median
    return {"forward_ms": med(s.device_ms for s in fwd), "backward_ms": med(s.device_ms for s in bwd),
            "forward_host_ms": med(s.host_ms for s in fwd), "backward_host_ms": med(s.host_ms for s in bwd)}
