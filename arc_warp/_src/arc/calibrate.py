"""Self-calibration of the ARC thresholds, cached per GPU name.

T is the number of valid lanes of a warp at and above which ``arc`` reduces in the
warp instead of issuing raw atomics. The best T depends on the GPU (shuffle and
issue throughput against L2 atomic throughput), on how crowded the L2 is and on what
one raw atomic carries, so it is measured on the objective itself, for the two ways
kernels accumulate:

- ``threshold``, for warps whose lanes share one target (``uniform_index``: the splat
  rasteriser) and for ``accumulator`` / ``scatter_add``: the synthetic gradient kernel
  of :mod:`arc_warp._src.arc.probe` (K=9 floats per add) runs at a ladder of
  active-lane densities (:data:`DENSITIES`) in ``atomic``, in ``warp`` and in ``arc``
  for every candidate T (:data:`CANDIDATES`), and T is the candidate whose worst ratio
  against the better of ``atomic`` and ``warp`` is highest;
- ``keyed_threshold``, for kernels whose lanes aim at different targets and plan once
  per thread (``keyed_plan``: the mesh backwards): the keyed probe (four float4 texel
  adds per pixel) runs at a ladder of lanes per key (:data:`KEYED_GROUPS`), and among
  the candidates (:data:`KEYED_CANDIDATES`, including 33: never reduce) whose worst
  ratio is within :data:`KEYED_TOLERANCE` of the best, the fastest in total wins. A
  float4 atomic carries four floats, so where float4 atomics exist (sm_90) the warp
  reduction must replace more of them to pay, and on some GPUs it never does; T = 33
  then makes ``arc`` compile as ``atomic`` (:func:`kernel_mode`).

Results are cached in memory and in a JSON file
(``$ARC_WARP_CACHE_DIR/calibration.json``, default ``~/.cache/arc_warp``), keyed by GPU
name and valid only for the arc_warp and Warp versions that measured them.

Calibration launches and synchronises kernels, so it must not run inside a CUDA graph
capture or a timed step: call :func:`calibrate` (or :func:`resolve_threshold`) once at
setup. After that, :func:`resolve_threshold` is a dictionary lookup. File writes go
to a unique temporary file renamed over the cache, so data-parallel ranks on one host
can calibrate at once and always leave a valid file (the last writer's entry wins).
"""

import dataclasses
import datetime
import json
import os
import pathlib
import sys
import tempfile

import warp as wp

from .probe import KEYED_ROW, VecK, launch_keyed_probe, launch_probe, make_params
from .timing import median_times_ms

MIN_THRESHOLD = 1
MAX_THRESHOLD = 33
"""T = 33 never reduces (pure atomics); T = 1 always reduces."""

FALLBACK_THRESHOLD = 8
"""Used on the CPU, where atomics are uncontended and T only selects a code path."""

CANDIDATES = (2, 3, 4, 5, 6, 8, 10, 12, 16)
"""Thresholds tried by :func:`calibrate`."""

DENSITIES = (1.0, 0.25, 0.08, 1 / 32)
"""Fractions of active lanes at which :func:`calibrate` times the probe."""

KEYED_CANDIDATES = (2, 4, 8, 12, 16, 24, MAX_THRESHOLD)
"""Keyed thresholds tried by :func:`calibrate` (33: never reduce, compiled as ``atomic``)."""

KEYED_GROUPS = (32, 16, 8, 4, 2, 1)
"""Lanes per key at which :func:`calibrate` times the keyed probe (16: a texture
magnified about 4x under an 8x4 warp; 1: minified)."""

KEYED_TOLERANCE = 0.03
"""Keyed candidates whose worst ratio is within this of the best count as equally safe;
the fastest in total of them wins (a plan's few instructions cost ~1-3% where nothing
reduces, which must not rule out a reduction that pays several times that where lanes
share keys)."""

_ENV_THRESHOLD = "ARC_WARP_THRESHOLD"
_ENV_CACHE_DIR = "ARC_WARP_CACHE_DIR"
_memory_cache: dict[str, "Calibration"] = {}


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Result of :func:`calibrate` for one GPU.

    Attributes:
        device_name: CUDA device name, the cache key (e.g. ``"NVIDIA H200"``).
        threshold: the chosen T, in ``[1, 33]``.
        densities: active-lane fractions that were timed.
        candidates: thresholds that were tried.
        atomic_ms / warp_ms: median probe time (ms) per density.
        arc_ms: median probe time (ms) per candidate (outer) and density (inner).
        keyed_threshold: the chosen T of keyed plans, in ``[1, 33]``.
        keyed_groups / keyed_candidates: lanes per key timed, keyed thresholds tried.
        keyed_atomic_ms / keyed_warp_ms / keyed_arc_ms: the keyed probe's times, as above
            per group size.
        warp_version: Warp version that measured it.
        date: ISO date of the measurement.
        arc_warp_version: arc_warp version that measured it, by default the running
            one (a cache entry from another arc_warp or Warp version is ignored).
    """

    device_name: str
    threshold: int
    densities: tuple[float, ...]
    candidates: tuple[int, ...]
    atomic_ms: tuple[float, ...]
    warp_ms: tuple[float, ...]
    arc_ms: tuple[tuple[float, ...], ...]
    keyed_threshold: int
    keyed_groups: tuple[int, ...]
    keyed_candidates: tuple[int, ...]
    keyed_atomic_ms: tuple[float, ...]
    keyed_warp_ms: tuple[float, ...]
    keyed_arc_ms: tuple[tuple[float, ...], ...]
    warp_version: str
    date: str
    arc_warp_version: str = dataclasses.field(default_factory=lambda: _arc_warp_version())

    def worst_ratio(self, candidate: int) -> float:
        """min over densities of best(atomic, warp) / arc for one candidate T."""
        return _worst_ratio(self.atomic_ms, self.warp_ms, self.arc_ms[self.candidates.index(candidate)])

    def keyed_worst_ratio(self, candidate: int) -> float:
        """min over group sizes of best(atomic, warp) / arc for one keyed candidate T."""
        return _worst_ratio(self.keyed_atomic_ms, self.keyed_warp_ms,
                            self.keyed_arc_ms[self.keyed_candidates.index(candidate)])


def _worst_ratio(atomic_ms, warp_ms, arc_ms) -> float:
    return min(min(a, w) / t for a, w, t in zip(atomic_ms, warp_ms, arc_ms))


def _arc_warp_version() -> str:
    from arc_warp import __version__  # at call time: arc_warp/__init__ imports this module

    return __version__


def _cache_file() -> pathlib.Path:
    root = os.environ.get(_ENV_CACHE_DIR) or os.path.join(os.path.expanduser("~"), ".cache", "arc_warp")
    return pathlib.Path(root) / "calibration.json"


def _check_threshold(t, source: str) -> int:
    if isinstance(t, bool) or not isinstance(t, int) or not MIN_THRESHOLD <= t <= MAX_THRESHOLD:
        raise ValueError(f"ARC threshold from {source} must be an int in [{MIN_THRESHOLD}, {MAX_THRESHOLD}]; got {t!r}")
    return t


def choose_threshold(candidates, atomic_ms, warp_ms, arc_ms, tolerance: float = 0.0) -> int:
    """The candidate T with the highest worst-case ratio best(atomic, warp) / arc.

    ``atomic_ms`` and ``warp_ms`` hold one time per density, ``arc_ms`` one row of
    such times per candidate. Candidates whose worst ratio is within ``tolerance`` of
    the highest tie; ties go to the smaller total time.
    """
    worst = [_worst_ratio(atomic_ms, warp_ms, row) for row in arc_ms]
    safe = [i for i in range(len(candidates)) if worst[i] >= max(worst) - tolerance]
    return candidates[min(safe, key=lambda i: (sum(arc_ms[i]), -worst[i]))]


def kernel_mode(mode: str, threshold: int) -> str:
    """The mode a kernel is compiled in: ``atomic`` for ``arc`` at a threshold that never
    reduces (above 32 lanes), so such a kernel carries no reduction code; else ``mode``."""
    return "atomic" if mode == "arc" and threshold >= MAX_THRESHOLD else mode


def _ladder(device, steps, candidates, launcher):
    """(atomic_ms, warp_ms, arc_ms) of ``launcher(mode, step[, t])`` over ``steps`` (one
    time per step; ``arc_ms`` one row per candidate T), the variants of one step
    interleaved so that drift falls on them alike."""
    rows = []
    for step in steps:
        fns = {"atomic": launcher("atomic", step), "warp": launcher("warp", step)}
        fns.update({t: launcher("arc", step, t) for t in candidates})
        rows.append(median_times_ms(fns, device, warmup=2, reps=7))
    return (tuple(r["atomic"] for r in rows), tuple(r["warp"] for r in rows),
            tuple(tuple(r[t] for r in rows) for t in candidates))


def calibrate(device=None, n_targets: int = 100_000, n_blocks: int = 4096, targets_per_block: int = 32,
              keyed_threads: int = 1 << 20) -> Calibration:
    """Times ``arc`` against ``atomic`` and ``warp`` on a CUDA ``device`` and picks both
    thresholds (see the module notes).

    Takes about a second. The result is stored in the memory and file caches, so
    later :func:`resolve_threshold` calls reuse it.
    """
    device = wp.get_device(device)
    if not device.is_cuda:
        raise ValueError(f"calibration measures a CUDA device; got {device}. On the CPU T is {FALLBACK_THRESHOLD}.")
    dest = wp.zeros(n_targets, dtype=VecK, device=device)
    params = make_params(n_targets, device)

    def launcher(mode, p, t=1):
        return lambda: launch_probe(
            mode, params, dest, n_blocks, targets_per_block, p_active=p, threshold=t, uniform_index=True
        )

    # uniform: the probe at each density
    atomic_ms, warp_ms, arc_ms = _ladder(device, DENSITIES, CANDIDATES, launcher)

    texels = wp.zeros(KEYED_ROW * KEYED_ROW, dtype=wp.vec4, device=device)

    def keyed(mode, group, t=1):
        mode = kernel_mode(mode, t)  # as the mesh ops compile it
        return lambda: launch_keyed_probe(mode, texels, keyed_threads, group, threshold=t)

    keyed_atomic_ms, keyed_warp_ms, keyed_arc_ms = _ladder(device, KEYED_GROUPS, KEYED_CANDIDATES, keyed)
    result = Calibration(
        device_name=device.name,
        threshold=choose_threshold(CANDIDATES, atomic_ms, warp_ms, arc_ms),
        densities=DENSITIES,
        candidates=CANDIDATES,
        atomic_ms=atomic_ms,
        warp_ms=warp_ms,
        arc_ms=arc_ms,
        keyed_threshold=choose_threshold(KEYED_CANDIDATES, keyed_atomic_ms, keyed_warp_ms, keyed_arc_ms,
                                         KEYED_TOLERANCE),
        keyed_groups=KEYED_GROUPS,
        keyed_candidates=KEYED_CANDIDATES,
        keyed_atomic_ms=keyed_atomic_ms,
        keyed_warp_ms=keyed_warp_ms,
        keyed_arc_ms=keyed_arc_ms,
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
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # a name of its own per writer, then an atomic rename: concurrent ranks never
        # write into one temporary file, and readers see a whole old or new file
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data, indent=1))
        os.replace(tmp, path)
    except OSError as e:  # a read-only home must not stop rendering
        print(f"arc_warp: could not write calibration cache {path}: {e}", file=sys.stderr)
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def _tuples(value):
    """JSON lists back to (nested) tuples."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _load(device_name: str) -> Calibration | None:
    path = _cache_file()
    try:
        entry = json.loads(path.read_text()).get(device_name)
    except (OSError, ValueError):
        return None
    if (
        not isinstance(entry, dict)
        or entry.get("warp_version") != wp.config.version
        or entry.get("arc_warp_version") != _arc_warp_version()
    ):
        return None
    try:
        entry = {k: _tuples(v) for k, v in entry.items()}
        return Calibration(**entry)
    except TypeError:
        return None


def resolve_threshold(device=None, override: int | None = None, keyed: bool = False) -> int:
    """The ARC threshold T to use on ``device``: for warps that share one target and
    ``accumulator`` / ``scatter_add``, or (``keyed``) for kernels that plan with
    ``keyed_plan`` (see the module notes).

    Order: ``override`` if given; else the ``ARC_WARP_THRESHOLD`` environment
    variable (both kinds); else, on the CPU, :data:`FALLBACK_THRESHOLD`; else the
    calibration for this GPU name from the memory or file cache, running
    :func:`calibrate` on first use.

    Call it (or :func:`calibrate`) once per GPU at setup: the first call on an
    uncalibrated GPU runs the calibration (about a second of kernel launches), which
    would break a CUDA graph capture, so under capture it raises ``RuntimeError``
    instead. Later calls are an environment read and a dictionary lookup.
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
        if getattr(device, "is_capturing", False):
            raise RuntimeError(
                f"the ARC threshold of {device.name} is not calibrated yet, and calibrating would break "
                "the CUDA graph capture under way; call arc_warp.calibrate(device) or "
                "arc_warp.resolve_threshold(device) before capturing, or pass a threshold explicitly"
            )
        print(f"arc_warp: calibrating the ARC threshold for {device.name} (once per GPU) ...", file=sys.stderr)
        cached = calibrate(device)
    _memory_cache[device.name] = cached
    return cached.keyed_threshold if keyed else cached.threshold
