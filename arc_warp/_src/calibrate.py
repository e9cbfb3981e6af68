"""Self-calibration of the ARC threshold T, cached per GPU name.

T is the number of valid lanes sharing a target at and above which reducing in the
warp beats raw atomics. It depends on the GPU (shuffle throughput against L2 atomic
throughput), so it is measured: the synthetic gradient kernel of
:mod:`arc_warp._src.probe` runs with exactly n active lanes per warp for n in
:data:`LANE_COUNTS`, in ``atomic`` and in ``warp`` mode, and T is the smallest n from
which ``warp`` is never slower. Results are cached in memory and in a JSON file
(``$ARC_WARP_CACHE_DIR/calibration.json``, default ``~/.cache/arc_warp``).
"""

import dataclasses
import datetime
import json
import os
import pathlib
import sys

import warp as wp

from .probe import VecK, launch_probe, make_params
from .timing import median_times_ms

MIN_THRESHOLD = 1
MAX_THRESHOLD = 33
"""T = 33 never reduces (pure atomics); T = 1 always reduces."""

FALLBACK_THRESHOLD = 8
"""Used on the CPU, where atomics are uncontended and T only selects a code path."""

LANE_COUNTS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 28, 32)

_ENV_THRESHOLD = "ARC_WARP_THRESHOLD"
_ENV_CACHE_DIR = "ARC_WARP_CACHE_DIR"
_memory_cache: dict[str, "Calibration"] = {}


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Result of :func:`calibrate` for one GPU.

    Attributes:
        device_name: CUDA device name, the cache key (e.g. ``"NVIDIA H200"``).
        threshold: the chosen T, in ``[1, 33]``.
        lane_counts: active lanes per warp that were timed.
        atomic_ms / warp_ms: median probe times (ms) per lane count, per mode.
        warp_version: Warp version that measured it.
        date: ISO date of the measurement.
    """

    device_name: str
    threshold: int
    lane_counts: tuple[int, ...]
    atomic_ms: tuple[float, ...]
    warp_ms: tuple[float, ...]
    warp_version: str
    date: str


def _cache_file() -> pathlib.Path:
    root = os.environ.get(_ENV_CACHE_DIR) or os.path.join(os.path.expanduser("~"), ".cache", "arc_warp")
    return pathlib.Path(root) / "calibration.json"


def _check_threshold(t, source: str) -> int:
    if isinstance(t, bool) or not isinstance(t, int) or not MIN_THRESHOLD <= t <= MAX_THRESHOLD:
        raise ValueError(f"ARC threshold from {source} must be an int in [{MIN_THRESHOLD}, {MAX_THRESHOLD}]; got {t!r}")
    return t


def choose_threshold(lane_counts, atomic_ms, warp_ms) -> int:
    """Smallest lane count from which the warp reduction is never slower than atomics."""
    t = MAX_THRESHOLD
    for n, ta, tw in reversed(list(zip(lane_counts, atomic_ms, warp_ms))):
        if tw > ta:
            break
        t = n
    return t


def calibrate(device=None, n_targets: int = 100_000, n_blocks: int = 4096, targets_per_block: int = 32) -> Calibration:
    """Measures atomic against warp-reduction cost on a CUDA ``device`` and picks T.

    Takes about a second. The result is stored in the memory and file caches, so
    later :func:`resolve_threshold` calls reuse it.
    """
    device = wp.get_device(device)
    if not device.is_cuda:
        raise ValueError(f"calibration measures a CUDA device; got {device}. On the CPU T is {FALLBACK_THRESHOLD}.")
    dest = wp.zeros(n_targets, dtype=VecK, device=device)
    params = make_params(n_targets, device)
    # Interleaved per lane count, so drift falls on both strategies alike.
    per_count = [
        median_times_ms(
            {
                mode: lambda mode=mode, n=n: launch_probe(mode, params, dest, n_blocks, targets_per_block, active_lanes=n)
                for mode in ("atomic", "warp")
            },
            device,
            warmup=2,
            reps=7,
        )
        for n in LANE_COUNTS
    ]
    times = {mode: tuple(t[mode] for t in per_count) for mode in ("atomic", "warp")}
    result = Calibration(
        device_name=device.name,
        threshold=choose_threshold(LANE_COUNTS, times["atomic"], times["warp"]),
        lane_counts=LANE_COUNTS,
        atomic_ms=times["atomic"],
        warp_ms=times["warp"],
        warp_version=wp.config.version,
        date=datetime.date.today().isoformat(),
    )
    _memory_cache[device.name] = result
    _store(result)
    return result


def _store(result: Calibration) -> None:
    path = _cache_file()
    try:
        data = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        data = {}
    data[result.device_name] = dataclasses.asdict(result)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(path)
    except OSError as e:  # a read-only home must not stop rendering
        print(f"arc_warp: could not write calibration cache {path}: {e}", file=sys.stderr)


def _load(device_name: str) -> Calibration | None:
    path = _cache_file()
    try:
        entry = json.loads(path.read_text()).get(device_name)
    except (OSError, ValueError):
        return None
    if not entry or entry.get("warp_version") != wp.config.version:
        return None
    try:
        entry = {k: tuple(v) if isinstance(v, list) else v for k, v in entry.items()}
        return Calibration(**entry)
    except TypeError:
        return None


def resolve_threshold(device=None, override: int | None = None) -> int:
    """The ARC threshold T to use on ``device``.

    Order: ``override`` if given; else the ``ARC_WARP_THRESHOLD`` environment
    variable; else, on the CPU, :data:`FALLBACK_THRESHOLD`; else the calibration for
    this GPU name from the memory or file cache, running :func:`calibrate` on first use.
    """
    if override is not None:
        return _check_threshold(override, "the override argument")
    env = os.environ.get(_ENV_THRESHOLD)
    if env:
        try:
            value = int(env)
        except ValueError:
            value = env
        return _check_threshold(value, f"${_ENV_THRESHOLD}")
    device = wp.get_device(device)
    if not device.is_cuda:
        return FALLBACK_THRESHOLD
    cached = _memory_cache.get(device.name) or _load(device.name)
    if cached is None:
        print(f"arc_warp: calibrating the ARC threshold for {device.name} (once per GPU) ...", file=sys.stderr)
        cached = calibrate(device)
    _memory_cache[device.name] = cached
    return cached.threshold
