"""The calibration cache on the CPU: concurrent writers, version keys, no calibration under capture.

The timing itself needs a GPU (tests/test_gpu.py); here synthetic Calibration records
go through the same store/load/resolve code.
"""

import dataclasses
import json
import threading
import types

import pytest
import warp as wp

import arc_warp
from arc_warp._src.arc import calibrate as cal


def record(name: str, threshold: int = 6, **kw) -> cal.Calibration:
    fields = dict(
        device_name=name, threshold=threshold, densities=(1.0, 0.25), candidates=(2, 6),
        atomic_ms=(1.0, 2.0), warp_ms=(1.5, 2.5), arc_ms=((1.2, 2.2), (0.9, 1.9)),
        keyed_threshold=33, keyed_groups=(16, 1), keyed_candidates=(8, 33), keyed_atomic_ms=(1.0, 1.0),
        keyed_warp_ms=(0.8, 3.0), keyed_arc_ms=((0.85, 1.02), (1.0, 1.0)),
        warp_version=wp.config.version, date="2025-01-01", arc_warp_version=arc_warp.__version__,
    )
    fields.update(kw)
    return cal.Calibration(**fields)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ARC_WARP_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("ARC_WARP_THRESHOLD", raising=False)
    monkeypatch.setattr(cal, "_memory_cache", {})
    return tmp_path


def test_concurrent_writers_leave_a_valid_file(cache_dir, capsys):
    # Ranks on one host store at once; names of different lengths make interleaved
    # writes into one shared temporary file show up as broken JSON.
    n_threads, rounds = 8, 40
    start = threading.Barrier(n_threads)
    errors = []

    def writer(k):
        start.wait()
        try:
            for r in range(rounds):
                cal._store(record("GPU " + "x" * (k * 37 + r), threshold=1 + k))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert "could not write" not in capsys.readouterr().err
    data = json.loads((cache_dir / "calibration.json").read_text())
    assert data, "the cache holds at least the last writer's entry"
    for name in data:
        assert cal._load(name) is not None
    assert [p.name for p in cache_dir.iterdir()] == ["calibration.json"], "temporary files left behind"


def test_store_then_load_round_trips(cache_dir):
    rec = record("NVIDIA Test GPU")
    cal._store(rec)
    assert cal._load("NVIDIA Test GPU") == rec


@pytest.mark.parametrize("field,value", [("arc_warp_version", "0.0.0-other"), ("warp_version", "0.0.0-other")])
def test_entry_from_another_version_is_ignored(cache_dir, field, value):
    cal._store(record("NVIDIA Test GPU", **{field: value}))
    assert cal._load("NVIDIA Test GPU") is None


def test_entry_without_arc_warp_version_is_ignored(cache_dir):
    # A file written before entries carried arc_warp's version must re-calibrate.
    entry = dataclasses.asdict(record("NVIDIA Test GPU"))
    del entry["arc_warp_version"]
    (cache_dir / "calibration.json").write_text(json.dumps({"NVIDIA Test GPU": entry}))
    assert cal._load("NVIDIA Test GPU") is None


def fake_cuda(monkeypatch, capturing: bool):
    dev = types.SimpleNamespace(is_cuda=True, name="NVIDIA Fake", is_capturing=capturing)
    monkeypatch.setattr(cal.wp, "get_device", lambda device=None: dev)
    return dev


def test_resolve_never_calibrates_under_capture(cache_dir, monkeypatch):
    fake_cuda(monkeypatch, capturing=True)
    monkeypatch.setattr(cal, "calibrate", lambda device=None: pytest.fail("calibrated inside a capture"))
    with pytest.raises(RuntimeError, match="before capturing"):
        cal.resolve_threshold("cuda")


def test_resolve_after_setup_reads_the_cache(cache_dir, monkeypatch):
    # Calibrated at setup (here: a file from this version): capture-time calls only look up.
    cal._store(record("NVIDIA Fake", threshold=5))
    fake_cuda(monkeypatch, capturing=True)
    monkeypatch.setattr(cal, "calibrate", lambda device=None: pytest.fail("calibrated again"))
    assert cal.resolve_threshold("cuda") == 5
    (cache_dir / "calibration.json").unlink()
    assert cal.resolve_threshold("cuda") == 5  # memory cache: no file access needed


def test_ladder_times_every_variant_at_every_step(monkeypatch):
    # calibrate()'s two ladders (uniform densities, keyed group sizes) on fake timings:
    # each step's variants in one interleaved timing, rows per candidate in candidate order
    seen = []

    def fake_times(fns, device, warmup, reps):
        seen.append(sorted(map(str, fns)))
        return {name: fn() for name, fn in fns.items()}

    monkeypatch.setattr(cal, "median_times_ms", fake_times)
    launcher = lambda mode, step, t=0: (lambda: {"atomic": 1.0, "warp": 2.0}.get(mode, 10.0 * step + t))  # noqa: E731
    atomic, warp, arc = cal._ladder("cpu", (1, 2, 3), (4, 33), launcher)
    assert atomic == (1.0, 1.0, 1.0) and warp == (2.0, 2.0, 2.0)
    assert arc == ((14.0, 24.0, 34.0), (43.0, 53.0, 63.0))
    assert seen == [["33", "4", "atomic", "warp"]] * 3
