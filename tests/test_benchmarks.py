"""The benchmarks package: every benchmark's ``--smoke`` run on the CPU, the report, the listing.

The GPU benchmarks run once, late, on a borrowed GPU, so their code is checked here at
tiny sizes. The peers (gsplat, Faster-GS, nvdiffrast) are absent on this machine: stand-ins
with their call signatures, rendering through arc_warp itself, take their place, so the
code that calls them runs too (and, since they render what arc_warp renders, the
agreement checks must find agreement).
"""

import json
import math
import pathlib
import subprocess
import sys
import types

import pytest

torch = pytest.importorskip("torch")

import warp as wp  # noqa: E402

from benchmarks import cli, memory, peers, report, results, train  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------ peer stand-ins


def _gsplat_rasterization(means, quats, scales, opacities, colors, viewmats, Ks, width, height, sh_degree=None,
                          packed=True, rasterize_mode="classic", camera_model="pinhole", radial_coeffs=None,
                          tangential_coeffs=None, with_ut=False, with_eval3d=False):
    """gsplat 1.5.3's ``rasterization`` keywords the benchmarks pass, rendered by arc_warp."""
    from arc_warp_torch import rasterization

    return rasterization(means, quats, scales, opacities, colors, viewmats, Ks, width, height, sh_degree=sh_degree,
                         rasterize_mode=rasterize_mode, camera_model=camera_model, radial_coeffs=radial_coeffs,
                         tangential_coeffs=tangential_coeffs)


class _FasterGSSettings:
    def __init__(self, **fields):
        self.__dict__.update(fields)


def _fastergs_rasterize(means, log_scales, quats, logit_opacities, sh0, sh_rest, densification, s):
    """Faster-GS's ``diff_rasterize``: raw parameters, SH split in two, opacities [N, 1], one
    camera, a [3, H, W] image."""
    from arc_warp_torch import rasterization

    assert densification.numel() == 0 and logit_opacities.shape[1] == 1 and sh0.shape[1] == 1
    ks = torch.tensor([[s.focal_x, 0.0, s.center_x], [0.0, s.focal_y, s.center_y], [0.0, 0.0, 1.0]])
    image = rasterization(means, quats, log_scales, logit_opacities[:, 0], torch.cat([sh0, sh_rest], 1),
                          s.w2c[None].cpu(), ks[None], s.width, s.height, near_plane=s.near_plane,
                          far_plane=s.far_plane, scales_activation="exp", opacities_activation="sigmoid")[0]
    return image[0].permute(2, 0, 1)


class _FusedAdam(torch.optim.Adam):
    pass


@pytest.fixture
def stand_ins(monkeypatch):
    """gsplat, Faster-GS's torch bindings and nvdiffrast.torch, as stand-ins; Warp's event
    wait restored after the test (train_step wraps it to time the waits)."""
    import arc_warp_torch.mesh

    gsplat = types.ModuleType("gsplat")
    gsplat.__version__ = "0.0-standin"
    gsplat.rasterization = _gsplat_rasterization
    bindings = types.ModuleType("FasterGSCudaBackend.torch_bindings")
    bindings.RasterizerSettings, bindings.diff_rasterize, bindings.FusedAdam = (
        _FasterGSSettings, _fastergs_rasterize, _FusedAdam)
    for name, module in (("gsplat", gsplat), ("FasterGSCudaBackend", types.ModuleType("FasterGSCudaBackend")),
                         ("FasterGSCudaBackend.torch_bindings", bindings),
                         ("nvdiffrast", types.ModuleType("nvdiffrast")), ("nvdiffrast.torch", arc_warp_torch.mesh)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(wp, "synchronize_event", wp.synchronize_event)


# ------------------------------------------------------------------ smoke runs

# rows each smoke run must hold, by what tells them apart: the stand-ins' rows included
EXPECTED = {
    "splat": lambda rows: {"gsplat", "gsplat_packed", "arc", "floor"} <= set(rows[0]),
    "train_step": lambda rows: {r["library"] for r in rows} == {"arc_fused", "gsplat-0.0-standin", "fastergs"},
    "captured_step": lambda rows: {r["library"] for r in rows} == {"arc_fused", "gsplat-0.0-standin", "fastergs"},
    "memory": lambda rows: {r["library"] for r in rows} == {"arc_fused", "gsplat-0.0-standin"},
    "cameras": lambda rows: {(r["model"], r["library"]) for r in rows} == {
        (m, lib) for m in ("pinhole", "ortho", "fisheye", "pinhole_distorted") for lib in ("arc", "gsplat")},
    "hybrid": lambda rows: [r["case"] for r in rows] == ["plain", "hybrid"],
    "mesh": lambda rows: {r["workload"] for r in rows} == {"tex_mag", "tex_min", "interp", "raster", "chain"}
    and all(r["grad_cosine"] > 0.9999 and r["max_abs_image_diff"] < 1e-6 for r in rows if r["variant"] == "nvdiffrast")
    and sum(r["variant"] == "nvdiffrast" for r in rows) == 5
    and sum("grad_cosine_unclamped" in r for r in rows) == 2,  # raster and chain
    "mesh_coverage": lambda rows: len(rows) == 9 and all(r["id_mismatches"] == 0 for r in rows),
    "sensor": lambda rows: {"batched_fwd", "separate_fwd_bwd", "composite_fwd", "plain_fwd_bwd"} <= set(rows[0]),
    "arc_autodiff": lambda rows: [r["scenario"] for r in rows] == ["p2g_sorted", "p2g_shuffled", "cloth", "splat"],
    "arc_micro": lambda rows: {r["path"] for r in rows} == {"uniform", "general"} and len(rows) == 10,
    "multi_gpu": lambda rows: [r["gpus"] for r in rows] == [1],
    "host": lambda rows: len(rows) == 1 and rows[0]["forward_us"] > 0,
    "train": lambda rows: rows[0]["trainer"] == "arc-warp" and rows[0]["step"] == 3,
    "profile": lambda rows: any(r["kind"] == "host" for r in rows),
    "sanitize": lambda rows: [r["mode"] for r in rows] == ["arc", "deterministic"],
}


def _numbers(value) -> list[float]:
    """Every number in a result row, nested dicts and lists included."""
    if isinstance(value, dict):
        return [x for v in value.values() for x in _numbers(v)]
    if isinstance(value, list):
        return [x for v in value for x in _numbers(v)]
    return [value] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


def test_every_benchmark_has_a_smoke_expectation():
    assert set(EXPECTED) == set(cli.BENCHMARKS)


@pytest.mark.parametrize("name", cli.BENCHMARKS)
def test_smoke_run_writes_its_result(name, tmp_path, stand_ins, capsys):
    before = sorted(p.name for p in results.RESULTS.iterdir())
    assert cli.main([name, "--smoke", "--out", str(tmp_path)]) == 0
    record = results.load(tmp_path / f"{name}.json")
    assert record["smoke"] is True and record["benchmark"] == name and record["rows"]
    assert record["command"] == f"python -m benchmarks {name} --smoke --out {tmp_path}"
    assert record["commit"] != "unknown" and record["date"][:2] == "20"
    assert EXPECTED[name](record["rows"]), record["rows"]
    assert all(math.isfinite(x) for x in _numbers(record["rows"]))
    out = capsys.readouterr().out
    assert module_table(name, record) in out  # the table printed is the report's
    assert sorted(p.name for p in results.RESULTS.iterdir()) == before  # nothing written in results/


def module_table(name, record):
    import importlib

    return importlib.import_module(f"benchmarks.{name}").table(record)


def test_stand_in_peers_agree_with_arc(tmp_path, stand_ins):
    # the stand-ins render through arc_warp, so the agreement checks must find agreement:
    # wrong layouts (Faster-GS's split SH, its [N, 1] opacities) or parameters swapped show here
    assert cli.main(["train_step", "--smoke", "--check-peers", "--libs", "arc", "gsplat", "fastergs",
                     "--out", str(tmp_path)]) == 0
    check = results.load(tmp_path / "train_step.json")["check"]
    assert set(check) == {"gsplat-0.0-standin", "fastergs"}
    for name, c in check.items():
        assert c["max_abs_image_diff"] < 1e-5, name
        assert all(c[f"cos_{k}"] > 0.9999 for k in ("means", "quats", "log_scales", "logit_opacities", "sh")), (name, c)
    assert cli.main(["splat", "--smoke", "--modes", "arc", "--out", str(tmp_path)]) == 0
    row = results.load(tmp_path / "splat.json")["rows"][0]
    assert row["psnr_vs_gsplat"] is None  # identical images
    assert min(row["grad_cosine_vs_gsplat"].values()) > 0.9999


def test_absent_peer_is_a_note():
    module, note = peers.optional("no_such_peer_module")
    assert module is None and "no_such_peer_module not importable" in note


# ------------------------------------------------------------------ the listing


def test_help_lists_every_benchmark_module():
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--help"], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    listed = [line.split()[0] for line in proc.stdout.split("benchmarks:\n")[1].splitlines() if line.strip()]
    shared = {"__init__", "__main__", "cli", "peers", "results", "scene", "timing"}
    modules = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.stem not in shared)
    assert sorted(listed) == modules
    assert all(cli.summary(name) in proc.stdout for name in listed)


def test_listing_and_report_load_no_torch_nor_plugins():
    code = ("import sys\nfrom benchmarks import cli, report, results\ncli.listing()\nreport.render(results.RESULTS)\n"
            "print(sorted(m for m in ('torch', 'newton', 'arc_warp_torch', 'arc_warp_newton') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_no_path_edits_in_benchmarks():
    assert not [p for p in (ROOT / "benchmarks").rglob("*.py") if "sys.path" in p.read_text()]


# ------------------------------------------------------------------ the report


def _record(name, rows, source=results.MEASURED, **extra):
    return {"benchmark": name.split("-")[0], "command": f"python -m benchmarks {name.split('-')[0]} --n 1",
            "device": "NVIDIA H200", "commit": "abc1234", "date": "2026-12-05", "versions": {}, "source": source,
            "smoke": False, "notes": [f"note of {name}"], "rows": rows, **extra}


def _fixtures(folder: pathlib.Path, **overrides) -> None:
    splat_row = {"n": 1_000_000, "regime": "shrink", "intersections": 4_000_000,
                 "atomic": {"forward_ms": 2.0, "backward_ms": 20.0}, "arc": {"forward_ms": 2.0, "backward_ms": 3.0},
                 "floor": {"forward_ms": 2.0, "backward_ms": 2.5}, "gsplat": {"forward_ms": 2.5, "backward_ms": 4.0},
                 "gsplat_packed": {"forward_ms": 3.0, "backward_ms": 5.0}}
    step = {"n": 300_000, "regime": "small", "cameras": 1}
    records = {
        "splat": _record("splat", [splat_row], threshold=4),
        "train_step": _record("train_step", [
            dict(step, library="arc_fused", forward_ms=0.5, backward_ms=1.0, step_torch_adam_ms=2.0,
                 step_fused_adam_ms=1.5, peak_mib=380.0),
            dict(step, library="gsplat-1.5.3", forward_ms=1.25, backward_ms=1.6, step_torch_adam_ms=4.0,
                 peak_mib=400.0),
            dict(step, library="fastergs", forward_ms=0.4, backward_ms=2.0, step_fastergs_adam_ms=2.5)]),
        "train_step-old": _record("train_step-old", [dict(step, library="arc_fused", forward_ms=9.0, backward_ms=9.0)],
                                  source="0.11.0 (seeded)"),
        "mesh": _record("mesh", [{"workload": "chain", "variant": "arc_warp arc", "forward_device_ms": 0.3,
                                  "backward_device_ms": 0.45},
                                 {"workload": "chain", "variant": "nvdiffrast", "forward_device_ms": 0.5,
                                  "backward_device_ms": 0.5, "grad_cosine": 0.999998}]),
        "host": _record("host", [{"tree": "/base", "commit": "b", "forward_us": 400.0, "backward_us": 300.0},
                                 {"tree": ".", "commit": "c", "forward_us": 300.0, "backward_us": 330.0}],
                        n=2000, width=64, height=48, reps=300),
    }
    records.update(overrides)
    for name, record in records.items():
        (folder / f"{name}.json").write_text(json.dumps(record))


# the golden structure: section titles, in order, each with its command and table header
GOLDEN = [
    ("The splat kernels per reduce mode (GaussianRenderer.forward/backward) against gsplat and gswarp",
     "`python -m benchmarks splat --n 1`",
     "| N | regime | intersections | variant | fwd ms | bwd ms | bwd ÷ atomic | bwd ÷ floor | fwd ÷ best gsplat | "
     "bwd ÷ best gsplat |"),
    ("Forward, backward and training step through the torch API: arc_warp against gsplat and Faster-GS",
     "`python -m benchmarks train_step --n 1`",
     "| N | regime | C | library | fwd ms | bwd ms | step ms (torch Adam) | step ms (own optimizer) | loop ms/step | "
     "host ms | in arc_warp, less waits, ms | peak MiB | fwd ÷ gsplat | bwd ÷ gsplat | step ÷ gsplat | peak ÷ gsplat | "
     "fwd ÷ Faster-GS | bwd ÷ Faster-GS | own step ÷ Faster-GS | fwd / bwd ms, host hidden |"),
    ("The mesh ops (rasterize, interpolate, texture, antialias) per reduce mode, against nvdiffrast 0.4",
     "`python -m benchmarks mesh --n 1`",
     "| workload | variant | fwd ms (call) | bwd ms (call) | fwd ms (device) | bwd ms (device) | "
     "fwd device ÷ nvdiffrast | bwd device ÷ nvdiffrast | bwd call ÷ nvdiffrast | "
     "gradient cosine to arc (off the clamp) |"),
    ("Host (Python) time of an eager torch step with no-op kernels, on the CPU: source trees compared",
     "`python -m benchmarks host --n 1`",
     "| tree | forward µs | backward µs | forward ÷ first tree | backward ÷ first tree |"),
]


def _row(text: str, *first: str) -> list[str]:
    """The cells of the first table row of ``text`` that starts with the cells ``first``."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[:len(first)] == list(first):
            return cells
    raise AssertionError(f"no row starting {first}")


def test_report_matches_the_golden_structure(tmp_path):
    _fixtures(tmp_path)
    text = report.render(tmp_path)
    assert text.startswith(report.HEADER)
    titles = [line[3:] for line in text.splitlines() if line.startswith("## ")]
    assert titles == [g[0] for g in GOLDEN]  # the seeded train_step-old is replaced by the measured one
    sections = text.split("\n## ")[1:]
    for (title, command, header), body in zip(GOLDEN, sections):
        lines = body.splitlines()
        assert lines[0] == title and lines[2] == command and header in lines
        assert lines[4] == "NVIDIA H200, commit `abc1234`, 2026-12-05."
    # ratio columns: ours ÷ the peer
    # bwd ÷ atomic, ÷ floor; fwd and bwd ÷ the best gsplat (the unpacked one)
    assert _row(text, "1M", "shrink", "4000000", "arc")[6:] == ["0.15", "1.20", "0.80", "0.75"]
    # fwd, bwd, step, peak ÷ gsplat; fwd, bwd ÷ Faster-GS; SparseGaussianAdam's step ÷ Faster-GS's own
    assert _row(text, "300k", "small", "1", "arc_fused")[12:19] == ["0.40", "0.62", "0.50", "0.95", "1.25", "0.50",
                                                                     "0.60"]
    assert "| chain | arc_warp arc | - | - | 0.300 | 0.450 | 0.60 | 0.90 | - | - |" in text
    assert "| `.` (c) | 300.0 | 330.0 | 0.75 | 1.10 |" in text
    assert "No result yet: `captured_step`, `memory`" in text and text.count("\n") <= report.MAX_LINES


def test_report_keeps_seeds_until_measured_and_refuses_smoke(tmp_path):
    seeded = "0.11.0 (seeded)"
    _fixtures(tmp_path, train_step=_record("train_step", [{"n": 1, "regime": "small", "cameras": 1,
                                                           "library": "arc_fused", "forward_ms": 1.0,
                                                           "backward_ms": 1.0}], source=seeded))
    text = report.render(tmp_path)
    assert "(old)" in text and f"figures from {seeded}" in text  # both seeded: both shown
    smoke = _record("splat", [{"n": 1}])
    smoke["smoke"] = True
    (tmp_path / "splat.json").write_text(json.dumps(smoke))
    with pytest.raises(ValueError, match="a --smoke result"):
        report.render(tmp_path)


def test_report_refuses_more_than_max_lines(tmp_path):
    rows = [{"tree": f"t{i}", "commit": "c", "forward_us": 1.0, "backward_us": 1.0} for i in range(report.MAX_LINES)]
    (tmp_path / "host.json").write_text(json.dumps(_record("host", rows, n=1, width=1, height=1, reps=1)))
    with pytest.raises(ValueError, match="over 400"):
        report.render(tmp_path)


def test_benchmarks_md_is_the_report_of_the_committed_results():
    text = report.render(results.RESULTS)
    assert (ROOT / "BENCHMARKS.md").read_text() == text
    assert text.count("\n") <= report.MAX_LINES


# ------------------------------------------------------------------ CUDA-only parts, checked on their inputs


def test_peaks_from_trace_finds_each_phases_live_blocks():
    frames = [{"filename": "/x/arc_warp/render.py", "line": 3, "name": "f"}]
    events = [{"action": "alloc", "addr": 1, "size": 100, "frames": frames},       # before the step: still live
              {"action": "alloc", "addr": 2, "size": 50, "frames": []},            # forward
              {"action": "alloc", "addr": 3, "size": 70, "frames": []},
              {"action": "free_completed", "addr": 2},
              {"action": "alloc", "addr": 4, "size": 10, "frames": []},            # Adam
              {"action": "free_completed", "addr": 3},
              {"action": "alloc", "addr": 5, "size": 5, "frames": []}]
    peaks = memory.peaks_from_trace(events, start=1, mid=4, end=7)
    assert peaks["forward+backward"][0] == 220 and peaks["adam"][0] == 180
    assert peaks["forward+backward"][1] == {"render.py:3:f": [100, 1], "(torch internals)": [120, 2]}
    assert peaks["adam"][1]["(torch internals)"] == [80, 2]


def test_inria_record_reads_the_last_test_line_and_the_ply(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("[ITER 3000] Evaluating test: L1 0.05 PSNR 25.5\n[ITER 7000] Evaluating test: L1 0.03 PSNR 31.25\n")
    ply = tmp_path / "point_cloud" / "iteration_7000" / "point_cloud.ply"
    ply.parent.mkdir(parents=True)
    ply.write_bytes(b"ply\nformat binary_little_endian 1.0\nelement vertex 1234\nend_header\n\x00\x01")
    record = train.inria_record("inria", str(tmp_path), str(log), 93.8)
    assert (record["step"], record["psnr"], record["gaussians"]) == (7000, 31.25, 1234)
