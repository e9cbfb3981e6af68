"""GPU timing with CUDA events: warm-up, then the median of repeated launches."""

import statistics
import time
from collections.abc import Callable

import warp as wp


def median_times_ms(fns: dict[str, Callable[[], None]], device, warmup: int = 3, reps: int = 20) -> dict[str, float]:
    """Median wall time of each ``fns[name]()`` on ``device``, in milliseconds.

    The variants are interleaved: every repetition runs each of them once, in an
    order rotated from one repetition to the next, so clock and thermal drift
    during the run falls on all of them alike and their ratios stay comparable.
    On CUDA each run is bracketed by timing events on the current stream; on the
    CPU a host clock is used after a synchronize. Each ``fn`` must only enqueue work.
    """
    device = wp.get_device(device)
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    wp.synchronize_device(device)
    times = {name: [] for name in names}
    for rep in range(reps):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            if device.is_cuda:
                start = wp.Event(device, enable_timing=True)
                end = wp.Event(device, enable_timing=True)
                wp.record_event(start)
                fns[name]()
                wp.record_event(end)
                wp.synchronize_event(end)
                times[name].append(wp.get_event_elapsed_time(start, end))
            else:
                t0 = time.perf_counter()
                fns[name]()
                wp.synchronize_device(device)
                times[name].append((time.perf_counter() - t0) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def median_time_ms(fn: Callable[[], None], device, warmup: int = 3, reps: int = 20) -> float:
    """Median wall time of ``fn()`` on ``device`` in milliseconds (see :func:`median_times_ms`)."""
    return median_times_ms({"fn": fn}, device, warmup, reps)["fn"]
