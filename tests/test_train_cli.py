"""`arc-warp train` / `demo` as a new user meets them: a real COLMAP binary model with
distorted cameras trained with no conversion, and every wrong input refused in one line
before the first training step (output folder, --resume, --device), Ctrl-C saving a
checkpoint and printing the command that resumes it, --gpus workers dying with their
launcher, and the CPU time warning."""

import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="arc-warp train needs torch")
pytest.importorskip("PIL", reason="arc-warp train needs pillow (arc-warp[app])")
pytest.importorskip("tqdm", reason="arc-warp train needs tqdm (arc-warp[app])")
pytest.importorskip("matplotlib", reason="arc-warp train needs matplotlib (arc-warp[app])")

from arc_warp.cli import main  # noqa: E402
from arc_warp_train import trainer as trainer_module  # noqa: E402
from arc_warp_train.synthetic import make_synthetic_dataset  # noqa: E402

TINY = ["--init-points", "30", "--eval-every", "2", "--device", "cpu", "--threads", "1",
        "--no-progress", "--white-background"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    make_synthetic_dataset(str(root), num_train=2, num_test=1, width=16, height=16,
                           num_gaussians=40, device="cpu")
    return str(root)


@pytest.fixture(scope="module")
def checkpoint(data, tmp_path_factory):
    """A finished SH-degree-1 run on `data` -> its checkpoint.pt."""
    out = tmp_path_factory.mktemp("run")
    assert main(["train", data, "-o", str(out), "--steps", "2", "--sh-degree", "1"] + TINY) == 0
    return str(out / "checkpoint.pt")


@pytest.fixture
def no_steps(monkeypatch):
    """Fail the test if a training step runs (errors must come first)."""
    def step(self):
        raise AssertionError("a training step ran before the error")

    monkeypatch.setattr(trainer_module.Trainer, "train_step", step)


def _one_line_error(capsys, code, *expected):
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and all(text in lines[0] for text in expected), err


def test_train_colmap_binary_simple_radial_no_conversion(tmp_path, capsys):
    pytest.importorskip("pycolmap", reason="COLMAP models need pycolmap (arc-warp[colmap])")
    from test_datasets import _colmap_scene

    _colmap_scene(tmp_path / "scene")  # sparse/0/*.bin, SIMPLE_RADIAL, 9 images
    assert not list((tmp_path / "scene").rglob("*.txt"))
    out = tmp_path / "out"
    code = main(["train", str(tmp_path / "scene"), "-o", str(out), "--steps", "3",
                 "--eval-every", "3", "--sh-degree", "0", "--device", "cpu", "--threads", "1",
                 "--no-progress"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "7 train / 2 test views" in printed and "final test-view PSNR" in printed
    for name in ("point_cloud.ply", "metrics.json", "checkpoint.pt"):
        assert (out / name).is_file(), name


@pytest.mark.parametrize("case", ["under /proc", "names a file", "read-only folder"])
def test_bad_output_folder_fails_before_training(case, data, tmp_path, capsys, no_steps):
    if case == "under /proc":
        out = "/proc/x"
    elif case == "names a file":
        out = str(tmp_path / "file")
        open(out, "w").close()
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into read-only folders")
        out = str(tmp_path / "ro")
        os.mkdir(out, 0o555)
    code = main(["train", data, "-o", out, "--steps", "5"] + TINY)
    _one_line_error(capsys, code, f"-o {out}")


def _truncated(ckpt, tmp_path):
    path = tmp_path / "trunc.pt"
    path.write_bytes(open(ckpt, "rb").read()[:5000])
    return str(path)


def _text(ckpt, tmp_path):
    path = tmp_path / "notes.pt"
    path.write_text("not a checkpoint\n")
    return str(path)


RESUME_ERRORS = {
    "truncated file": (_truncated, [], "not a readable checkpoint"),
    "text file": (_text, [], "not a readable checkpoint"),
    "folder": (lambda ckpt, tmp: os.path.dirname(ckpt), [], "is a folder"),
    "missing file": (lambda ckpt, tmp: str(tmp / "nope.pt"), [], "no such file"),
    "other SH degree": (lambda ckpt, tmp: ckpt, ["--sh-degree", "3"],
                        "was trained with --sh-degree 1"),
    "lower SH degree": (lambda ckpt, tmp: ckpt, ["--sh-degree", "0"],
                        "pass --sh-degree 1 to resume it"),
    "other dataset": (lambda ckpt, tmp: ckpt, ["--sh-degree", "1", "OTHER"],
                      "was trained on another dataset (it has 2 training views, this one 3)"),
    "other --downscale": (lambda ckpt, tmp: ckpt, ["--sh-degree", "1", "--downscale", "2"],
                          "at 16x16 pixels, this run loads it at 8x8 (--downscale 2); pass "
                          "--downscale 1, or drop --resume"),
    "--steps below its step": (lambda ckpt, tmp: ckpt, ["--sh-degree", "1", "--steps", "1"],
                               "is at step 2, past --steps 1; pass --steps 3 or more"),
}


@pytest.mark.parametrize("case", list(RESUME_ERRORS))
def test_resume_checked_before_training(case, checkpoint, data, tmp_path, capsys, no_steps):
    make_path, extra, expected = RESUME_ERRORS[case]
    path = make_path(checkpoint, tmp_path)
    dataset = data
    if "OTHER" in extra:
        extra = extra[:-1]
        dataset = str(tmp_path / "other")
        make_synthetic_dataset(dataset, num_train=3, num_test=1, width=16, height=16,
                               num_gaussians=40, device="cpu")
    if not extra:
        extra = ["--sh-degree", "1"]
    code = main(["train", dataset, "-o", str(tmp_path / "o"), "--steps", "4", "--resume", path]
                + extra + TINY)
    _one_line_error(capsys, code, f"--resume {path}", expected)
    capsys.readouterr()


def test_resume_at_its_last_step_says_so_and_writes_the_outputs(checkpoint, data, tmp_path,
                                                                 capsys, no_steps):
    out = tmp_path / "o"
    assert main(["train", data, "-o", str(out), "--steps", "2", "--sh-degree", "1",
                 "--resume", checkpoint] + TINY) == 0
    err = capsys.readouterr().err
    assert f"note: --resume {checkpoint} is already at step 2 = --steps; nothing is left to " \
        "train" in err and "pass a larger --steps to train on" in err
    assert (out / "point_cloud.ply").is_file() and (out / "metrics.json").is_file()


def test_ctrl_c_during_start_up_is_one_line(data, tmp_path):
    script = textwrap.dedent(f"""
        import os, signal, sys, time
        import arc_warp_train.datasets as datasets

        def load_dataset(*args, **kwargs):  # Ctrl-C while the images load
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)

        datasets.load_dataset = load_dataset
        from arc_warp.cli import main
        sys.exit(main(["train", {data!r}, "-o", {str(tmp_path / "o")!r}, "--device", "cpu"]))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "arc-warp train: interrupted", proc.stderr


def test_ctrl_c_saves_checkpoint_and_prints_resume_command(data, tmp_path, capsys,
                                                           monkeypatch):
    step = trainer_module.Trainer.train_step

    def interrupting_step(self):
        out = step(self)
        if self.step == 2:
            os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C in the terminal
        return out

    monkeypatch.setattr(trainer_module.Trainer, "train_step", interrupting_step)
    os.makedirs(tmp_path / "o")
    (tmp_path / "o" / "metrics.json").write_text("{}")  # of an earlier run: --overwrite
    argv = ["train", data, "-o", str(tmp_path / "o"), "--steps", "6", "--sh-degree", "1",
            "--overwrite"] + TINY
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert "interrupted at step 2" in err and "Traceback" not in err
    command = err.split("resume with: ", 1)[1].strip()
    ckpt = str(tmp_path / "o" / "checkpoint.pt")
    assert command.endswith(f"--resume {ckpt}")
    state = torch.load(ckpt, weights_only=True)
    assert state["step"] == 2

    monkeypatch.setattr(trainer_module.Trainer, "train_step", step)
    words = shlex.split(command)
    assert words[0] == "arc-warp" and "--overwrite" not in words  # it would delete ckpt
    assert main(words[1:]) == 0
    assert torch.load(ckpt, weights_only=True)["step"] == 6


def test_device_cuda_without_cuda_is_one_line(data, tmp_path, capsys, no_steps):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    code = main(["train", data, "-o", str(tmp_path / "o"), "--steps", "2", "--device", "cuda"])
    _one_line_error(capsys, code, "--device cuda: torch finds no CUDA device")


@pytest.mark.parametrize("which", ["scene", "image"])
def test_demo_checks_output_before_fitting(which, capsys, monkeypatch):
    import arc_warp_train.demo as demo
    import arc_warp_train.image_fit as image_fit

    def fail(*a, **k):
        raise AssertionError("the demo ran before the output check")

    monkeypatch.setattr(demo, "run_demo", fail)
    monkeypatch.setattr(image_fit, "run_image_demo", fail)
    code = main(["demo", which, "-o", "/proc/x", "--device", "cpu"])
    _one_line_error(capsys, code, "-o /proc/x: cannot write there")


def test_demo_refuses_an_earlier_runs_folder_before_fitting(tmp_path, capsys, monkeypatch):
    import arc_warp_train.demo as demo

    def fail(*a, **k):
        raise AssertionError("the demo ran before the output check")

    monkeypatch.setattr(demo, "run_demo", fail)
    (tmp_path / "point_cloud.ply").write_bytes(b"an earlier run's")
    code = main(["demo", "-o", str(tmp_path), "--device", "cpu"])
    _one_line_error(capsys, code, f"-o {tmp_path} holds an earlier run's results "
                    "(point_cloud.ply); pass --overwrite to delete them first")


def test_cpu_run_warns_with_time_estimate(data, tmp_path, capsys, monkeypatch):
    from arc_warp_train import commands

    # Pretend the CPU is slow, so this tiny run costs hours.
    monkeypatch.setattr(commands, "CPU_S_PER_PIXEL", 1.0)
    assert main(["train", data, "-o", str(tmp_path / "o"), "--steps", "20", "--eval-every",
                 "20", "--init-points", "30", "--device", "cpu", "--threads", "1",
                 "--no-progress", "--sh-degree", "0"]) == 0
    err = capsys.readouterr().err
    # 20 steps x 256 pixels x 1 s = 5120 s
    assert "warning: training on the CPU; 20 steps at this image size would take roughly 1 h" \
        in err


def test_cpu_time_estimate_grows_with_pixels_and_steps():
    from types import SimpleNamespace

    from arc_warp_train.commands import CPU_S_PER_GAUSSIAN, CPU_S_PER_PIXEL, cpu_time_estimate

    views = [SimpleNamespace(width=800, height=800)] * 3
    est = cpu_time_estimate(SimpleNamespace(train=views), 30000, 1, 100_000)
    assert est == pytest.approx(30000 * (640000 * CPU_S_PER_PIXEL + 100_000 * CPU_S_PER_GAUSSIAN))
    assert est > 3600  # the GPU-sized defaults are hours on a CPU


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
def test_gpus_workers_die_with_a_killed_launcher(tmp_path):
    script = textwrap.dedent(f"""
        import os, sys, time
        from arc_warp_train.distributed import launch

        def work(folder):
            open(os.path.join(folder, str(os.getpid())), "w").close()
            time.sleep(120)

        if __name__ == "__main__":
            launch(work, 2, ({str(tmp_path)!r},))
    """)
    (tmp_path / "launcher.py").write_text(script)
    # As a background job of a script: SIGINT ignored, which defeats torch's own
    # parent-death SIGINT, so only our SIGTERM can take the workers down.
    launcher = subprocess.Popen([sys.executable, str(tmp_path / "launcher.py")],
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        pids = _wait_for(lambda: [int(p) for p in os.listdir(tmp_path) if p.isdigit()],
                         lambda found: len(found) == 2 or launcher.poll() is not None)
        assert len(pids) == 2, "workers did not start"
        launcher.kill()  # SIGKILL: the launcher cannot clean up after itself
        launcher.wait()
        alive = _wait_for(lambda: [p for p in pids if _alive(p)], lambda found: not found)
        assert not alive, f"workers {alive} outlived their launcher"
    finally:
        for p in [int(p) for p in os.listdir(tmp_path) if p.isdigit()]:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


def _wait_for(probe, done, seconds=60.0):
    """Poll probe() until done(result) or `seconds` pass (workers import torch: slow)."""
    deadline = time.monotonic() + seconds
    result = probe()
    while not done(result) and time.monotonic() < deadline:
        time.sleep(0.1)
        result = probe()
    return result


def _alive(pid) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_outputs_full_size_labelled_with_per_view_metrics(data, tmp_path):
    import json

    from PIL import Image

    from arc_warp_train.datasets import load_nerf_synthetic
    from arc_warp_train.losses import psnr
    from arc_warp_train.outputs import ERROR_GAIN, MIN_PANEL_WIDTH

    out = tmp_path / "o"
    assert main(["train", data, "-o", str(out), "--steps", "2", "--sh-degree", "0"] + TINY) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    dataset = load_nerf_synthetic(data, background=(1.0, 1.0, 1.0))
    assert [v["name"] for v in metrics["views"]] == [v.name for v in dataset.test]
    assert np.mean([v["psnr"] for v in metrics["views"]]) == pytest.approx(metrics["psnr"])
    assert np.mean([v["ssim"] for v in metrics["views"]]) == pytest.approx(metrics["ssim"])

    image = np.asarray(Image.open(out / "test_views" / metrics["views"][0]["image"]),
                       np.float32) / 255.0
    truth = dataset.test[0].image
    scale = -(-MIN_PANEL_WIDTH // truth.shape[1])  # 16 px views are enlarged 6x
    h, w = truth.shape[0] * scale, truth.shape[1] * scale
    assert image.shape == (14 + h, 3 * w + 4, 3)
    panels = [image[14:, k * (w + 2):k * (w + 2) + w] for k in range(3)]
    # Panel 0 is the ground truth at full resolution (each pixel a scale x scale block).
    np.testing.assert_allclose(panels[0][::scale, ::scale], truth, atol=0.5 / 255 + 1e-6)
    # Panel 2 is the error of panel 1 against panel 0, and the label strip has ink.
    err = np.clip(ERROR_GAIN * np.abs(panels[1] - panels[0]).mean(-1), 0, 1)
    np.testing.assert_allclose(panels[2][..., 0], err, atol=ERROR_GAIN * 1.5 / 255)
    assert image[:14].min() < 0.5
    # The PSNR written for the view is the PSNR of the rendered panel.
    import torch as t

    got = psnr(t.as_tensor(panels[1][::scale, ::scale])[None], t.as_tensor(truth)[None])
    assert got == pytest.approx(metrics["views"][0]["psnr"], abs=0.05)  # 8-bit rounding
