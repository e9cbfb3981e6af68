"""Result files: ``benchmarks/results/NAME.json``, one per benchmark, and the markdown they print.

A file holds what the benchmark's ``run`` returned (``rows`` and its other figures) and
this metadata: ``benchmark``, ``command`` (the command line that made it), ``device``
(the device measured, in words), ``commit`` (the tree's ``git describe``, ``-dirty``
when it had changes), ``date`` (UTC), ``versions`` (Python, numpy, Warp, torch and the
peers imported), ``source`` (``"measured"``, or where seeded figures came from) and
``smoke`` (a ``--smoke`` run: never part of BENCHMARKS.md).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import pathlib
import platform
import shlex
import subprocess
import sys

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
ROOT = RESULTS.parent.parent
MEASURED = "measured"


def commit() -> str:
    """The checkout's short commit, ``-dirty`` if it has uncommitted changes, or ``unknown``;
    ``ARC_WARP_COMMIT`` overrides it (a copy of the tree without its git folder)."""
    if os.environ.get("ARC_WARP_COMMIT"):
        return os.environ["ARC_WARP_COMMIT"]
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], cwd=ROOT, capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def versions() -> dict:
    """Versions of the interpreter and of the libraries this process has imported."""
    found = {"python": platform.python_version()}
    for name, module in (("numpy", "numpy"), ("warp", "warp"), ("torch", "torch"), ("arc_warp", "arc_warp"),
                         ("gsplat", "gsplat"), ("gswarp", "gswarp"), ("nvdiffrast", "nvdiffrast"),
                         ("newton", "newton")):
        if module in sys.modules:
            found[name] = str(getattr(sys.modules[module], "__version__", "?"))
    return found


def write(name: str, result: dict, out: pathlib.Path, argv: list[str], smoke: bool = False) -> pathlib.Path:
    """Writes ``result`` with its metadata to ``out/NAME.json`` (NAME: the benchmark, or
    ``BENCHMARK-LABEL``); returns the path."""
    record = {"benchmark": name.split("-")[0], "command": "python -m benchmarks " + shlex.join(argv),
              "device": result.pop("device", "unknown"), "commit": commit(),
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"), "versions": versions(),
              "source": MEASURED, "smoke": bool(smoke), **result}
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(_plain(record), indent=1, allow_nan=False) + "\n")
    return path


def _plain(value):
    """``value`` with numpy scalars and arrays as Python numbers and lists, and non-finite
    floats as None (JSON has no NaN or infinity; the tables print ``-``)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist"):
        return _plain(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def load(path: pathlib.Path) -> dict:
    record = json.loads(pathlib.Path(path).read_text())
    missing = [k for k in ("benchmark", "command", "device", "commit", "date", "source", "rows") if k not in record]
    if missing:
        raise ValueError(f"{path}: not a benchmark result (no {', '.join(missing)})")
    return record


# ------------------------------------------------------------------ markdown


def num(value, digits: int = 3) -> str:
    """A figure for a table: ``-`` when absent or not finite."""
    if value is None or isinstance(value, bool):
        return "-"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "-"
    if isinstance(value, str):
        return value
    return f"{value:.{digits}f}"


def ratio(ours, theirs) -> str:
    """``ours / theirs`` to two decimals (below 1: ours is faster or smaller), or ``-``."""
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (ours, theirs)) or not theirs:
        return "-"
    return f"{ours / theirs:.2f}"


def count(n: int) -> str:
    """300000 -> 300k, 1000000 -> 1M."""
    for unit, scale in (("M", 1_000_000), ("k", 1000)):
        if n >= scale and n % (scale // 10) == 0:
            text = f"{n / scale:.1f}".removesuffix(".0")
            return text + unit
    return str(n)


def markdown(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table; columns after the first whose cells all look numeric align right."""
    def numeric(j):
        cells = [r[j] for r in rows if r[j] not in ("-", "")]
        return j > 0 and cells and all(c.replace(".", "", 1).replace("-", "", 1).isdigit() for c in cells)

    rule = ["---:" if numeric(j) else "---" for j in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(rule) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)
