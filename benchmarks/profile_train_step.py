"""Where a forward + backward's time goes through the torch API: host against device.

On a GPU: torch.profiler (CPU and CUDA activities) over a few steps of bench_train_step's
scene, printing the top CUDA kernels and the top host-side ops. On the CPU (``--device
cpu``): the host time per forward + backward spent outside Warp's kernels, i.e. the Python
overhead of the path (thread CPU time, so other processes on the machine do not count),
the CPU proxy for the per-call cost a GPU user pays.

Usage::

    cd benchmarks && python profile_train_step.py --n 300000
    cd benchmarks && python profile_train_step.py --device cpu --n 200 --width 32 --height 32
    cd benchmarks && python profile_train_step.py --n 300000 --cprofile 100   # host by function
    cd benchmarks && python profile_train_step.py --n 300000 --host-breakdown 100
    cd benchmarks && python profile_train_step.py --n 300000 --lib arc_fused --forward-host 300
    cd benchmarks && python profile_train_step.py --n 1000000 --lib arc_fused --forward-host 150 --launch-cost 200

``--host-breakdown N`` times N steps with ``time.perf_counter`` around the main parts of
the torch path (the autograd Function's forward and backward, the core's render and
backward entries, argument checks, views, the stream scope, graph launches and the one
event wait) and prints the mean microseconds per step in each: nested parts are included
in their callers, and the wait is a part of its own. Unlike cProfile it adds only one
wrapper call per timed function.

``--forward-host N`` times N steps, each after a device sync, with ``time.perf_counter``
around the render call and around ``loss.backward()`` (mean host us of each call), and
``wp.capture_launch`` (graph launches per step and their host us); then prints the node
types of every CUDA graph launched (kernels, memsets, memory alloc/free nodes, ...),
counted through the driver's ``cuGraphGetNodes``: the forward's pre-launch latency is
Python plus one graph launch. With ``--launch-cost M`` it then launches each of those
graphs alone, M times after a device sync and a host prelude (nothing, a busy-wait, a
pass over 8 MiB of numpy and a dict, a 1 ms sleep), and prints the median host us: a
launch inside a step costs about 20 us whatever its nodes, as after the pass that
leaves the CPU's caches cold, against 4-13 us with warm caches (BENCHMARKS.md).

``--timeline N`` stamps the entry and exit of the same parts in N steps, each after a device
sync, and prints the median microseconds from the start of the render call (and of
``loss.backward()``) at which each happens, in order: where the host is when the forward's
graph launch reaches the device, and what runs before it.
"""

import argparse
import collections
import contextlib
import cProfile
import ctypes
import pstats
import time

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

import bench_train_step as bts


def _host_overhead_cpu(step, reps):
    """Median thread CPU ms per step, and the part outside Warp's CPU kernel invocations."""
    import warp._src.context as wctx

    inside = [0.0]
    invoke = wctx.invoke

    def timed_invoke(*a, **k):
        t = time.thread_time()
        try:
            return invoke(*a, **k)
        finally:
            inside[0] += time.thread_time() - t

    wctx.invoke = timed_invoke  # measurement only: Warp's CPU launches call this per kernel
    try:
        total, host = [], []
        for _ in range(reps):
            inside[0] = 0.0
            t = time.thread_time()
            step()
            dt = time.thread_time() - t
            total.append(dt * 1e3)
            host.append((dt - inside[0]) * 1e3)
    finally:
        wctx.invoke = invoke
    return float(np.median(total)), float(np.median(host))


# (module, attribute) pairs timed by --host-breakdown and --timeline; a class attribute is
# "Class.name"
HOST_PARTS = (
    ("arc_warp_torch.rasterization", "check_tensor"),
    ("arc_warp_torch.rasterization", "_cameras"),
    ("arc_warp_torch.rasterization", "render_batch"),
    ("arc_warp_torch._autograd", "_queue_render"),
    ("arc_warp_torch._autograd", "_RenderGaussians.forward"),
    ("arc_warp_torch._autograd", "_RenderGaussians.backward"),
    ("arc_warp_torch._autograd", "render_checked"),
    ("arc_warp._src.splat.workspace", "Workspace.restore"),
    ("arc_warp._src.splat.workspace", "Workspace.release_forward"),
    ("arc_warp._src.splat.workspace", "Workspace.release"),
    ("arc_warp_torch._autograd", "settle_deferred"),
    ("arc_warp_torch._autograd", "backwards_checked"),
    ("arc_warp_torch._autograd", "RenderContext.stream"),
    ("arc_warp_torch._autograd", "RenderContext.warp_stream"),
    ("arc_warp_torch._autograd", "RenderContext.inputs"),
    ("arc_warp_torch._autograd", "RenderContext.per_camera"),
    ("arc_warp_torch._autograd", "RenderContext.grads"),
    ("arc_warp_torch._autograd", "RenderContext.device_cameras"),
    ("arc_warp_torch._autograd", "RenderContext.gradients"),
    ("arc_warp_torch._autograd", "RenderContext.outputs"),
    ("arc_warp_torch._autograd", "RenderContext.settings"),
    ("arc_warp_torch._autograd", "_warp_backward"),
    ("arc_warp_torch.rasterization", "_sh_degree_and_colors"),
    ("arc_warp_torch._autograd", "RenderContext._memoized"),
    ("arc_warp_torch._autograd", "_backward_views"),
    ("arc_warp._src.splat.render", "_input_key"),
    ("arc_warp._src.splat.render", "_RenderPlan.matches"),
    ("arc_warp._src.splat.render", "_RenderPlan.repeat"),
    ("arc_warp._src.splat.workspace", "Frame.launch_graph"),
    ("arc_warp._src.splat.render", "_prepare_forward"),
    ("arc_warp._src.splat.render", "_replay_together"),
    ("arc_warp._src.splat.render", "_settle"),
    ("arc_warp._src.splat.render", "_read_total"),
    ("arc_warp._src.splat.render", "_prepare_backward"),
    ("arc_warp._src.splat.workspace", "Workspace.acquire"),
    ("arc_warp._src.splat.workspace", "Workspace.release_with"),
    ("arc_warp._src.splat.workspace", "Frame.replay"),
    ("warp", "capture_launch"),
    ("warp", "synchronize_event"),
    ("torch", "empty"),
)


@contextlib.contextmanager
def _wrapped_parts(make_wrapper):
    """Replaces each HOST_PARTS function ``fn`` by ``make_wrapper(fn, "Owner.name")`` for the
    block (measurement only)."""
    import importlib
    import sys

    restore = []
    try:
        for module_name, path in HOST_PARTS:
            importlib.import_module(module_name)
            owner = sys.modules[module_name]
            *classes, name = path.split(".")
            for cls in classes:
                owner = getattr(owner, cls)
            fn = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
            wrapped = make_wrapper(fn.__func__ if isinstance(fn, staticmethod) else fn, path)
            setattr(owner, name, staticmethod(wrapped) if isinstance(fn, staticmethod) else wrapped)
            restore.append((owner, name, fn))
        yield
    finally:
        for owner, name, fn in reversed(restore):
            setattr(owner, name, fn)


def _host_breakdown(step, reps):
    """{part: mean host us per step} over ``reps`` steps (see the module notes)."""
    spent = collections.defaultdict(float)

    def make_wrapper(fn, path):
        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[path] += time.perf_counter() - t
        return timed

    with _wrapped_parts(make_wrapper):
        for _ in range(reps):
            step()
    return {k: v / reps * 1e6 for k, v in spent.items()}


def _timeline(render, step_rest, reps):
    """[(phase, median us from the phase's start, event)] over ``reps`` synchronised steps:
    the entries and exits of the HOST_PARTS functions (the k-th of a name's calls marked
    #k) in the render call ("render") and in ``loss.backward()`` ("backward"), in order,
    for those in at least half of the steps (see the module notes)."""
    stamps = []

    def make_wrapper(fn, path):
        def stamped(*a, **k):
            stamps.append((path + " >", time.perf_counter()))
            try:
                return fn(*a, **k)
            finally:
                stamps.append((path + " <", time.perf_counter()))
        return stamped

    offsets = collections.defaultdict(list)
    with _wrapped_parts(make_wrapper):
        for _ in range(reps):
            torch.cuda.synchronize()
            stamps.clear()
            t0 = time.perf_counter()
            img = render()
            stamps.append(("render call <", time.perf_counter()))
            t1 = time.perf_counter()
            step_rest(img)
            stamps.append(("loss.backward() and zero_grad <", time.perf_counter()))
            seen = collections.Counter()
            for label, t in stamps:
                phase, base = ("render", t0) if t < t1 else ("backward", t1)
                seen[phase, label] += 1
                n = seen[phase, label]
                offsets[phase, label if n == 1 else f"{label} #{n}"].append((t - base) * 1e6)
    # a part run in only some steps (a capture, a re-prepared call) is left out
    rows = [(phase, float(np.median(v)), label) for (phase, label), v in offsets.items() if 2 * len(v) >= reps]
    return sorted(rows, key=lambda r: (r[0] != "render", r[1]))


# CUgraphNodeType values (cuda.h) -> names, for --forward-host
_NODE_TYPES = {0: "kernel", 1: "memcpy", 2: "memset", 3: "host", 4: "graph", 5: "empty", 6: "wait_event",
               7: "event_record", 8: "ext_sem_signal", 9: "ext_sem_wait", 10: "mem_alloc", 11: "mem_free",
               12: "batch_mem_op", 13: "conditional"}


def _forward_host(render, step_rest, reps):
    """(forward call us, backward call us, graph launches per step, their us, {graph id:
    Counter of node types}, {graph id: wp.Graph}) over ``reps`` synchronised steps (see
    the module notes)."""
    import warp as wp
    import warp._src.context as wctx

    launch = wctx.capture_launch
    spent, graphs = [0.0, 0], {}

    def timed_launch(graph, *a, **k):
        t = time.perf_counter()
        try:
            return launch(graph, *a, **k)
        finally:
            spent[0] += time.perf_counter() - t
            spent[1] += 1
            graphs[id(graph)] = graph

    wp.capture_launch = wctx.capture_launch = timed_launch  # measurement only
    try:
        fwd = bwd = 0.0
        for _ in range(reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            img = render()
            t1 = time.perf_counter()
            step_rest(img)
            bwd += time.perf_counter() - t1
            fwd += t1 - t0
    finally:
        wp.capture_launch = wctx.capture_launch = launch
    cu = ctypes.CDLL("libcuda.so.1")
    nodes = {}
    for gid, graph in graphs.items():
        count = ctypes.c_size_t(0)
        cu.cuGraphGetNodes(graph.graph, None, ctypes.byref(count))
        handles = (ctypes.c_void_p * count.value)()
        cu.cuGraphGetNodes(graph.graph, handles, ctypes.byref(count))
        kinds = collections.Counter()
        for h in handles:
            kind = ctypes.c_int(0)
            cu.cuGraphNodeGetType(ctypes.c_void_p(h), ctypes.byref(kind))
            kinds[_NODE_TYPES.get(kind.value, kind.value)] += 1
        nodes[gid] = kinds
    return fwd / reps * 1e6, bwd / reps * 1e6, spent[1] / reps, spent[0] / reps * 1e6, nodes, graphs


def _launch_cost(graphs, reps):
    """{prelude: [median host us of one ``wp.capture_launch`` per graph]}: each of ``graphs``
    launched alone, ``reps`` times, after a device sync and then a prelude on the host:
    nothing, a 150 us busy-wait, a pass over 8 MiB of numpy and a 20,000-entry dict (the
    CPU's caches left cold, as a training step's Python leaves them), or a 1 ms sleep (see
    the module notes)."""
    import warp as wp

    stream = wp.Stream(wp.get_device("cuda"), cuda_stream=torch.cuda.current_stream().cuda_stream)
    big, table = np.ones(8 << 20, dtype=np.uint8), {i: str(i) for i in range(20000)}

    def busy(us):
        t = time.perf_counter()
        while time.perf_counter() - t < us * 1e-6:
            pass

    preludes = {"nothing": lambda: None, "150 us busy-wait": lambda: busy(150),
                "8 MiB numpy + dict walk": lambda: (big.sum(), sum(len(v) for v in table.values())),
                "1 ms sleep": lambda: time.sleep(1e-3)}
    costs = {}
    for name, prelude in preludes.items():
        costs[name] = []
        for graph in graphs:
            spent = []
            for _ in range(reps):
                torch.cuda.synchronize()
                prelude()
                t = time.perf_counter()
                wp.capture_launch(graph, stream=stream)
                spent.append(time.perf_counter() - t)
            costs[name].append(float(np.median(spent)) * 1e6)
    torch.cuda.synchronize()
    return costs


def _steady(step, device=None, cuda_option=None):
    """Runs ``step`` past the warm-up in which graphs are captured; ``cuda_option`` names an
    option that measures the CUDA path (SystemExit on another ``device``)."""
    if cuda_option is not None and device.type != "cuda":
        raise SystemExit(f"{cuda_option} measures the CUDA path")
    for _ in range(25):
        step()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300_000)
    ap.add_argument("--lib", default="arc", choices=("arc", "arc_fused"),
                    help="torch's activations (arc) or the kernel's (arc_fused), as bench_train_step")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cameras", type=int, default=1)
    ap.add_argument("--regime", default="small", choices=sorted(bts.REGIMES))
    ap.add_argument("--width", type=int, default=1920)
    ap.add_argument("--height", type=int, default=1080)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--cprofile", type=int, default=0, metavar="N",
                    help="cProfile N steps instead (host Python by function; GPU or CPU)")
    ap.add_argument("--host-breakdown", type=int, default=0, metavar="N",
                    help="time N steps by part of the torch path instead (see the module notes)")
    ap.add_argument("--timeline", type=int, default=0, metavar="N",
                    help="median host us from the call's start of each part's entry and exit, over N steps (CUDA)")
    ap.add_argument("--forward-host", type=int, default=0, metavar="N",
                    help="host us per render call and backward call over N steps, and the graphs' nodes (CUDA)")
    ap.add_argument("--launch-cost", type=int, default=0, metavar="N",
                    help="with --forward-host: each graph launched alone N times after each host prelude (CUDA)")
    args = ap.parse_args()
    device = torch.device(args.device)
    libs, _ = bts._renderers([args.lib], args.width, args.height)
    lib = libs[args.lib]
    raw, viewmats, ks = bts.make_scene(args.n, args.regime, args.width, args.height, args.cameras)
    params = lib.params(raw, device)
    viewmats, ks = viewmats.to(device), ks.to(device)
    # bench_train_step's L1 loss (its cotangent is contiguous, as a training loss's is)
    target = torch.rand(args.cameras, args.height, args.width, 3, device=device,
                        generator=torch.Generator(device).manual_seed(0))

    def render():
        return lib.render(params, viewmats, ks)

    def rest(img):
        (img - target).abs().mean().backward()
        for p in params.values():
            p.grad = None

    def step():
        rest(render())

    for _ in range(5):
        step()
    if args.cprofile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.cprofile):
            step()
        prof.disable()
        if device.type == "cuda":
            torch.cuda.synchronize()
        stats = pstats.Stats(prof)
        stats.sort_stats("tottime").print_stats(30)
        stats.sort_stats("cumulative").print_stats(40)
        return
    if args.forward_host:
        _steady(step, device, "--forward-host")
        fwd, bwd, launches, launch_us, nodes, graphs = _forward_host(render, rest, args.forward_host)
        print(f"N={args.n} C={args.cameras} {args.regime} {args.lib}: render call {fwd:.1f} us, loss.backward() "
              f"call {bwd:.1f} us, {launches:.2f} graph launches per step taking {launch_us:.1f} us")
        # one forward and one backward graph per frame in flight: group equal compositions
        shapes = collections.Counter(tuple(sorted(kinds.items())) for kinds in nodes.values())
        for shape, count in shapes.items():
            print(f"  {count} graph(s) of {sum(n for _, n in shape)} nodes: {dict(shape)}")
        if args.launch_cost:
            print("host us of one graph launch alone, after a sync and then on the host:")
            for prelude, costs in _launch_cost(list(graphs.values()), args.launch_cost).items():
                cells = ", ".join(f"{sum(nodes[gid].values())} nodes {us:.1f}" for gid, us in zip(graphs, costs))
                print(f"  {prelude:24s} {cells}")
        return
    if args.timeline:
        _steady(step, device, "--timeline")
        print(f"N={args.n} C={args.cameras} {args.regime} {args.lib}: median host us from the start of the render "
              "call / of loss.backward(), > entry, < exit")
        for phase, us, label in _timeline(render, rest, args.timeline):
            print(f"  {phase:8s} {us:8.1f}  {label}")
        return
    if args.host_breakdown:
        _steady(step)
        parts = _host_breakdown(step, args.host_breakdown)
        if device.type == "cuda":
            torch.cuda.synchronize()
        print(f"N={args.n} C={args.cameras} {args.regime}: host us per forward + backward, by part "
              "(callers include their callees)")
        for name, us in sorted(parts.items(), key=lambda kv: -kv[1]):
            print(f"  {name:40s} {us:9.1f}")
        return
    if device.type == "cpu":
        total, host = _host_overhead_cpu(step, args.reps)
        print(f"N={args.n} C={args.cameras} {args.width}x{args.height}: {total:.3f} ms per forward + "
              f"backward, of which {host:.3f} ms outside Warp kernels (host overhead)")
        return
    steps = 5
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    # device-only rows (kernels, copies, fills) have no CPU time; the ops that launched
    # them carry the same device time again, so they are left out
    busy = sum(e.self_device_time_total for e in prof.key_averages() if e.self_cpu_time_total == 0) / steps / 1e3
    print(f"N={args.n} C={args.cameras} {args.regime}: GPU busy {busy:.3f} ms per forward + backward "
          "(kernels, copies and fills, summed; torch's activations and loss included)")
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))


if __name__ == "__main__":
    main()
