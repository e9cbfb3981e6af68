"""What holds device memory at the peaks of one torch-Adam training step, by allocation site.

For each library (bench_train_step's scene, L1 loss, torch.optim.Adam), records torch's
allocator history (``torch.cuda.memory._record_memory_history``) from before the
parameters are made, runs a few steps, then one more step, and replays the history to
find torch's peak within that step's forward + backward and within its ``Adam.step``.
At each peak it lists the live blocks grouped by the innermost frames in the library,
the benchmark or the optimizer. For arc_warp it also prints the memory its Warp
workspace holds (Warp's pool, in use: a step allocates no Warp arrays, so that is also
its peak). The total peak of a phase is torch's plus Warp's.

Usage::

    python benchmarks/memory_phases.py --n 1000000 --libs arc arc_fused gsplat
    python benchmarks/memory_phases.py --n 1000000 --libs arc_fused gsplat --regime large
"""

import argparse
import collections
import os

import torch

import bench_train_step as bts

SITES = ("arc_warp", "bench_train", "memory_phases", "optim", "gsplat", "FasterGS")


def _site(frames) -> str:
    keep = [f"{os.path.basename(f['filename'])}:{f['line']}:{f['name']}" for f in frames
            if any(s in f["filename"] for s in SITES) and "torch/utils" not in f["filename"]][:3]
    return " < ".join(keep) or "(torch internals)"


def phase_peaks(lib, n, width, height, regime="small", warm_steps=12):
    """{phase: (peak bytes, {site: (bytes, blocks)})} for "forward+backward" and "adam"."""
    dev = torch.device("cuda")
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    try:
        raw, viewmats, ks = bts.make_scene(n, regime, width, height, 1)
        viewmats, ks = viewmats.to(dev), ks.to(dev)
        target = torch.rand(1, height, width, 3, device=dev)
        params = lib.params(raw, dev)
        opt = bts._optimizer("torch_adam", params)

        def trace_length():
            torch.cuda.synchronize()
            return len(torch.cuda.memory._snapshot()["device_traces"][0])

        for _ in range(warm_steps):
            (lib.render(params, viewmats, ks) - target).abs().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        start = trace_length()
        loss = (lib.render(params, viewmats, ks) - target).abs().mean()
        loss.backward()
        mid = trace_length()
        opt.step()
        end = trace_length()
        opt.zero_grad(set_to_none=True)
        events = torch.cuda.memory._snapshot()["device_traces"][0]
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    live, current = {}, 0
    best = {"forward+backward": (0, {}), "adam": (0, {})}
    for i, e in enumerate(events[:end]):
        if e["action"] == "alloc":
            live[e["addr"]] = (e["size"], e.get("frames", []))
            current += e["size"]
        elif e["action"] == "free_completed" and e["addr"] in live:
            current -= live.pop(e["addr"])[0]
        phase = "forward+backward" if start <= i < mid else "adam" if mid <= i else None
        if phase and current > best[phase][0]:
            best[phase] = (current, dict(live))
    out = {}
    for phase, (peak, blocks) in best.items():
        sites = collections.defaultdict(lambda: [0, 0])
        for size, frames in blocks.values():
            entry = sites[_site(frames)]
            entry[0] += size
            entry[1] += 1
        out[phase] = (peak, dict(sites))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--libs", nargs="+", default=["arc", "gsplat"])
    ap.add_argument("--width", type=int, default=1920)
    ap.add_argument("--height", type=int, default=1080)
    ap.add_argument("--regime", default="small", choices=sorted(bts.REGIMES))
    ap.add_argument("--top", type=int, default=12, help="sites listed per phase")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("memory_phases.py needs a CUDA device")
    import warp as wp

    libs, notes = bts._renderers(args.libs, args.width, args.height)
    mib = 2.0 ** 20
    print(f"# {torch.cuda.get_device_name()}, N={args.n}, {args.regime} splats, {args.width}x{args.height}, SH 3; "
          f"{'; '.join(notes)}")
    for name, lib in libs.items():
        warp_before = wp.get_mempool_used_mem_current("cuda:0")
        peaks = phase_peaks(lib, args.n, args.width, args.height, args.regime)
        warp = (wp.get_mempool_used_mem_current("cuda:0") - warp_before) / mib
        print(f"\n## {name}: Warp workspace {warp:.1f} MiB")
        for phase, (peak, sites) in peaks.items():
            print(f"{phase}: torch peak {peak / mib:.1f} MiB, with Warp's {peak / mib + warp:.1f} MiB")
            for site, (size, count) in sorted(sites.items(), key=lambda kv: -kv[1][0])[:args.top]:
                print(f"  {size / mib:8.1f} MiB  x{count:<3d} {site[:150]}")
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
