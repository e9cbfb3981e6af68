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
    from arc_warp.cli import _orbit_eyes
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
    eye = next(_orbit_eyes(center, radius, (0, 0, 1), 2, 25.0, 40.0, None))
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
