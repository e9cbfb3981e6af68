"""`arc-warp train` against INRIA's train.py on one capture: test PSNR, SSIM, Gaussians, wall time.

Each run adds (or replaces, by name) one record in this benchmark's result file:

- ``arc NAME DATA``: runs ``python -m arc_warp.cli train DATA -o RUNS/NAME --steps S
  --eval-every S --no-progress`` (plus ``--train-args``, e.g. ``--train-args="--downscale 2"``)
  as a subprocess and times it from process start to exit (dataset loading, kernel
  compilation when not cached, training and export, as an INRIA run is timed around its
  process); PSNR, SSIM, Gaussian count and the test views come from the run's metrics.json;
- ``inria NAME MODEL_DIR LOG --wall-s S``: records a finished INRIA train.py run: the PSNR
  of the last ``[ITER N] Evaluating test: L1 .. PSNR ..`` line of LOG (its stdout), the
  vertex count of MODEL_DIR/point_cloud/iteration_N/point_cloud.ply, the wall time the
  caller measured.

PSNRs are not defined identically: arc-warp's is the PSNR of each test view's mean squared
error over all pixels and channels, averaged over views; INRIA's ``utils.image_utils.psnr``
averages the three per-channel PSNRs of a view, which is never lower (Jensen), so a
comparison of the two favours INRIA by a few hundredths of a dB. ``--smoke`` trains a few
steps on a tiny synthetic dataset on the CPU.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time

from benchmarks import results

INRIA_TEST = re.compile(r"\[ITER (\d+)\] Evaluating test: L1 (\S+) PSNR (\S+)")


def add_arguments(parser) -> None:
    parser.add_argument("trainer", choices=("arc", "inria"), nargs="?", default="arc")
    parser.add_argument("name", nargs="?", default="arc", help="the record's name")
    parser.add_argument("data", nargs="?", help="arc: the dataset folder; inria: the model folder")
    parser.add_argument("log", nargs="?", help="inria: train.py's stdout")
    parser.add_argument("--steps", type=int, default=7000)
    parser.add_argument("--train-args", default="", help='more arguments of `arc-warp train`, e.g. "--downscale 2"')
    parser.add_argument("--runs", default=os.path.join(".data", "train_runs"), help="arc: where the runs write")
    parser.add_argument("--wall-s", type=float, help="inria: the run's wall time, seconds")


def ply_vertex_count(path: str) -> int:
    """Number of vertices in the header of a PLY file (ASCII or binary)."""
    with open(path, "rb") as f:
        for raw in f:
            line = raw.decode("ascii", "replace").strip()
            if line.startswith("element vertex "):
                return int(line.split()[2])
            if line == "end_header":
                break
    raise ValueError(f"{path}: no 'element vertex' line in the PLY header")


def inria_record(name: str, model_dir: str, log: str, wall_s: float) -> dict:
    """The record of an INRIA train.py run from its stdout ``log`` and its saved point cloud."""
    with open(log, errors="replace") as f:
        hits = INRIA_TEST.findall(f.read())
    if not hits:
        raise ValueError(f"{log}: no '[ITER N] Evaluating test: L1 .. PSNR ..' line; was the run started with "
                         "--eval and --test_iterations N?")
    step, _, psnr = hits[-1]
    ply = os.path.join(model_dir, "point_cloud", f"iteration_{step}", "point_cloud.ply")
    if not os.path.isfile(ply):
        raise FileNotFoundError(f"{ply}: not found; add --save_iterations {step}")
    return {"name": name, "trainer": "inria", "step": int(step), "psnr": float(psnr), "ssim": None,
            "gaussians": ply_vertex_count(ply), "wall_s": wall_s, "test_views": None}


def arc_record(name: str, data: str, out: str, steps: int, train_args: list) -> dict:
    """Runs `arc-warp train` on ``data`` for ``steps`` steps into ``out``; its record."""
    cmd = [sys.executable, "-m", "arc_warp.cli", "train", data, "-o", out, "--steps", str(steps),
           "--eval-every", str(steps), "--no-progress", *train_args]
    print("+", shlex.join(cmd), flush=True)
    start = time.perf_counter()
    rc = subprocess.call(cmd)
    wall = time.perf_counter() - start
    if rc:
        raise RuntimeError(f"arc-warp train exited with status {rc}")
    with open(os.path.join(out, "metrics.json")) as f:
        m = json.load(f)
    training = m.get("training", {})  # the step loop's own figures (evaluation and checkpoints excluded)
    return {"name": name, "trainer": "arc-warp", "step": m["step"], "psnr": m["psnr"], "ssim": m["ssim"],
            "gaussians": m["num_gaussians"], "wall_s": wall, "it_per_s": training.get("it_per_s"),
            "mode": training.get("mode"), "captures": training.get("captures"),
            "test_views": [v["name"] for v in m["views"]]}


def run(args) -> dict:
    previous = args.out / ("train.json" if args.label is None else f"train-{args.label}.json")
    rows = results.load(previous)["rows"] if previous.exists() and not args.smoke else []
    if args.smoke:
        from arc_warp_train.synthetic import make_synthetic_dataset

        args.trainer, args.name, args.steps = "arc", "smoke", 3
        args.runs = str(args.out / "train_runs")
        args.data = os.path.join(args.runs, "dataset")
        make_synthetic_dataset(args.data, num_train=4, num_test=2, width=24, height=24, num_gaussians=200,
                               device="cpu")
        args.train_args = "--device cpu --init-points 500 --overwrite"
    if args.trainer == "arc":
        if not args.data:
            raise SystemExit("train arc NAME DATA: the dataset folder is missing")
        record = arc_record(args.name, args.data, os.path.join(args.runs, args.name), args.steps,
                            shlex.split(args.train_args))
    else:
        if not (args.data and args.log and args.wall_s):
            raise SystemExit("train inria NAME MODEL_DIR LOG --wall-s S: an argument is missing")
        record = inria_record(args.name, args.data, args.log, args.wall_s)
    rows = [r for r in rows if r["name"] != record["name"]] + [record]
    return {"device": _device_name(), "rows": rows}


def _device_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def table(result: dict) -> str:
    num = results.num
    arc = next((r for r in result["rows"] if r["trainer"] == "arc-warp"), {})
    out = [[r["name"], r["trainer"] + (f" ({r['mode']})" if r.get("mode") else ""), str(r["step"]),
            num(r["psnr"], 3), num(r["ssim"], 4), str(r["gaussians"]), num(r["wall_s"], 1),
            num(r["it_per_s"], 1) if r.get("it_per_s") else "-",
            results.ratio(arc.get("wall_s"), r["wall_s"]) if r["trainer"] != "arc-warp" else "-"]
           for r in result["rows"]]
    return results.markdown(["run", "trainer", "steps", "test PSNR dB", "SSIM", "Gaussians", "wall s", "it/s",
                             "arc-warp wall ÷ this"], out)
