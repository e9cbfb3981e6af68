"""A training step captured whole in torch.cuda.graph (capture_step) against eager steps and the peers.

The scene, parameters, learning rates and loss are train_step's. Per N and size regime:

- ``arc_captured``: ``arc_fused``'s render (raw parameters, activations in the projection)
  captured with ``arc_warp_torch.capture_step`` in one CUDA graph (``fwd``), render + L1 +
  backward in another (``fwd_bwd``), and the same + an optimizer step in two more:
  ``torch.optim.Adam(capturable=True, fused=True)`` (``step``) and
  ``SparseGaussianAdam(capturable=True)`` (``step_arc_adam``), all on one
  ``RenderContext``. Each graph is warmed up on a side stream, captured, replayed; the
  medians of synchronised replays, then ``--reps`` replays back to back (loop ms/step);
  ``captured.check()`` runs after the timed replays;
- the eager libraries (``--libs``): train_step's figures (``bench_library``), each with
  its own optimizer.

Host ms: ``perf_counter`` around one ``graph.replay()``; for the eager libraries around the
forward and backward calls. CUDA graphs are CUDA-only: on the CPU (``--smoke``) each
captured body runs once eagerly (which checks its code), the eager libraries are timed
by the host clock, and the captured rows are absent, with the reason printed.
"""

from __future__ import annotations

import statistics
import time

from benchmarks import peers, results, timing, train_step
from benchmarks.scene import REGIMES, SH_DEGREE, make_scene


def add_arguments(parser) -> None:
    parser.add_argument("--n", type=int, nargs="+", default=[300_000, 1_000_000])
    parser.add_argument("--regimes", nargs="+", choices=REGIMES, default=["small", "large"])
    parser.add_argument("--libs", nargs="+", choices=peers.LIBRARIES, default=["arc_fused", "gsplat", "fastergs"],
                        help="eager libraries timed in the same run")
    parser.add_argument("--width", type=int, default=1920)
    parser.add_argument("--height", type=int, default=1080)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=16)


def captured_bodies(scene, viewmats, ks, target, device, cuda: bool) -> tuple[dict, object, dict]:
    """``({name: body}, context, params)``: the four step bodies of the module notes on
    one RenderContext, their optimizers capturable on CUDA."""
    from arc_warp_torch import RenderContext, SparseGaussianAdam, rasterization

    params = peers.torch_params(scene.raw, device)
    context = RenderContext(device)
    torch_adam = peers.optimizer("torch_adam", params, device, capturable=cuda)
    arc_adam = SparseGaussianAdam([{"params": [v], "lr": peers.LRS[k]} for k, v in params.items()], lr=0.0, eps=1e-15,
                                  bias_correction=True, capturable=cuda, context=context)

    def fwd():
        return rasterization(*(params[k] for k in scene.PARAMS), viewmats, ks, scene.width, scene.height,
                             sh_degree=SH_DEGREE, context=context, **peers.FUSED)[0]

    def fwd_bwd():
        (fwd() - target).abs().mean().backward()

    bodies = {"fwd": fwd, "fwd_bwd": fwd_bwd, "step": lambda: (fwd_bwd(), torch_adam.step()),
              "step_arc_adam": lambda: (fwd_bwd(), arc_adam.step())}
    return bodies, context, params


def bench_captured(bodies: dict, context, params: dict, device, reps: int, warmup: int) -> dict:
    """Medians of each body captured and replayed (module notes). CUDA only."""
    import torch

    from arc_warp_torch import capture_step

    clock = timing.Clock(device, "torch")
    row = {}

    def zero_grad():
        for v in params.values():
            v.grad = None

    for name, body in bodies.items():
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(warmup):
                zero_grad()
                body()  # an optimizer's state exists before its capture
        torch.cuda.current_stream(device).wait_stream(side)
        zero_grad()  # the gradients are the graph's own
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), capture_step(context) as captured:
            body()
        for _ in range(warmup):
            graph.replay()
        single = []
        for _ in range(reps):
            clock.sync()
            single.append(clock.time(graph.replay))
        row[f"{name}_ms"] = statistics.median(s.device_ms for s in single)
        row[f"{name}_host_ms"] = statistics.median(s.host_ms for s in single)
        if name.startswith("step"):
            hosts = []

            def loop():
                for _ in range(reps):
                    t0 = time.perf_counter()
                    graph.replay()
                    hosts.append((time.perf_counter() - t0) * 1e3)

            clock.sync()
            row[name.replace("step", "loop") + "_ms"] = clock.time(loop).device_ms / reps
            row[name.replace("step", "loop") + "_host_ms"] = statistics.median(hosts)
        captured.check()
        del graph
    return row


def run(args) -> dict:
    import torch

    if args.smoke:
        args.n, args.regimes, args.width, args.height, args.reps, args.warmup = [300], ["small"], 64, 48, 2, 1
    cuda = not args.smoke and torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    libs, notes = peers.libraries(args.libs, args.width, args.height)
    peers.count_waits()
    if not cuda:
        notes.append("no CUDA device: CUDA graphs are CUDA-only, so each captured body ran once eagerly and the "
                     "captured rows are absent; the eager rows are timed by the host clock")
        print(f"# {notes[-1]}")
    rows = []
    for n in args.n:
        for regime in args.regimes:
            scene = make_scene(n, regime, args.width, args.height)
            viewmats, ks = (torch.tensor(a, device=device) for a in (scene.viewmats, scene.Ks))
            target = torch.rand(1, args.height, args.width, 3, device=device,
                                generator=torch.Generator(device).manual_seed(0))
            bodies, context, params = captured_bodies(scene, viewmats, ks, target, device, cuda)
            if cuda:
                row = bench_captured(bodies, context, params, device, args.reps, args.warmup)
                rows.append(dict(row, n=n, regime=regime, library="arc_captured"))
            else:
                for body in bodies.values():
                    body()
            del bodies, context, params
            for label, lib in libs.items():
                eager = train_step.bench_library(lib, scene, viewmats, ks, target, device, args.reps, args.warmup)
                rows.append({"n": n, "regime": regime, "library": label, "fwd_ms": eager["forward_ms"],
                             "fwd_bwd_ms": eager["forward_ms"] + eager["backward_ms"],
                             "step_ms": train_step._own_step(eager), "loop_ms": eager["loop_ms"],
                             "fwd_bwd_host_ms": eager["host_ms"]})
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    return {"device": name, "width": args.width, "height": args.height, "notes": notes, "rows": rows}


def table(result: dict) -> str:
    rows, num, ratio, out = result["rows"], results.num, results.ratio, []
    for r in rows:
        peer = next((p for p in rows if (p["n"], p["regime"]) == (r["n"], r["regime"])
                     and p["library"] == "fastergs"), {})
        ours = r["library"].startswith("arc")
        steps = [r[k] for k in ("step_ms", "step_arc_adam_ms") if r.get(k) is not None]
        if r["library"] == "arc_captured":
            host = ", ".join(f"{num(r[k])} {what}" for k, what in (
                ("fwd_host_ms", "fwd"), ("fwd_bwd_host_ms", "fwd+bwd"), ("step_host_ms", "step")) if r.get(k) is not None)
            step = ", ".join(f"{num(r[k])} ({what})" for k, what in (("step_ms", "torch fused Adam"),
                                                                    ("step_arc_adam_ms", "SparseGaussianAdam"))
                             if r.get(k) is not None)
        else:
            host = f"{num(r['fwd_bwd_host_ms'])} fwd+bwd" if r.get("fwd_bwd_host_ms") is not None else "-"
            step = num(r.get("step_ms"))
        out.append([results.count(r["n"]), r["regime"], r["library"], num(r.get("fwd_ms")), num(r.get("fwd_bwd_ms")),
                    step or "-", num(r.get("loop_ms")), host or "-",
                    ratio(r.get("fwd_ms"), peer.get("fwd_ms")) if ours else "-",
                    ratio(min(steps, default=None), peer.get("step_ms")) if ours and steps else "-"])
    return results.markdown(["N", "regime", "library", "fwd ms", "fwd+bwd ms", "step ms (optimizer)", "loop ms/step",
                             "host ms per call", "fwd ÷ Faster-GS", "best step ÷ Faster-GS"], out)
