"""Forward, backward and training step through the torch API: arc_warp against its peers.

Every library renders the same random scene (Gaussians filling the frustum, SH degree 3)
through its public torch function, with parameters stored as in 3DGS training (raw
quaternions, log-scales, logit-opacities) and activations in torch (except ``arc_fused``
and Faster-GS, whose kernels apply them). Per library, N, size regime and camera count C
it reports, as medians after warm-up:

- forward / backward / step: GPU time (CUDA events) of the render, of ``loss.backward()``
  and of render + L1 + backward + ``torch.optim.Adam`` (arc_warp also with its fused
  ``SparseGaussianAdam``, dense and sparse), each synchronised on its own;
- loop: ms per torch-Adam step over ``reps`` steps run back to back with one sync at the
  end, as a training loop that syncs only to log runs them (host work of one step can
  then overlap device work of the previous one);
- host ms: ``time.perf_counter`` around the Python calls of the forward + backward,
  read BEFORE synchronising, i.e. what the CPU spends issuing the work, including any
  wait for the device inside the calls; for arc also "wait ms", the part spent blocked
  in Warp's event wait (``wp.synchronize_event``: the wait for a render's checks, in its
  forward, or in its backward where they are deferred, which is then long done), and "in
  arc_warp code": the time inside ``rasterization()`` and its autograd backward, less
  that wait (the user's activations, loss and torch's autograd engine excluded), per
  synchronised step and per step of the loop (where the host runs ahead of the device
  without a sync between steps, as in training: its caches and clocks stay warm);
- forward / backward "with the host hidden" (CUDA only): the same calls queued behind a
  5 ms spin kernel (``torch.cuda._sleep``), timed from the end of the spin: the device
  time of the call when the host has queued it ahead, as in a training loop, without the
  host's latency before its first launch. A library that waits for the device inside
  the call (Faster-GS's count readbacks) shows the host work after each wait;
- peak MiB: the device memory a torch-Adam training step holds at once, the same work
  for every library, read after its torch-Adam steps (before arc_warp's and Faster-GS's
  own optimizers run), by phase: the larger of (forward + backward: torch's
  ``max_memory_allocated`` over them plus Warp's memory in use after them) and
  (``Adam.step``: torch's peak over it plus Warp's memory in use then), Warp's counted
  for arc_warp only, less its memory in use before the library's runs (a repeated step
  allocates no Warp arrays, so what it holds after a step is its peak in the step; the
  pool's own high-water mark spans the whole process, earlier N and libraries included).
  Each term bounds what is live in its phase. Torch memory that earlier runs left
  allocated (another library's caches, say) is taken off: ``memory_allocated`` before the
  library's parameters are made, less the target image (part of every library's step),
  so a library's peak does not depend on which ran before it. The JSON also keeps ``peak_sum_mib``, torch's
  peak over all the runs plus Warp's high-water mark (0.5's figure: it adds two peaks that
  never coincide).

Libraries are imported if available and skipped otherwise: ``arc`` (arc_warp_torch;
``arc_fused`` the same as ``arc`` on the raw parameters: raw quaternions, log-scales and
logit-opacities passed with ``scales_activation="exp"``, ``opacities_activation="sigmoid"``,
so the projection kernel applies exp / sigmoid / normalisation and torch runs none of them),
``gsplat`` and ``gsplat_packed`` (gsplat's ``rasterization``; rows are labelled with its
version, e.g. ``gsplat-1.6.0``; 1.5.3 and 1.6.0 share the module name, so each runs in
its own process with its own PYTHONPATH) and ``fastergs`` (Faster-GS's
``FasterGSCudaBackend.torch_bindings.diff_rasterize``, one call per camera). Each library
gets the parameters in the layout its authors train with: Faster-GS takes the raw
parameters (it applies exp / sigmoid / normalisation in its kernels) with SH split into
``[N,1,3]`` and ``[N,15,3]`` tensors and opacities ``[N,1]``; its step is also timed with its
own ``FusedAdam``. Faster-GS copies counts to the host inside its forward, so its host
time includes waiting for the device. An optimizer table times one fused
``SparseGaussianAdam`` step against ``torch.optim.Adam`` over the same parameters.

``--check-peers`` renders a small scene with every library and prints, against arc, the
max |image difference| and the cosine of each parameter's gradient (on the raw
parameters, under a random cotangent): run it first after building a peer (``--libs arc
arc_fused`` checks the fused activations against torch's).

Regimes: ``small`` splats of 0.3-1.5 pixels (few pixels each) and ``large`` ones of 4-16
pixels at their depth.

Usage (GPU)::

    python benchmarks/bench_train_step.py --n 100000 300000 --regimes small large --cameras 1 4
    python benchmarks/bench_train_step.py --n 1000000 --libs arc gsplat --reps 10 --json out.json
    python benchmarks/bench_train_step.py --check-peers --libs arc gsplat fastergs
    python benchmarks/bench_train_step.py --n 100000 300000 --regimes small --cameras 1 --libs arc arc_fused fastergs

Smoke test on the CPU (tiny scene, arc only, host-time table)::

    python benchmarks/bench_train_step.py --device cpu --tiny
"""

import argparse
import functools
import json
import sys
import time
from typing import Callable, NamedTuple

import numpy as np
import torch

SH_DEGREE = 3
REGIMES = {"small": (0.3, 1.5), "large": (4.0, 16.0)}  # std-dev range in pixels at the depth
NEAR, FAR = 0.01, 1e10  # arc's and gsplat's default planes, passed to Faster-GS too
# sh_rest: Faster-GS keeps SH degrees 1-3 apart, at 3DGS's 1/20 of the DC rate
# untimed steps first: compilation, calibration, first allocations, and (arc) the steps
# until torch's allocator repeats its pointers and CUDA graphs are captured
WARMUP = 16
LRS = {"means": 1.6e-4, "quats": 1e-3, "log_scales": 5e-3, "logit_opacities": 5e-2, "sh": 2.5e-3,
       "sh_rest": 2.5e-3 / 20}


def _logit(p):
    return np.log(p / (1.0 - p))


def make_scene(n, regime, width, height, cameras, seed=0):
    """float32 tensors of n Gaussians filling the frustum of camera 0, and C cameras (the
    first one at the origin looking down +z, the others turned by a few degrees)."""
    rng = np.random.default_rng(seed)
    f = 0.5 * width / np.tan(np.radians(30.0))
    z = rng.uniform(2.0, 12.0, n)
    u, v = rng.uniform(0, width, n), rng.uniform(0, height, n)
    means = np.stack([(u - width / 2) / f * z, (v - height / 2) / f * z, z], 1)
    lo, hi = REGIMES[regime]
    scales = np.exp(rng.uniform(np.log(lo), np.log(hi), (n, 3))) * z[:, None] / f
    sh = np.zeros((n, (SH_DEGREE + 1) ** 2, 3))
    sh[:, 0] = rng.uniform(-1.5, 1.5, (n, 3))
    sh[:, 1:] = rng.standard_normal((n, (SH_DEGREE + 1) ** 2 - 1, 3)) * 0.15
    raw = {"means": means, "quats": rng.standard_normal((n, 4)), "log_scales": np.log(scales),
           "logit_opacities": _logit(rng.uniform(0.05, 0.95, n)), "sh": sh}
    viewmats = np.repeat(np.eye(4)[None], cameras, 0)
    for c in range(1, cameras):
        a = np.radians(2.0 * c)
        viewmats[c, :3, :3] = [[np.cos(a), 0, np.sin(a)], [0, 1, 0], [-np.sin(a), 0, np.cos(a)]]
    ks = np.repeat(np.array([[f, 0, width / 2], [0, f, height / 2], [0, 0, 1]])[None], cameras, 0)
    f32 = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    return {k: f32(v) for k, v in raw.items()}, f32(viewmats), f32(ks)


class Library(NamedTuple):
    """How the harness drives one renderer.

    render(params, viewmats [C,4,4], Ks [C,3,3]) -> [C, H, W, 3] image; params: the leaf
    tensors made by ``params(raw, device)`` (the library's training layout); optimizers:
    the ``_optimizer`` kinds timed in its training step."""

    render: Callable
    params: Callable
    optimizers: tuple = ("torch_adam",)


def _renderers(libs, width, height):
    """({label: Library}, notes); labels carry peer versions, e.g. ``gsplat-1.6.0``."""
    out, notes = {}, []
    for label, fused in (("arc", False), ("arc_fused", True)):
        if label not in libs:
            continue
        from arc_warp_torch import RenderContext, rasterization

        def arc(p, viewmats, ks, fused=fused, contexts={}):  # noqa: B006 - per device
            dev = p["means"].device
            if dev not in contexts:  # made once, outside the timed steps (calibrates here)
                contexts[dev] = RenderContext(dev)
            if fused:  # raw parameters: exp / sigmoid / normalisation in the projection kernel
                args, options = (p["means"], p["quats"], p["log_scales"], p["logit_opacities"], p["sh"]), FUSED
            else:
                args, options = _activated(p), {}
            t0 = time.perf_counter()
            try:
                return rasterization(*args, viewmats, ks, width, height, sh_degree=SH_DEGREE,
                                     context=contexts[dev], **options)[0]
            finally:
                _ARC_HOST[0] += (time.perf_counter() - t0) * 1e3

        out[label] = Library(arc, _params, ("torch_adam", "fused_adam", "sparse_adam"))
    if {"gsplat", "gsplat_packed"} & set(libs):
        try:
            import gsplat

            for name, packed in (("gsplat", False), ("gsplat_packed", True)):
                if name in libs:
                    render = lambda p, vm, ks, packed=packed: gsplat.rasterization(  # noqa: E731
                        *_activated(p), vm, ks, width, height, sh_degree=SH_DEGREE, packed=packed,
                        rasterize_mode="classic")[0]
                    out[f"gsplat-{gsplat.__version__}" + ("-packed" if packed else "")] = \
                        Library(render, _params)
            notes.append(f"gsplat {gsplat.__version__}")
        except Exception as e:  # noqa: BLE001 - optional peer
            notes.append(f"gsplat unavailable ({type(e).__name__}: {e})")
    if "fastergs" in libs:
        peer, note = _peer_renderers(width, height)
        out.update(peer)
        notes.append(note)
    return out, notes


def _peer_renderers(width, height):
    """Faster-GS through its torch module (``diff_rasterize``), if importable.

    Called as its Renderer.render_image_training does: raw means, log-scales, unnormalised
    wxyz quaternions and opacity logits [N,1]; SH as sh0 [N,1,3] + rest [N,15,3] with all
    16 bases active; classic mode (proper_antialiasing False: 0.3 px dilation, as arc and
    gsplat classic); black background; arc's near/far planes. It renders one camera per
    call into a [3,H,W] image, so C cameras are C calls, stacked and permuted to [C,H,W,3]."""
    try:
        from FasterGSCudaBackend.torch_bindings import RasterizerSettings, diff_rasterize
    except Exception as e:  # noqa: BLE001 - optional peer
        return {}, f"Faster-GS unavailable ({type(e).__name__}: {e})"
    cache = {}

    def settings(viewmats, ks):
        """One RasterizerSettings per camera, made on first use (host copies) and kept with
        the camera tensors, so the pointers in the key cannot be reused."""
        key = (viewmats.data_ptr(), ks.data_ptr(), viewmats.shape[0])
        if key not in cache:
            dev = viewmats.device
            vm, k = viewmats.detach().double().cpu(), ks.detach().double().cpu()
            cams = [RasterizerSettings(
                w2c=vm[c].float().contiguous().to(dev),  # rows 0-2 are read as float4: [R | t]
                cam_position=torch.linalg.inv(vm[c])[:3, 3].float().contiguous().to(dev),
                bg_color=torch.zeros(3, device=dev), active_sh_bases=(SH_DEGREE + 1) ** 2,
                width=width, height=height, focal_x=float(k[c, 0, 0]), focal_y=float(k[c, 1, 1]),
                center_x=float(k[c, 0, 2]), center_y=float(k[c, 1, 2]), near_plane=NEAR,
                far_plane=FAR, proper_antialiasing=False) for c in range(vm.shape[0])]
            cache[key] = (viewmats, ks, cams)
        return cache[key][2]

    no_densification = torch.empty(0)  # size 0: its backward skips the densification stats

    def fastergs(p, viewmats, ks):
        imgs = [diff_rasterize(p["means"], p["log_scales"], p["quats"], p["logit_opacities"], p["sh"],
                               p["sh_rest"], no_densification, s) for s in settings(viewmats, ks)]
        return (torch.stack(imgs) if len(imgs) > 1 else imgs[0][None]).permute(0, 2, 3, 1)

    def params(raw, device):
        """Faster-GS's training layout (contiguous: its kernels read raw pointers)."""
        split = dict(raw, logit_opacities=raw["logit_opacities"][:, None], sh=raw["sh"][:, :1],
                     sh_rest=raw["sh"][:, 1:])
        return _params({k: v.contiguous() for k, v in split.items()}, device)

    return {"fastergs": Library(fastergs, params, ("torch_adam", "fastergs_adam"))}, "Faster-GS"


def _params(raw, device):
    return {k: v.to(device).clone().requires_grad_(True) for k, v in raw.items()}


def _raw_layout(tensors):
    """A library's parameters (or their gradients) in make_scene's raw layout: Faster-GS's
    split SH [N,1,3] + [N,15,3] joined to [N,16,3], its opacities [N,1] flattened to [N]."""
    out = dict(tensors)
    if "sh_rest" in out:
        out["sh"] = torch.cat([out["sh"], out.pop("sh_rest")], 1)
    out["logit_opacities"] = out["logit_opacities"].reshape(-1)
    return out


FUSED = {"scales_activation": "exp", "opacities_activation": "sigmoid"}  # arc_fused's options


def _activated(p):
    return (p["means"], torch.nn.functional.normalize(p["quats"], dim=-1), torch.exp(p["log_scales"]),
            torch.sigmoid(p["logit_opacities"]), p["sh"])


_WAITS = [0.0]  # ms spent in wp.synchronize_event since the last reset
_ARC_HOST = [0.0]  # ms spent in arc_warp_torch's calls (rasterization and its backward) since the last reset


def _count_arc_backward():
    """Measurement only: time arc_warp_torch's autograd backward (run inside loss.backward())."""
    from arc_warp_torch._autograd import _RenderGaussians

    backward = _RenderGaussians.backward

    def timed(ctx, *grads):
        t0 = time.perf_counter()
        try:
            return backward(ctx, *grads)
        finally:
            _ARC_HOST[0] += (time.perf_counter() - t0) * 1e3

    _RenderGaussians.backward = staticmethod(timed)


def _count_waits():
    """Measurement only: time every ``wp.synchronize_event`` (arc_warp's one wait per forward)."""
    import warp as wp

    sync = wp.synchronize_event

    def timed(event):
        t0 = time.perf_counter()
        try:
            return sync(event)
        finally:
            _WAITS[0] += (time.perf_counter() - t0) * 1e3

    wp.synchronize_event = timed


class Timer:
    """CUDA events on a GPU; on the CPU the wall time (which is then also the busy time)."""

    def __init__(self, cuda):
        self.cuda = cuda

    def __enter__(self):
        if self.cuda:
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.start.record()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.host_ms = (time.perf_counter() - self.t0) * 1e3  # before any sync
        if self.cuda:
            self.end.record()

    def device_ms(self):
        if not self.cuda:
            return self.host_ms
        self.end.synchronize()
        return self.start.elapsed_time(self.end)


def _optimizer(kind, params):
    """kind: "torch_adam"; arc's "fused_adam" / "sparse_adam" (SparseGaussianAdam); or
    "fastergs_adam" (Faster-GS's FusedAdam, one tensor per group as its Model builds it)."""
    groups = [{"params": [v], "lr": LRS[k]} for k, v in params.items()]
    if kind == "torch_adam":
        return torch.optim.Adam(groups, eps=1e-15)
    if kind == "fastergs_adam":
        from FasterGSCudaBackend.torch_bindings import FusedAdam

        return FusedAdam(groups, lr=0.0, eps=1e-15)
    from arc_warp_torch import SparseGaussianAdam

    return SparseGaussianAdam(groups, lr=0.0, eps=1e-15, bias_correction=True)


def bench_library(lib, raw, viewmats, ks, target, device, reps, before):
    """Median forward / backward / step times (one step per optimizer of ``lib``), host
    time per forward + backward, ms; peak memory of the runs up to the torch-Adam steps
    (see the module notes), MiB."""
    cuda = device.type == "cuda"
    params = lib.params(raw, device)
    fwd, bwd, host, wait, arc_host = [], [], [], [], []
    for i in range(reps + WARMUP):
        _WAITS[0] = _ARC_HOST[0] = 0.0
        with Timer(cuda) as tf:
            img = lib.render(params, viewmats, ks)
        loss = (img - target).abs().mean()
        with Timer(cuda) as tb:
            loss.backward()
        for p in params.values():
            p.grad = None
        if i >= WARMUP:
            fwd.append(tf.device_ms())
            bwd.append(tb.device_ms())
            host.append(tf.host_ms + tb.host_ms)
            wait.append(_WAITS[0])
            arc_host.append(_ARC_HOST[0] - _WAITS[0])
    del img, loss  # not held through the optimizer runs and their memory peaks
    row = {"forward_ms": float(np.median(fwd)), "backward_ms": float(np.median(bwd)),
           "host_ms": float(np.median(host)), "wait_ms": float(np.median(wait)),
           "arc_host_ms": float(np.median(arc_host))}
    if cuda:
        row.update(_host_hidden(lib, params, viewmats, ks, target, reps))
    for kind in lib.optimizers:
        opt = _optimizer(kind, params)

        def step():
            img = lib.render(params, viewmats, ks)
            loss = (img - target).abs().mean()
            loss.backward()
            if kind == "sparse_adam":
                opt.step(_visible_guess(params), params["means"].shape[0])
            else:
                opt.step()
            opt.zero_grad(set_to_none=True)

        steps = []
        for i in range(reps + WARMUP):
            with Timer(cuda) as ts:
                step()
            if i >= WARMUP:
                steps.append(ts.device_ms())
        row[f"step_{kind}_ms"] = float(np.median(steps))
        if kind == "torch_adam":
            # a training loop syncs only to log: reps steps back to back, one sync at the end
            _WAITS[0] = _ARC_HOST[0] = 0.0
            with Timer(cuda) as tl:
                for _ in range(reps):
                    step()
            row["loop_ms"] = tl.device_ms() / reps
            row["arc_host_loop_ms"] = (_ARC_HOST[0] - _WAITS[0]) / reps
            row["peak_sum_mib"] = _peak_mib(device, before)
            row.update(_phase_peak_mib(lib, params, opt, viewmats, ks, target, device, before))
    return row


def _visible_guess(params):
    """Rows in front of the camera (the benchmark's stand-in for radii > 0)."""
    return params["means"].detach()[:, 2] > 0.01


SPIN_MS = 5.0  # longer than any library's host time to queue one forward or backward


@functools.cache
def _spin_cycles_per_ms() -> float:
    """``torch.cuda._sleep`` cycles per ms on the current device (timed once)."""
    cycles = 10_000_000
    torch.cuda._sleep(cycles)  # warm-up
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / start.elapsed_time(end)


def event_ms(call):
    """ms between CUDA events recorded on the current stream before and after ``call()``,
    and its result."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    result = call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end), result


def behind_spin(call):
    """Device ms of ``call()`` queued behind a SPIN_MS spin kernel, from the spin's end
    (see the module notes), and its result."""
    torch.cuda.synchronize()
    torch.cuda._sleep(int(SPIN_MS * _spin_cycles_per_ms()))
    return event_ms(call)


def _host_hidden(lib, params, viewmats, ks, target, reps):
    """Median forward and backward ms with the host hidden behind a spin (module notes)."""
    fwd, bwd = [], []
    for i in range(reps + 3):
        ms, img = behind_spin(lambda: lib.render(params, viewmats, ks))
        loss = (img - target).abs().mean()
        bms, _ = behind_spin(loss.backward)
        for p in params.values():
            p.grad = None
        if i >= 3:
            fwd.append(ms)
            bwd.append(bms)
    return {"forward_hidden_ms": float(np.median(fwd)), "backward_hidden_ms": float(np.median(bwd))}


def bench_optimizer(n, device, reps):
    """One fused SparseGaussianAdam step (dense and sparse, half the rows visible) against
    torch.optim.Adam over the 3DGS parameters of n Gaussians, ms."""
    cuda = device.type == "cuda"
    raw = {"means": torch.randn(n, 3), "quats": torch.randn(n, 4), "log_scales": torch.randn(n, 3),
           "logit_opacities": torch.randn(n), "sh": torch.randn(n, 16, 3)}
    visible = torch.rand(n, device=device) < 0.5
    out = {}
    for kind in ("torch_adam", "fused_adam", "sparse_adam"):
        params = _params(raw, device)
        opt = _optimizer(kind, params)
        times = []
        for i in range(reps + 2):
            for p in params.values():
                p.grad = torch.ones_like(p)
            with Timer(cuda) as t:
                opt.step(visible, n) if kind == "sparse_adam" else opt.step()
            if i >= 2:
                times.append(t.device_ms())
        out[kind] = float(np.median(times))
    return out


def _peak_reset(device):
    if device.type != "cuda":
        return
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)


def _phase_peak_mib(lib, params, opt, viewmats, ks, target, device, before):
    """One torch-Adam step measured by phase (see the module notes), MiB: ``peak_mib``, the
    larger of ``peak_forward_backward_mib`` and ``peak_adam_mib``. ``before``: (torch
    bytes earlier runs left allocated, Warp bytes in use before the library's runs or
    None)."""
    if device.type != "cuda":
        return {"peak_mib": float("nan")}
    import warp as wp

    torch_before, warp_before = before

    def warp_in_use():
        if warp_before is None:
            return 0
        return max(wp.get_mempool_used_mem_current(wp.device_from_torch(device)) - warp_before, 0)

    _peak_reset(device)
    loss = (lib.render(params, viewmats, ks) - target).abs().mean()
    loss.backward()
    torch.cuda.synchronize(device)
    # Warp's memory in use stands for its peak: a repeated step allocates no Warp arrays
    # (tests/test_workspace.py), and the pool's high-water mark spans the whole process
    forward_backward = (torch.cuda.max_memory_allocated(device) - torch_before + warp_in_use()) / 2**20
    _peak_reset(device)
    opt.step()
    torch.cuda.synchronize(device)
    optimizer = (torch.cuda.max_memory_allocated(device) - torch_before + warp_in_use()) / 2**20
    opt.zero_grad(set_to_none=True)
    return {"peak_mib": max(forward_backward, optimizer), "peak_forward_backward_mib": forward_backward,
            "peak_adam_mib": optimizer}


def _peak_mib(device, before):
    if device.type != "cuda":
        return float("nan")
    import warp as wp

    torch_before, warp_before = before
    torch_peak = torch.cuda.max_memory_allocated(device) - torch_before
    warp_peak = 0 if warp_before is None else wp.get_mempool_used_mem_high(wp.device_from_torch(device)) - warp_before
    return (torch_peak + max(warp_peak, 0)) / 2**20


def check_peers(libs, width, height, device, n=2000, cameras=2):
    """Each library against arc on a small scene (both regimes, ``cameras`` cameras): max and
    mean |image difference|, and per raw parameter the cosine and norm ratio of its gradient
    to arc's under one random cotangent. Prints a line per library and regime; returns
    {regime: {label: {...}}}."""
    if "arc" not in libs or len(libs) < 2:
        print("# --check-peers needs arc and at least one peer available")
        return {}
    out = {}
    for regime in REGIMES:
        raw, viewmats, ks = make_scene(n, regime, width, height, cameras, seed=1)
        viewmats, ks = viewmats.to(device), ks.to(device)
        cotangent = torch.rand(cameras, height, width, 3, device=device,
                               generator=torch.Generator(device).manual_seed(1))
        got = {}
        for name, lib in libs.items():
            params = lib.params(raw, device)
            img = lib.render(params, viewmats, ks)
            (img * cotangent).sum().backward()
            got[name] = img.detach(), _raw_layout({k: v.grad for k, v in params.items()})
        ref_img, ref_grads = got.pop("arc")
        out[regime] = {}
        for name, (img, grads) in got.items():
            diff = (img - ref_img).abs()
            res = {"max_abs_image_diff": float(diff.max()), "mean_abs_image_diff": float(diff.mean())}
            for k, g in ref_grads.items():
                a, b = grads[k].double().flatten(), g.double().flatten()
                res[f"cos_{k}"] = float(torch.nn.functional.cosine_similarity(a, b, dim=0))
                res[f"norm_ratio_{k}"] = float(a.norm() / b.norm())
            out[regime][name] = res
            print(f"# check {regime} N={n} {width}x{height} C={cameras} {name} vs arc: image max "
                  f"{res['max_abs_image_diff']:.2e} mean {res['mean_abs_image_diff']:.2e}; grad cos / "
                  "norm ratio " + ", ".join(f"{k} {res['cos_' + k]:.5f}/{res['norm_ratio_' + k]:.3f}"
                                            for k in ref_grads), flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny scene and image (smoke test, any device)")
    ap.add_argument("--n", type=int, nargs="+", default=[100_000, 300_000, 1_000_000, 3_000_000])
    ap.add_argument("--regimes", nargs="+", choices=sorted(REGIMES), default=["small", "large"])
    ap.add_argument("--cameras", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--libs", nargs="+", default=["arc", "gsplat", "gsplat_packed", "fastergs"],
                    choices=["arc", "arc_fused", "gsplat", "gsplat_packed", "fastergs"])
    ap.add_argument("--width", type=int, default=1920)
    ap.add_argument("--height", type=int, default=1080)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--no-optim", action="store_true", help="skip the optimizer table")
    ap.add_argument("--check-peers", action="store_true",
                    help="only compare every library with arc on a small scene (image, gradients)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    import warp as wp

    wp.init()
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: use --device cpu --tiny for a smoke test", file=sys.stderr)
        return 2
    if args.tiny:
        args.n, args.width, args.height, args.reps = [min(args.n[0], 300)], 64, 48, min(args.reps, 5)
    import warp as wp

    wp.config.log_level = wp.LOG_WARNING if hasattr(wp, "LOG_WARNING") else wp.config.log_level
    if args.check_peers:
        args.width, args.height = min(args.width, 320), min(args.height, 240)
    libs, notes = _renderers(args.libs, args.width, args.height)
    _count_waits()
    if any(lib.startswith("arc") for lib in args.libs):
        _count_arc_backward()
    print(f"# torch API, {args.width}x{args.height}, SH {SH_DEGREE}, device "
          f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}; " + "; ".join(notes))
    if args.check_peers:
        checks = check_peers(libs, args.width, args.height, device, n=min(args.n[0], 2000))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"check": checks, "notes": notes, "args": vars(args)}, f, indent=1)
        return 0
    rows = []
    header = ("| N | regime | C | library | forward ms | backward ms | step (torch Adam) ms | "
              "step (own fused Adam) ms | step (sparse) ms | loop ms/step | host ms fwd+bwd | of which wait ms | "
              "in arc_warp code, less the wait, ms | the same in the loop, ms | peak MiB |")
    print(header + "\n|" + "---|" * 15)
    for n in args.n:
        for regime in args.regimes:
            for c in args.cameras:
                raw, viewmats, ks = make_scene(n, regime, args.width, args.height, c)
                viewmats, ks = viewmats.to(device), ks.to(device)
                target = torch.rand(c, args.height, args.width, 3, device=device,
                                    generator=torch.Generator(device).manual_seed(0))
                for name, lib in libs.items():
                    _peak_reset(device)
                    # only arc_warp allocates from Warp's pool (None: count none of it)
                    warp_before = wp.get_mempool_used_mem_current(wp.device_from_torch(device)) \
                        if device.type == "cuda" and name.startswith("arc") else None
                    # what earlier runs left allocated (the target image is this run's)
                    torch_before = torch.cuda.memory_allocated(device) - target.nbytes if device.type == "cuda" else 0
                    try:
                        row = bench_library(lib, raw, viewmats, ks, target, device, args.reps,
                                            (torch_before, warp_before))
                    except Exception as e:  # noqa: BLE001 - report, go on with the others
                        print(f"| {n} | {regime} | {c} | {name} | failed: {type(e).__name__}: {e} |")
                        continue
                    row.update(n=n, regime=regime, cameras=c, library=name)
                    rows.append(row)
                    arc = name.startswith("arc")
                    cell = lambda *ks: next((f"{row[k]:.3f}" for k in ks if k in row), "-")  # noqa: E731
                    print(f"| {n} | {regime} | {c} | {name} | {cell('forward_ms')} | {cell('backward_ms')} | "
                          f"{cell('step_torch_adam_ms')} | {cell('step_fused_adam_ms', 'step_fastergs_adam_ms')} | "
                          f"{cell('step_sparse_adam_ms')} | {cell('loop_ms')} | {cell('host_ms')} | "
                          f"{cell('wait_ms') if arc else '-'} | {cell('arc_host_ms') if arc else '-'} | "
                          f"{cell('arc_host_loop_ms') if arc else '-'} | {row['peak_mib']:.0f} |",
                          flush=True)
    hidden = [r for r in rows if "forward_hidden_ms" in r]
    if hidden:
        print("\n| N | regime | C | library | forward ms, host hidden | backward ms, host hidden |\n|---|---|---|---|---|---|")
        for r in hidden:
            print(f"| {r['n']} | {r['regime']} | {r['cameras']} | {r['library']} | {r['forward_hidden_ms']:.3f} | "
                  f"{r['backward_hidden_ms']:.3f} |")
    optim = {}
    if not args.no_optim and "arc" in args.libs:
        print("\n| N | torch Adam ms | fused Adam ms | sparse Adam (50 % visible) ms |\n|---|---|---|---|")
        for n in args.n:
            optim[n] = bench_optimizer(n, device, args.reps)
            o = optim[n]
            print(f"| {n} | {o['torch_adam']:.3f} | {o['fused_adam']:.3f} | {o['sparse_adam']:.3f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "optimizer": optim, "notes": notes, "args": vars(args)}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
