"""Device timeline of one forward + backward through the torch API, kernel by kernel.

Runs bench_train_step's scene and L1 loss for one library, then traces three steps with
torch.profiler (CPU and CUDA activities) and prints, for the last step: the host spans
of the forward and the backward call, the CUDA runtime calls that launch graphs,
synchronise or copy, and every kernel / memset / copy on the device with its start (us
after the forward call began), its duration and the idle gap before it; then the device
busy time on each side of the backward call. Compare libraries kernel by kernel (arc_warp
against gsplat or Faster-GS) and see where the device waits for the host.

Usage::

    cd benchmarks && python profile_timeline.py arc_fused --n 1000000
    cd benchmarks && python profile_timeline.py fastergs --n 1000000 --cameras 1
"""

import argparse
import json
import os
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import bench_train_step as bts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("library", help="a bench_train_step library: arc, arc_fused, gsplat, fastergs, ...")
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--cameras", type=int, default=1)
    ap.add_argument("--regime", default="small", choices=sorted(bts.REGIMES))
    ap.add_argument("--width", type=int, default=1920)
    ap.add_argument("--height", type=int, default=1080)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("profile_timeline.py needs a CUDA device")
    libs, _ = bts._renderers([args.library], args.width, args.height)
    if not libs:
        raise SystemExit(f"library {args.library!r} is not available here")
    lib = next(iter(libs.values()))
    dev = torch.device("cuda")
    raw, viewmats, ks = bts.make_scene(args.n, args.regime, args.width, args.height, args.cameras)
    params = lib.params(raw, dev)
    viewmats, ks = viewmats.to(dev), ks.to(dev)
    target = torch.rand(args.cameras, args.height, args.width, 3, device=dev)

    def step():
        torch.cuda.synchronize()
        with record_function("FWD"):
            img = lib.render(params, viewmats, ks)
        loss = (img - target).abs().mean()
        with record_function("BWD"):
            loss.backward()
        for p in params.values():
            p.grad = None
        torch.cuda.synchronize()

    for _ in range(30):  # past graph capture and warm-up
        step()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    finally:
        os.remove(path)
    marks = sorted((e for e in events if e.get("name") in ("FWD", "BWD") and e.get("cat") == "user_annotation"),
                   key=lambda e: e["ts"])
    fwd, bwd = marks[-2], marks[-1]
    t0, end = fwd["ts"], bwd["ts"] + bwd["dur"] + 5000
    device = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
                     and t0 - 50 <= e["ts"] <= end), key=lambda e: e["ts"])
    runtime = sorted((e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and t0 <= e["ts"] <= end
                      and any(k in e["name"] for k in ("Graph", "Synchronize", "Memcpy", "EventRecord", "Query"))),
                     key=lambda e: e["ts"])
    print(f"# {args.library} N={args.n} C={args.cameras} {args.regime} {args.width}x{args.height}, "
          f"{torch.cuda.get_device_name()}; times in us from the forward call")
    print(f"host forward 0 .. {fwd['dur']:.0f}, host backward {bwd['ts'] - t0:.0f} .. {bwd['ts'] + bwd['dur'] - t0:.0f}")
    for e in runtime:
        print(f"  cpu {e['ts'] - t0:8.0f} +{e['dur']:6.0f}  {e['name'][:60]}")
    busy_f = busy_b = 0.0
    last = None
    for e in device:
        start = e["ts"] - t0
        gap = "" if last is None else f"gap {start - last:6.0f}"
        print(f"  gpu {start:8.0f} +{e['dur']:6.0f}  {gap:10s} {e['name'][:80]}")
        last = start + e["dur"]
        if e["ts"] < bwd["ts"]:
            busy_f += e["dur"]
        else:
            busy_b += e["dur"]
    print(f"device busy: {busy_f:.0f} before the backward call, {busy_b:.0f} after it; last device work ends at {last:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
