"""`arc-warp` command line: help for every subcommand, a tiny render, bench, errors."""

import os
import subprocess
import sys
import zlib

import numpy as np
import pytest

from arc_warp.cli import main
from arc_warp.ply import GaussianPly, write_ply

SUBCOMMANDS = ("render", "train", "bench", "demo")


def _read_png_rgb(path) -> np.ndarray:
    """Decode the 8-bit RGB, filter-0 PNGs that the CLI writes (no pillow needed)."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, size = 8, b"", None
    while pos < len(data):
        length = int.from_bytes(data[pos:pos + 4], "big")
        tag, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if tag == b"IHDR":
            size = (int.from_bytes(body[4:8], "big"), int.from_bytes(body[:4], "big"))
        elif tag == b"IDAT":
            idat += body
        pos += 12 + length
    rows = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(size[0], 1 + 3 * size[1])
    assert np.all(rows[:, 0] == 0)
    return rows[:, 1:].reshape(size[0], size[1], 3)


def _tiny_ply(path, rng, n=40):
    means = rng.normal(0.0, 0.4, (n, 3))
    sh = rng.normal(0.0, 0.5, (n, 4, 3))
    write_ply(path, GaussianPly.from_activated(means, rng.normal(size=(n, 4)),
                                               rng.uniform(0.05, 0.15, (n, 3)),
                                               rng.uniform(0.5, 0.9, n), sh))


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_help_for_each_subcommand(command, capsys):
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: arc-warp {command}")


def test_top_level_help_lists_subcommands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for command in SUBCOMMANDS:
        assert command in out


def test_render_tiny_ply_matches_library_render(tmp_path, rng):
    import warp as wp

    from arc_warp import Camera, RenderSettings, render_gaussians
    from arc_warp.ply import read_ply

    ply = tmp_path / "tiny.ply"
    _tiny_ply(ply, rng)
    out = tmp_path / "out.png"
    code = main(["render", str(ply), "-o", str(out), "--width", "24", "--height", "16",
                 "--views", "2", "--device", "cpu", "--background", "0.1,0.2,0.3"])
    assert code == 0
    paths = [tmp_path / "out_000.png", tmp_path / "out_001.png"]
    images = [_read_png_rgb(p) for p in paths]
    assert images[0].shape == (16, 24, 3)
    assert not np.array_equal(images[0], images[1])  # two different viewpoints

    # The PNG is the library render of the same camera, quantised to 8 bits.
    g = read_ply(ply).activated()
    center = np.median(g["means"], axis=0).astype(float)
    radius = float(np.quantile(np.linalg.norm(g["means"] - center, axis=1), 0.9))
    # View 0: azimuth 0 along x (the axis least aligned with up z), 25 degrees up, at the
    # distance that fits the 90 % radius (x 1.15) in the 40 degree field of view.
    dist = 1.15 * radius / np.sin(np.radians(20.0))
    eye = center + dist * np.array([np.cos(np.radians(25.0)), 0.0, np.sin(np.radians(25.0))])
    cam = Camera.look_at(eye, center, (0, 0, 1), 40.0, 24, 16)
    with wp.ScopedDevice("cpu"):
        arrays = [wp.array(g[k], dtype=t) for k, t in (
            ("means", wp.vec3), ("quats", wp.vec4), ("scales", wp.vec3),
            ("opacities", wp.float32), ("sh", wp.vec3))]
        ref = render_gaussians(*arrays, cam, RenderSettings(background=(0.1, 0.2, 0.3)))
    expected = (np.clip(ref.color.numpy(), 0, 1) * 255 + 0.5).astype(np.uint8)
    np.testing.assert_array_equal(images[0], expected)
    assert np.any(np.abs(images[0].astype(int) - [26, 51, 77]).sum(-1) > 30)  # not all background


def test_bench_tiny_run(capsys):
    code = main(["bench", "--num-gaussians", "30", "--width", "16", "--height", "16",
                 "--reps", "1", "--modes", "atomic,arc", "--device", "cpu"])
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines if line.split()[:1] in (["atomic"], ["arc"])]
    assert [r[0] for r in rows] == ["atomic", "arc"]
    assert all(float(r[1]) > 0 and float(r[2]) > 0 for r in rows)


def test_bad_ply_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "bad.ply"
    bad.write_bytes(b"not a ply")
    assert main(["render", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.ply" in err and "not a PLY file" in err


def test_bad_arguments_exit_with_usage(capsys):
    with pytest.raises(SystemExit) as info:
        main(["render", "x.ply", "--up", "1,2"])
    assert info.value.code == 2
    assert "3 comma-separated numbers" in capsys.readouterr().err


def _run(code: str):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120)


def test_render_and_bench_do_not_import_torch(tmp_path, rng):
    ply = tmp_path / "t.ply"
    _tiny_ply(ply, rng, n=10)
    proc = _run(
        "import sys\nfrom arc_warp.cli import main\n"
        f"assert main(['render', {str(ply)!r}, '-o', {str(tmp_path / 'r.png')!r}, "
        "'--width', '8', '--height', '8', '--device', 'cpu']) == 0\n"
        "assert main(['bench', '--num-gaussians', '10', '--width', '8', '--height', '8', "
        "'--reps', '1', '--modes', 'arc', '--device', 'cpu']) == 0\n"
        "assert 'torch' not in sys.modules, 'render/bench imported torch'\n")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("command", ["train", "demo"])
def test_missing_torch_prints_install_hint(command):
    # sys.modules[name] = None makes `import name` raise ImportError.
    proc = _run("import sys\nsys.modules['torch'] = None\nfrom arc_warp.cli import main\n"
                f"sys.exit(main([{command!r}] + (['data'] if {command!r} == 'train' else [])))\n")
    assert proc.returncode == 2
    assert "pip install -e '.[torch,app]'" in proc.stderr


def test_train_tiny_dataset(tmp_path, capsys):
    pytest.importorskip("torch", reason="arc-warp train needs torch")
    pytest.importorskip("PIL", reason="arc-warp train needs pillow (arc-warp[app])")
    from arc_warp_train.synthetic import make_synthetic_dataset

    data = tmp_path / "data"
    make_synthetic_dataset(str(data), num_train=2, num_test=1, width=16, height=16,
                           num_gaussians=40, device="cpu")
    out = tmp_path / "out"
    code = main(["train", str(data), "-o", str(out), "--steps", "4", "--init-points", "30",
                 "--sh-degree", "0", "--eval-every", "2", "--device", "cpu", "--threads", "1",
                 "--no-progress", "--white-background"])
    assert code == 0
    assert "final test-view PSNR" in capsys.readouterr().out
    for name in ("point_cloud.ply", "psnr.png", "metrics.json", "checkpoint.pt"):
        assert (out / name).is_file(), name


# ------------------------------------------------------------------ one-line errors


def _ply_with(path, rng, n=5, **overrides):
    """A tiny valid PLY with some raw fields replaced (e.g. a NaN); n=0: header only."""
    from arc_warp.ply import GaussianPly

    if n == 0:
        props = ["x", "y", "z", "f_dc_0", "f_dc_1", "f_dc_2", "opacity", "scale_0", "scale_1",
                 "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]
        path.write_text("ply\nformat binary_little_endian 1.0\nelement vertex 0\n"
                        + "".join(f"property float {p}\n" for p in props) + "end_header\n")
        return str(path)

    g = GaussianPly.from_activated(rng.normal(0, 0.3, (n, 3)), rng.normal(size=(n, 4)),
                                   np.full((n, 3), 0.1), np.full(n, 0.5),
                                   rng.normal(0, 0.5, (n, 4, 3)))
    for name, value in overrides.items():
        getattr(g, name)[...] = value(getattr(g, name)) if callable(value) else value
    write_ply(path, g)
    return str(path)


def _nan_at(array, index=(2, 1)):
    out = array.copy()
    out[index] = np.nan
    return out


RENDER_ERRORS = {
    # case: (extra argv after the PLY, the PLY's fault or None, text the error must contain)
    "negative distance": (["--distance", "-3"], None, "expected a finite number > 0, got '-3'"),
    "background above 1": (["--background", "2,2,2"], None, "must lie in [0, 1]"),
    "jpeg name": (["-o", "{tmp}/x.jpg"], None, "writes PNG images only"),
    "output is a folder": (["-o", "{tmp}"], None, "is a folder; give a file name"),
    "output under /proc": (["-o", "/proc/x/r.png"], None, "cannot write there"),
    "no CUDA": (["--device", "cuda"], None, "no CUDA device"),
    "zero vertices": ([], "empty", "holds no Gaussians (0 vertices)"),
    "NaN in a PLY": ([], "nan", "property scale_1 of vertex 2 is nan"),
    "NaN in f_rest": ([], "nan_rest", "property f_rest_"),
}


@pytest.mark.parametrize("case", list(RENDER_ERRORS))
def test_render_errors_are_one_line(case, tmp_path, rng, capsys):
    import warp as wp

    argv, fault, expected = RENDER_ERRORS[case]
    if case == "no CUDA" and wp.is_cuda_available():
        pytest.skip("this machine has CUDA")
    if case == "output under /proc" and not os.path.isdir("/proc"):
        pytest.skip("no /proc")
    ply = tmp_path / "s.ply"
    if fault == "empty":
        _ply_with(ply, rng, n=0)
    elif fault == "nan":
        _ply_with(ply, rng, log_scales=_nan_at)
    elif fault == "nan_rest":
        _ply_with(ply, rng, sh_rest=lambda a: _nan_at(a, (1, 0, 2)))
    else:
        _ply_with(ply, rng)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    try:
        code = main(["render", str(ply), "--width", "8", "--height", "8", "--device", "cpu"]
                    [:None if "--device" not in argv else -2] + argv)
    except SystemExit as exc:  # argparse rejects bad option values with usage + exit 2
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert expected in err, err
    # One line, after argparse's usage lines for a bad option value.
    assert "Traceback" not in err and expected in err.strip().splitlines()[-1]
    assert not list(tmp_path.glob("*.png")) and not list(tmp_path.glob("*.jpg"))


def test_bench_zero_vertex_ply_is_one_line(tmp_path, rng, capsys):
    ply = _ply_with(tmp_path / "e.ply", rng, n=0)
    assert main(["bench", "--ply", ply, "--device", "cpu"]) == 2
    assert "holds no Gaussians" in capsys.readouterr().err


def test_render_without_extension_writes_png(tmp_path, rng):
    ply = _ply_with(tmp_path / "s.ply", rng)
    assert main(["render", ply, "-o", str(tmp_path / "view"), "--width", "8", "--height", "8",
                 "--device", "cpu"]) == 0
    assert _read_png_rgb(tmp_path / "view.png").shape == (8, 8, 3)


@pytest.mark.parametrize("command,argv", [("train", ["data", "--steps", "abc"]),
                                          ("render", ["x.ply", "--views", "abc"]),
                                          ("demo", ["--steps", "abc"])])
def test_bad_integer_names_the_option_not_a_function(command, argv, capsys):
    with pytest.raises(SystemExit) as info:
        main([command] + argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "expected an integer >= 1, got 'abc'" in err and "positive_int" not in err


@pytest.mark.parametrize("command", ["train", "render", "bench", "demo"])
def test_help_shows_defaults(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: " in out
    if command == "train":
        assert "(default: 30000)" in out and "(default: arc_warp_train_out)" in out
