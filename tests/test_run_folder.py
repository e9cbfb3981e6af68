"""The output folder of `arc-warp train`: another run's results are refused unless
--resume or --overwrite says what to do with them, --overwrite deletes only what a run
writes, a lock keeps a second run out while the first lives (and not after it died),
temporaries of a killed run are cleaned, and a run killed at random moments leaves only
complete files, from which --resume carries on."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="arc-warp train needs torch")
PIL_Image = pytest.importorskip("PIL.Image", reason="arc-warp train needs pillow (arc-warp[app])")
pytest.importorskip("tqdm", reason="arc-warp train needs tqdm (arc-warp[app])")
pytest.importorskip("matplotlib", reason="arc-warp train needs matplotlib (arc-warp[app])")

from arc_warp.cli import main  # noqa: E402
from arc_warp.ply import read_ply  # noqa: E402
from arc_warp_train import trainer as trainer_module  # noqa: E402
from arc_warp_train.checkpoint import read_checkpoint  # noqa: E402
from arc_warp_train.synthetic import make_synthetic_dataset  # noqa: E402

LOCK_NAME = ".arc-warp-train.lock"


def _run_folder():
    """arc_warp_train.run_folder, imported by the tests of its own API only (the tests of
    the command line run against any version of it)."""
    from arc_warp_train import run_folder

    assert run_folder.LOCK_NAME == LOCK_NAME
    return run_folder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(
    [ROOT, os.path.join(ROOT, "plugins"), os.path.join(ROOT, "apps"),
     os.environ.get("PYTHONPATH", "")])}
TINY = ["--init-points", "30", "--eval-every", "2", "--sh-degree", "0", "--device", "cpu",
        "--threads", "1", "--no-progress"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    make_synthetic_dataset(str(root), num_train=2, num_test=1, width=16, height=16,
                           num_gaussians=40, device="cpu")
    return str(root)


@pytest.fixture
def no_steps(monkeypatch):
    """Fail the test if a training step runs (errors must come first)."""
    def step(self):
        raise AssertionError("a training step ran before the error")

    monkeypatch.setattr(trainer_module.Trainer, "train_step", step)


def _one_line_error(capsys, code, *expected):
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    for text in expected:
        assert text in lines[0], err


def _snapshot(folder):
    """{relative path: bytes} of every file under `folder`."""
    out = {}
    for base, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(base, name)
            out[os.path.relpath(path, folder)] = open(path, "rb").read()
    return out


def test_folder_of_another_run_is_refused_and_overwrite_deletes_only_its_files(
        data, tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["train", data, "-o", str(out), "--steps", "2"] + TINY) == 0
    # An earlier run's extra view image (it had more test views) and the user's own files.
    (out / "test_views" / "view_002.png").write_bytes(b"from an earlier run")
    (out / "notes.txt").write_text("mine")
    (out / "test_views" / "mine.png").write_bytes(b"mine too")
    before = _snapshot(out)
    capsys.readouterr()

    code = main(["train", data, "-o", str(out), "--steps", "3"] + TINY)
    _one_line_error(capsys, code, f"-o {out} holds an earlier run's results",
                    f"--resume {out / 'checkpoint.pt'}", "--overwrite")
    assert _snapshot(out) == before  # nothing touched

    assert main(["train", data, "-o", str(out), "--steps", "3", "--overwrite"] + TINY) == 0
    after = _snapshot(out)
    assert json.loads(after["metrics.json"])["step"] == 3
    assert torch.load(out / "checkpoint.pt", weights_only=True)["step"] == 3
    assert "test_views/view_002.png" not in after  # the earlier run's image is gone
    assert after["notes.txt"] == b"mine" and after["test_views/mine.png"] == b"mine too"
    assert sorted(after) == sorted(["checkpoint.pt", "point_cloud.ply", "metrics.json",
                                    "psnr.png", "test_views/view_000.png", "notes.txt",
                                    "test_views/mine.png"])


def test_resume_into_another_runs_folder_is_refused(data, tmp_path, capsys, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["train", data, "-o", str(a), "--steps", "2"] + TINY) == 0
    assert main(["train", data, "-o", str(b), "--steps", "2"] + TINY) == 0
    capsys.readouterr()

    def step(self):
        raise AssertionError("a training step ran before the error")

    monkeypatch.setattr(trainer_module.Trainer, "train_step", step)
    before = _snapshot(b)
    code = main(["train", data, "-o", str(b), "--steps", "4", "--resume",
                 str(a / "checkpoint.pt")] + TINY)
    _one_line_error(capsys, code, f"-o {b} holds another run's results",
                    f"continues the run in {a}")
    code = main(["train", data, "-o", str(a), "--steps", "4", "--overwrite", "--resume",
                 str(a / "checkpoint.pt")] + TINY)
    _one_line_error(capsys, code, "--overwrite would delete", "which --resume reads")
    assert _snapshot(b) == before


def _holder(folder, env=ENV):
    """A process that takes the lock of `folder` and sleeps; returns it once it holds it."""
    script = textwrap.dedent(f"""
        import sys, time
        from arc_warp_train.run_folder import FolderLock
        FolderLock.acquire({str(folder)!r})
        print("held", flush=True)
        time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_lock_held_by_a_live_process_and_freed_by_its_death(tmp_path):
    FolderLock = _run_folder().FolderLock
    proc = _holder(tmp_path)
    try:
        with pytest.raises(ValueError, match=rf"in use by another arc-warp run \(PID {proc.pid} "):
            FolderLock.acquire(str(tmp_path))
    finally:
        proc.kill()  # SIGKILL: it cannot remove its lock file
        proc.wait()
    assert (tmp_path / LOCK_NAME).exists()  # left behind, naming a dead PID
    with FolderLock.acquire(str(tmp_path)):
        owner = json.loads((tmp_path / LOCK_NAME).read_text())
        assert owner["pid"] == os.getpid()
    assert not (tmp_path / LOCK_NAME).exists()  # released: removed


def test_lock_file_naming_a_live_unrelated_pid_is_stale(tmp_path):
    # A PID reused by another process: alive, but it holds no lock on the file.
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": os.getppid(), "host": "here",
                                                  "started": "earlier"}))
    lock = _run_folder().FolderLock.acquire(str(tmp_path))
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    lock.release()


def test_lock_taken_on_the_file_that_is_there(tmp_path, monkeypatch):
    """The owner removes its lock file and unlocks it: a process that opened the old file
    and locks it after that must start again on the file now at the path."""
    run_folder = _run_folder()
    path = tmp_path / LOCK_NAME
    real, calls = run_folder._try_flock, []

    def racing_flock(fd):
        if not calls:  # the owner releases, another run creates a new lock file
            os.remove(path)
            path.write_text("")
        calls.append(fd)
        return real(fd)

    monkeypatch.setattr(run_folder, "_try_flock", racing_flock)
    with run_folder.FolderLock.acquire(str(tmp_path)) as lock:
        assert len(calls) == 2
        assert os.path.samestat(os.fstat(lock._fd), os.stat(path))


def test_file_system_without_locks_warns(tmp_path, monkeypatch, capsys):
    import errno
    import fcntl

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    _run_folder().FolderLock.acquire(str(tmp_path)).release()
    assert "cannot lock files" in capsys.readouterr().err


@pytest.mark.timeout(300)
def test_second_run_in_a_folder_in_use_is_refused(data, tmp_path, capsys, no_steps):
    out = tmp_path / "o"
    first = subprocess.Popen(
        [sys.executable, "-m", "arc_warp.cli", "train", data, "-o", str(out), "--steps",
         "100000", "--checkpoint-every", "1"] + TINY, env=ENV, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not (out / "checkpoint.pt").exists():
            assert first.poll() is None, first.stderr.read()
            assert time.monotonic() < deadline, "the first run wrote no checkpoint"
            time.sleep(0.1)
        code = main(["train", data, "-o", str(out), "--steps", "100000", "--resume",
                     str(out / "checkpoint.pt")] + TINY)
        _one_line_error(capsys, code, f"-o {out} is in use by another arc-warp run "
                        f"(PID {first.pid} ")
    finally:
        first.kill()
        first.wait()


def test_resume_in_place_replaces_results_and_drops_views_it_did_not_write(data, tmp_path):
    out = tmp_path / "o"
    assert main(["train", data, "-o", str(out), "--steps", "2"] + TINY) == 0
    (out / "test_views" / "view_005.png").write_bytes(b"of a test set since changed")
    assert main(["train", data, "-o", str(out), "--steps", "3", "--resume",
                 str(out / "checkpoint.pt")] + TINY) == 0
    assert os.listdir(out / "test_views") == ["view_000.png"]
    assert json.loads((out / "metrics.json").read_text())["step"] == 3


def test_leftover_temporaries_are_deleted_others_kept(data, tmp_path):
    out = tmp_path / "o"
    (out / "test_views").mkdir(parents=True)
    leftovers = [".checkpoint.pt.0123abcd.tmp", ".point_cloud.ply.89abcdef.tmp",
                 "checkpoint.pt.tmp", "test_views/.view_000.png.deadbeef.tmp"]
    kept = [".notes.txt.0123abcd.tmp", "test_views/.photo.png.deadbeef.tmp", "psnr.png.tmp"]
    for name in leftovers + kept:
        (out / name).write_bytes(b"partial")
    assert main(["train", data, "-o", str(out), "--steps", "2"] + TINY) == 0
    for name in leftovers:
        assert not (out / name).exists(), name
    for name in kept:
        assert (out / name).read_bytes() == b"partial", name


# ------------------------------------------------------------------ kills at random moments

# Imports torch and the trainer once, then forks one training run per request: a run
# killed at a random moment costs its own work only, not the imports (seconds here).
# In the runs each file write pauses PAUSE_S halfway through (its first write call, and
# every call of 1 kB or more, after flushing the first half), so that writes take a good
# part of a run and random kills often land inside one; unslowed, a tiny run writes its
# files in microseconds and no kill would catch a write.
PAUSE_S = 0.05
ZYGOTE = textwrap.dedent(f"""
    import builtins, io, json, os, sys, time
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot
    import torch, tqdm.auto, PIL.Image
    import arc_warp_train.commands, arc_warp_train.trainer, arc_warp_train.datasets
    from arc_warp.cli import main

    class SlowFile:
        def __init__(self, f):
            self._f, self._first = f, True
        def write(self, data):
            if self._first or len(data) >= 1024:
                self._first = False
                half = len(data) // 2
                self._f.write(data[:half])
                self._f.flush()
                time.sleep({PAUSE_S})
                data = data[half:]
            return self._f.write(data)
        def __getattr__(self, name):
            return getattr(self._f, name)
        def __enter__(self):
            return self
        def __exit__(self, *exc):
            return self._f.__exit__(*exc)
        def __iter__(self):
            return iter(self._f)

    def slow_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        return SlowFile(f) if any(c in mode for c in "wax+") else f

    def slow_save(obj, f, *args, **kwargs):
        buffer = io.BytesIO()
        real_save(obj, buffer, *args, **kwargs)
        with slow_open(f, "wb") as out:
            out.write(buffer.getvalue())

    real_open, real_save = builtins.open, torch.save
    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            builtins.open, torch.save = slow_open, slow_save
            log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(log, 1)
            os.dup2(log, 2)
            try:
                code = main(request["argv"])
            except BaseException:
                import traceback
                traceback.print_exc()
                code = 3
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        print(pid, flush=True)
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
""")


def _check_complete(out, last_step):
    """Every file in `out` is complete: parses in full. Temporaries (and the lock file of
    the killed run) are allowed. Returns the checkpoint's step (never below `last_step`)."""
    temporary_target = _run_folder().temporary_target
    for base, _, names in os.walk(out):
        for name in names:
            rel = os.path.relpath(os.path.join(base, name), out)
            path = os.path.join(out, rel)
            if name == LOCK_NAME or temporary_target(name) is not None:
                continue
            if rel == "checkpoint.pt":
                state = read_checkpoint(path)
                step = int(state["step"])
                assert step >= last_step, f"checkpoint went back from {last_step} to {step}"
                for tensor in state["params"].values():  # mmap: touch every byte
                    assert torch.isfinite(tensor).all()
            elif rel == "point_cloud.ply":
                assert read_ply(path).num_gaussians > 0
            elif rel == "metrics.json":
                assert "psnr" in json.loads(open(path).read())
            elif rel.endswith(".png"):
                with PIL_Image.open(path) as im:
                    im.load()  # raises on a truncated PNG
            else:
                raise AssertionError(f"unexpected file {rel}")
    assert os.path.isfile(os.path.join(out, "checkpoint.pt")), "the checkpoint was lost"
    return step


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(not hasattr(os, "fork"), reason="the run server forks")
def test_kills_at_random_moments_leave_complete_files_and_resume(data, tmp_path):
    out = tmp_path / "o"
    ckpt = str(out / "checkpoint.pt")
    zygote = subprocess.Popen([sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env=ENV, text=True)
    rng = np.random.default_rng(37)

    def run(steps, kill_after=None):
        argv = ["train", data, "-o", str(out), "--steps", str(steps), "--checkpoint-every",
                "1"] + TINY + (["--resume", ckpt] if os.path.exists(ckpt) else [])
        log = str(tmp_path / "run.log")
        zygote.stdin.write(json.dumps({"argv": argv, "log": log}) + "\n")
        zygote.stdin.flush()
        pid = int(zygote.stdout.readline())
        if kill_after is not None:
            time.sleep(kill_after)
            try:
                os.kill(pid, signal.SIGKILL)  # a finished run may be a zombie, or reaped
            except ProcessLookupError:
                pass
        code = int(zygote.stdout.readline())
        assert code in (0, -signal.SIGKILL), f"exit code {code}:\n{open(log).read()[-3000:]}"
        return code

    try:
        assert zygote.stdout.readline().strip() == "ready"
        start = time.monotonic()
        assert run(4) == 0
        duration = time.monotonic() - start  # of a fresh run: a resumed one is similar
        step, kills, steps = 4, 0, 4
        for _ in range(20):
            steps += 1  # each run trains on: a checkpoint, an evaluation, an export
            kills += run(steps, kill_after=rng.uniform(0.0, 1.2 * duration)) != 0
            step = _check_complete(str(out), step)
        assert kills >= 10, f"only {kills} of 20 runs were killed before they finished"
        assert run(steps + 1) == 0
    finally:
        zygote.stdin.close()
        zygote.wait(timeout=60)
    assert _check_complete(str(out), step) == steps + 1
    assert json.loads((out / "metrics.json").read_text())["step"] == steps + 1
    left = [n for n in os.listdir(out) + os.listdir(out / "test_views")
            if n == LOCK_NAME or _run_folder().temporary_target(n) is not None]
    assert not left, left
