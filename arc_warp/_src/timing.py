"""GPU timing with CUDA events: warm-up, then the median of repeated launches."""

import statistics
from collections.abc import Callable

import warp as wp


def median_time_ms(fn: Callable[[], None], device, warmup: int = 3, reps: int = 20) -> float:
    """Median wall time of ``fn()`` on ``device`` in milliseconds.

    On CUDA each repetition is bracketed by timing events on the current stream; on
    the CPU a host clock is used after a synchronize. ``fn`` must only enqueue work.
    """
    device = wp.get_device(device)
    for _ in range(warmup):
        fn()
    wp.synchronize_device(device)
    times = []
    if device.is_cuda:
        for _ in range(reps):
            start = wp.Event(device, enable_timing=True)
            end = wp.Event(device, enable_timing=True)
            wp.record_event(start)
            fn()
            wp.record_event(end)
            wp.synchronize_event(end)
            times.append(wp.get_event_elapsed_time(start, end))
    else:
        import time

        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            wp.synchronize_device(device)
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)
