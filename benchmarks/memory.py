"""Peak device memory of a torch-Adam training step, by phase, and what holds it at each peak.

Per library (train_step's scene and libraries, L1 loss, ``torch.optim.Adam``), after
``--warmup`` steps, one step measured by phase, MiB:

- forward + backward: torch's ``max_memory_allocated`` over them, plus the Warp memory in
  use after them (arc_warp only: a repeated step allocates no Warp arrays, so what it holds
  after a step is its peak in the step);
- ``Adam.step``: torch's peak over it, plus Warp's memory in use then;
- peak: the larger. Torch memory that earlier runs left allocated is taken off (what was
  allocated before the library's parameters were made, less the target image, part of
  every library's step), so a library's figure does not depend on which ran before it.

``--sites`` also records torch's allocation history over one more step
(``torch.cuda.memory._record_memory_history``), replays it to find torch's peak in each
phase, and prints the live blocks there grouped by their innermost frames in the library,
the benchmark or the optimizer. CUDA only: on the CPU the steps run (which checks the
code) and the figures are absent, with the reason printed.
"""

from __future__ import annotations

import collections
import os

from benchmarks import peers, results
from benchmarks.scene import REGIMES, make_scene

MIB = 2.0 ** 20
SITES = ("arc_warp", "benchmarks", "optim", "gsplat", "FasterGS")


def add_arguments(parser) -> None:
    parser.add_argument("--n", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--regimes", nargs="+", choices=REGIMES, default=["small"])
    parser.add_argument("--libs", nargs="+", choices=peers.LIBRARIES, default=["arc_fused", "gsplat"])
    parser.add_argument("--width", type=int, default=1920)
    parser.add_argument("--height", type=int, default=1080)
    parser.add_argument("--warmup", type=int, default=12, help="untimed steps before the measured one")
    parser.add_argument("--sites", action="store_true", help="also the allocation sites at each phase's peak")
    parser.add_argument("--top", type=int, default=12, help="sites listed per phase")


def torch_before(device, target) -> int:
    """Torch bytes that earlier runs left allocated (the target image is this run's)."""
    import torch

    return torch.cuda.memory_allocated(device) - target.nbytes if device.type == "cuda" else 0


def warp_in_use(device) -> int:
    """Bytes Warp's memory pool has in use on a CUDA device."""
    import warp as wp

    return wp.get_mempool_used_mem_current(wp.device_from_torch(device))


def phase_peaks(step_parts, device, before: tuple[int, int | None]) -> dict:
    """``{forward_backward_mib, adam_mib, peak_mib}`` of one step made of
    ``step_parts = (forward_backward, optimizer_step)`` callables (module notes).
    ``before``: (torch bytes earlier runs left, Warp bytes in use before the library's runs
    or None: count none of Warp's). CUDA only."""
    import torch

    torch_base, warp_base = before
    figures = {}
    for key, part in zip(("forward_backward_mib", "adam_mib"), step_parts):
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        part()
        torch.cuda.synchronize(device)
        warp = 0 if warp_base is None else max(warp_in_use(device) - warp_base, 0)
        figures[key] = (torch.cuda.max_memory_allocated(device) - torch_base + warp) / MIB
    figures["peak_mib"] = max(figures.values())
    return figures


def site(frames) -> str:
    """The innermost frames of an allocation in the code the tables are about."""
    keep = [f"{os.path.basename(f['filename'])}:{f['line']}:{f['name']}" for f in frames
            if any(s in f["filename"] for s in SITES) and "torch/utils" not in f["filename"]][:3]
    return " < ".join(keep) or "(torch internals)"


def peaks_from_trace(events: list, start: int, mid: int, end: int) -> dict:
    """``{phase: (peak bytes, {site: [bytes, blocks]})}`` for ``forward+backward`` (events
    ``start``..``mid``) and ``adam`` (``mid``..``end``) of an allocation trace (torch's
    ``device_traces`` entries: ``action`` alloc / free_completed, ``addr``, ``size``,
    ``frames``): the bytes live at the phase's largest point, by :func:`site`."""
    live, current = {}, 0
    best = {"forward+backward": (0, {}), "adam": (0, {})}
    for i, e in enumerate(events[:end]):
        if e["action"] == "alloc":
            live[e["addr"]] = (e["size"], e.get("frames", []))
            current += e["size"]
        elif e["action"] == "free_completed" and e["addr"] in live:
            current -= live.pop(e["addr"])[0]
        phase = "forward+backward" if start <= i < mid else "adam" if i >= mid else None
        if phase and current > best[phase][0]:
            best[phase] = (current, dict(live))
    out = {}
    for phase, (peak, blocks) in best.items():
        sites = collections.defaultdict(lambda: [0, 0])
        for size, frames in blocks.values():
            entry = sites[site(frames)]
            entry[0] += size
            entry[1] += 1
        out[phase] = (peak, dict(sites))
    return out


def recorded_sites(step_parts, device) -> dict:
    """:func:`peaks_from_trace` of one step recorded in torch's allocation history."""
    import torch

    def length():
        torch.cuda.synchronize(device)
        return len(torch.cuda.memory._snapshot()["device_traces"][device.index or 0])

    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    try:
        start = length()
        step_parts[0]()
        mid = length()
        step_parts[1]()
        end = length()
        events = torch.cuda.memory._snapshot()["device_traces"][device.index or 0]
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    return peaks_from_trace(events, start, mid, end)


def run(args) -> dict:
    import torch

    cuda = not args.smoke and torch.cuda.is_available()
    if args.smoke:
        args.n, args.width, args.height, args.warmup = [200], 64, 48, 2
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    notes = [] if cuda else ["no CUDA device: the steps ran, the peaks are CUDA-only and absent"]
    print(f"# {notes[0]}" if notes else f"# {torch.cuda.get_device_name(device)}")
    libs, peer_notes = peers.libraries(args.libs, args.width, args.height)
    rows = []
    for n in args.n:
        for regime in args.regimes:
            scene = make_scene(n, regime, args.width, args.height)
            viewmats, ks = (torch.tensor(a, device=device) for a in (scene.viewmats, scene.Ks))
            target = torch.rand(1, args.height, args.width, 3, device=device,
                                generator=torch.Generator(device).manual_seed(0))
            for name, lib in libs.items():
                before = (torch_before(device, target),
                          warp_in_use(device) if cuda and name.startswith("arc") else None)
                params = lib.params(scene.raw, device)
                opt = peers.optimizer("torch_adam", params, device)

                def forward_backward():
                    (lib.render(params, viewmats, ks) - target).abs().mean().backward()

                def adam_step():
                    opt.step()
                    opt.zero_grad(set_to_none=True)

                for _ in range(args.warmup):
                    forward_backward()
                    adam_step()
                row = {"n": n, "regime": regime, "library": name}
                if cuda:
                    row.update(phase_peaks((forward_backward, adam_step), device, before))
                    if args.sites:
                        row["sites"] = {phase: {"peak_mib": peak / MIB, "top": sorted(
                            ([s, b / MIB, k] for s, (b, k) in found.items()), key=lambda e: -e[1])[:args.top]}
                            for phase, (peak, found) in recorded_sites((forward_backward, adam_step),
                                                                       device).items()}
                        _print_sites(name, row["sites"])
                else:
                    forward_backward()
                    adam_step()
                rows.append(row)
                del params, opt
                if cuda:
                    torch.cuda.empty_cache()
    return {"device": torch.cuda.get_device_name(device) if cuda else "cpu", "rows": rows,
            "width": args.width, "height": args.height, "notes": notes + peer_notes}


def _print_sites(name: str, sites: dict) -> None:
    print(f"\n## {name}: torch's live blocks at each phase's peak")
    for phase, entry in sites.items():
        print(f"{phase}: torch peak {entry['peak_mib']:.1f} MiB")
        for where, mib, blocks in entry["top"]:
            print(f"  {mib:8.1f} MiB  x{blocks:<3d} {where[:150]}")


def table(result: dict) -> str:
    rows, out = result["rows"], []
    for r in rows:
        peer = next((p for p in rows if p["n"] == r["n"] and p["regime"] == r["regime"]
                     and p["library"].startswith("gsplat") and not p["library"].endswith("packed")), None)
        out.append([results.count(r["n"]), r["regime"], r["library"], results.num(r.get("forward_backward_mib"), 1),
                    results.num(r.get("adam_mib"), 1), results.num(r.get("peak_mib"), 1),
                    results.ratio(r.get("peak_mib"), peer and peer.get("peak_mib")) if r["library"].startswith("arc")
                    else "-"])
    return results.markdown(["N", "regime", "library", "forward + backward MiB", "Adam.step MiB", "peak MiB",
                             "peak ÷ gsplat"], out)
