"""Real-capture benchmark: `arc-warp train` and INRIA's `train.py` on one capture and split.

Each run leaves one JSON record (name, test PSNR in dB, SSIM where known, final Gaussian
count, wall seconds, test-view names) in a results folder; `table` prints them together.

    arc    NAME DATA [-- TRAIN ARGS]
        Runs ``python -m arc_warp.cli train DATA -o OUT/NAME --steps S --eval-every S``
        (plus TRAIN ARGS, e.g. ``--downscale 2``) as a subprocess and times it from process
        start to exit: dataset loading, Warp kernel compilation when not cached, training
        and export, as an INRIA run is timed around its process. PSNR, SSIM, Gaussian count
        and the test-view names come from the run's metrics.json.
    inria  NAME MODEL_DIR LOG --wall-s S
        Records a finished INRIA train.py run: the PSNR of the last ``[ITER N] Evaluating
        test: L1 .. PSNR ..`` line of LOG (its stdout) and the vertex count of
        MODEL_DIR/point_cloud/iteration_N/point_cloud.ply; its wall time is measured by
        the caller.
    table
        Prints every record of the results folder as a table.

PSNRs are not defined identically: arc-warp's is the PSNR of each test view's mean squared
error over all pixels and channels, averaged over views; INRIA's ``utils.image_utils.psnr``
averages the three per-channel PSNRs of a view, which is never lower (Jensen), so a
comparison of the two favours INRIA by a few hundredths of a dB.

Usage::

    python benchmarks/bench_real_capture.py --results R arc colmap .data/fox_colmap --steps 7000
    python benchmarks/bench_real_capture.py --results R inria inria R/inria R/inria.log --wall-s 412
    python benchmarks/bench_real_capture.py --results R table
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

INRIA_TEST = re.compile(r"\[ITER (\d+)\] Evaluating test: L1 (\S+) PSNR (\S+)")


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
    """Record of an INRIA train.py run from its stdout `log` and its saved point cloud."""
    with open(log, errors="replace") as f:
        hits = INRIA_TEST.findall(f.read())
    if not hits:
        raise ValueError(f"{log}: no '[ITER N] Evaluating test: L1 .. PSNR ..' line; was the "
                         "run started with --eval and --test_iterations N?")
    step, _, psnr = hits[-1]
    ply = os.path.join(model_dir, "point_cloud", f"iteration_{step}", "point_cloud.ply")
    if not os.path.isfile(ply):
        raise FileNotFoundError(f"{ply}: not found; add --save_iterations {step}")
    return {"name": name, "trainer": "inria", "step": int(step), "psnr": float(psnr),
            "ssim": None, "gaussians": ply_vertex_count(ply), "wall_s": wall_s,
            "test_views": None}


def arc_record(name: str, data: str, out: str, steps: int, train_args: list) -> dict:
    """Run `arc-warp train` on `data` for `steps` steps into `out`; its record."""
    cmd = [sys.executable, "-m", "arc_warp.cli", "train", data, "-o", out,
           "--steps", str(steps), "--eval-every", str(steps), "--no-progress", *train_args]
    print("+", " ".join(cmd), flush=True)
    start = time.perf_counter()
    rc = subprocess.call(cmd)
    wall = time.perf_counter() - start
    if rc:
        raise RuntimeError(f"arc-warp train exited with status {rc}")
    with open(os.path.join(out, "metrics.json")) as f:
        m = json.load(f)
    return {"name": name, "trainer": "arc-warp", "step": m["step"], "psnr": m["psnr"],
            "ssim": m["ssim"], "gaussians": m["num_gaussians"], "wall_s": wall,
            "test_views": [v["name"] for v in m["views"]]}


def write_record(results: str, record: dict) -> None:
    os.makedirs(results, exist_ok=True)
    with open(os.path.join(results, f"{record['name']}.json"), "w") as f:
        json.dump(record, f, indent=2)
    print(format_table([record]))


def format_table(records: list) -> str:
    """Records as an aligned text table (one row each)."""
    head = f"{'run':<16} {'trainer':<9} {'step':>6} {'test PSNR':>10} {'SSIM':>7} " \
           f"{'Gaussians':>10} {'wall s':>8}"
    rows = [head, "-" * len(head)]
    for r in records:
        ssim = "-" if r["ssim"] is None else f"{r['ssim']:.4f}"
        rows.append(f"{r['name']:<16} {r['trainer']:<9} {r['step']:>6} {r['psnr']:>10.3f} "
                    f"{ssim:>7} {r['gaussians']:>10} {r['wall_s']:>8.1f}")
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", required=True, help="folder of the JSON records")
    sub = parser.add_subparsers(dest="command", required=True)
    arc = sub.add_parser("arc", help="run and record `arc-warp train`")
    arc.add_argument("name")
    arc.add_argument("data")
    arc.add_argument("--steps", type=int, default=7000)
    inria = sub.add_parser("inria", help="record a finished INRIA train.py run")
    inria.add_argument("name")
    inria.add_argument("model_dir")
    inria.add_argument("log")
    inria.add_argument("--wall-s", type=float, required=True)
    sub.add_parser("table", help="print all records")
    argv = sys.argv[1:] if argv is None else list(argv)
    # Everything after "--" goes to `arc-warp train` untouched.
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:len(argv) - len(extra) - 1] if "--" in argv else argv)
    if extra and args.command != "arc":
        parser.error("options after -- are for the arc command only")

    if args.command == "arc":
        write_record(args.results, arc_record(args.name, args.data,
                                              os.path.join(args.results, args.name),
                                              args.steps, extra))
    elif args.command == "inria":
        write_record(args.results, inria_record(args.name, args.model_dir, args.log,
                                                args.wall_s))
    else:
        if not os.path.isdir(args.results):
            parser.error(f"--results {args.results}: no such folder (no run recorded yet)")
        names = sorted(f for f in os.listdir(args.results) if f.endswith(".json"))
        records = []
        for f in names:
            with open(os.path.join(args.results, f)) as fh:
                records.append(json.load(fh))
        print(format_table(records))
        views = {r["name"]: r["test_views"] for r in records if r["test_views"]}
        for name, v in views.items():
            print(f"{name} test views: {' '.join(v)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
