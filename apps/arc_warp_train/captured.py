"""`arc-warp train`'s steps replayed from CUDA graphs (its default on CUDA; `--eager` runs
every step in Python, as `Trainer.train_step` always did).

What one graph holds: a whole training step, the function `CapturedSteps` builds per
`StepKey`, which reads and writes only memory that outlives it:

- the step's learning rates: 0-d float32 tensors the optimizer reads on the device; the
  means' exponential decay is worked out inside the graph from a step counter on the
  device, so the schedule needs no new capture;
- the render of the step's views (`model.render_views` with device viewmats, Ks and
  lens coefficients: a graph cannot hold host cameras) from static buffers, into which
  the host copies the next views' images and cameras (two device-to-device copies)
  before each replay;
- the loss, its backward and the densification statistics' accumulation;
- the optimizer step: `SparseGaussianAdam(capturable=True)` for every `--optimizer`
  ("adam" steps densely with torch's bias correction, as "fused_adam": torch's Adam
  cannot skip a step on the device), with ``skip=`` the render's status, so a step
  whose render overflowed its sort (an image that lacked Gaussians) or found bad inputs
  updates nothing (arc_warp's overflow rule);
- the metrics (loss, MSE) into a ring of `log_every` rows, the largest tile-intersection
  total of its renders and the count of skipped steps, all on the device.

A graph is captured after one eager run of its function (the warm-up torch's CUDA graph
notes ask for, which is that step itself), and captured again:

- after a densification, or a checkpoint load: every graph reads the parameters, their
  Adam moments and the statistics by address, and `densify.refine` replaces them all;
  the graphs are dropped once the trainer holds other tensors;
- when the active SH degree changes, and when the statistics stop (refine_stop): both
  are part of the key, and graphs of the old key are dropped (the schedule never
  returns to them);
- for a batch of another image size, camera model or lens: one graph per key, at most
  `MAX_GRAPHS`; the steps of further keys run eagerly (a note says so once);
- after an overflow: `check`, at the trainer's logging interval, compares each graph's
  largest total with the capacity its sort was captured with, grows the renderer's sort
  (arc_warp's own rule, `GaussianRenderer.capacity_for`) and drops that graph, with a
  note naming the steps skipped.

On the CPU there are no graphs: `StepGraph` then calls the step function at each
replay, so the logic around it (static buffers, device learning rates, counter, ring,
recapture triggers) is the CUDA one and runs in the CPU tests.
"""

from __future__ import annotations

import collections
import copy
from dataclasses import dataclass

import torch
import warp as wp

from arc_warp import GaussianRenderer
from arc_warp_torch import capture_step, default_context

from . import densify as dens
from .losses import photometric_loss
from .model import render_views

MAX_GRAPHS = 4  # graphs kept per set of parameters (distinct image sizes / camera models)
CAPTURE_MODE = "thread_local"  # other threads (the viewer's) may use CUDA during a capture
CAMERA_FLOATS = 25  # a camera row on the device: viewmat (16) and K (9), then the lens


@dataclass(frozen=True)
class StepKey:
    """What a graph is specialised to besides the memory it reads: the batch's image size,
    camera count, camera model and lens coefficients per camera (0: none), the active
    SH degree, and whether the step gathers densification statistics."""

    width: int
    height: int
    cameras: int
    model: str
    lens: int
    sh_degree: int
    accumulate: bool


class StepBuffers:
    """The memory a step function reads and writes besides the trainer's: the batch's
    images [C, H, W, 3] and camera rows [C, CAMERA_FLOATS + lens] (the host copies the
    next views into them), the largest tile-intersection total of its renders (0-d
    int32), what it holds by address (the parameters, optimizer and statistics), and
    the RenderStatus of its last render (a host object, set by each call)."""

    def __init__(self, key: StepKey, device):
        self.image = torch.zeros(key.cameras, key.height, key.width, 3, device=device)
        self.cameras = torch.zeros(key.cameras, CAMERA_FLOATS + key.lens, device=device)
        self.peak = torch.zeros((), dtype=torch.int32, device=device)
        self.held = None
        self.status = None


class StepGraph:
    """One step function (`fn`, of `buffers`), recorded once and replayed.

    On CUDA `capture()` records it in a CUDA graph, its arc_warp renders inside
    `arc_warp_torch.capture_step`, on `stream` (the step ran once before, eagerly, which
    the capture needs); `replay()` launches the graph on torch's current stream. On the
    CPU, which has no graphs, `replay()` calls `fn`. Until captured, `replay()` calls
    `fn` on every device.
    """

    def __init__(self, key: StepKey, context, fn, buffers: StepBuffers, stream=None):
        self.key, self.context, self.fn, self.buffers, self.stream = key, context, fn, buffers, stream
        self.recorded = False
        self.capacity = 0  # tile intersections its render's sort holds in the graph
        self._graph = self._captured = None

    def capture(self) -> None:
        """Record `fn` (on the CPU: note the capacity its render holds now)."""
        if self.context.device.type == "cuda":
            # capture_step reads the status of earlier renders without a wait: none may be in flight
            torch.cuda.synchronize(self.context.device)
            graph = torch.cuda.CUDAGraph()
            # torch.cuda.graph, less its empty_cache: a recapture would return torch's
            # whole cache to the driver and allocate it again
            with torch.cuda.stream(self.stream):
                graph.capture_begin(capture_error_mode=CAPTURE_MODE)
                try:
                    with capture_step(self.context, CAPTURE_MODE) as captured:
                        self.fn()
                except BaseException:
                    try:
                        graph.capture_end()
                    except RuntimeError:  # the capture is invalid already; report the first error
                        pass
                    raise
                graph.capture_end()
            self._graph, self._captured = graph, captured
        self.capacity = self.buffers.status.capacity  # the capture's render, or on the CPU the last
        self.recorded = True

    def replay(self) -> None:
        if self._graph is not None:
            self._graph.replay()
        else:
            self.fn()

    def check(self) -> None:
        """The checks of the last replay's render (wait for it): ValueError for bad inputs,
        RuntimeError for an overflow of its sort (`CapturedStep.check`)."""
        if self._captured is not None:
            self._captured.check()
        elif self.buffers.status is not None:
            self.buffers.status.check("captured render")

    def renderers(self) -> list:
        """The renderers of its size (its render's, and others' of that size)."""
        k = self.key
        return [r for r in self.context.workspace.renderers()
                if (r.width, r.height, r.num_cameras, r.sh_coeffs) == (k.width, k.height, k.cameras,
                                                                         (k.sh_degree + 1) ** 2)]


class CapturedSteps:
    """`Trainer.train_step` on graphs (see the module notes): `step()` runs the trainer's
    next step, `check()` belongs at its logging interval, `reset()` after its parameters,
    optimizer or step were set anew (a checkpoint loaded).

    The trainer's optimizer must be `model.make_optimizer(..., capturable=True)`: this
    puts its learning rates on the device. `note(message)` reports what the run should
    know (a fallback to eager steps, an overflow); `events` lists (step, reason) of each
    capture and `captures` counts them by reason."""

    def __init__(self, trainer, note):
        self.trainer, self.note = trainer, note
        device = trainer.device
        self.context = default_context(device)
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.counter = torch.zeros((), dtype=torch.int64, device=device)  # the step, on the device
        self.lrs = {group["name"]: torch.zeros((), dtype=torch.float32, device=device)
                    for group in trainer.optimizer.param_groups}
        self.ring = torch.zeros(trainer.cfg.log_every, 2, device=device)  # (loss, MSE) by step % rows
        self.skipped = torch.zeros((), dtype=torch.int64, device=device)  # steps the optimizer skipped
        self.graphs: dict[StepKey, StepGraph] = {}  # of the tensors the trainer holds now
        self.captures = collections.Counter()  # graphs captured, by reason
        self.events = []  # (step, reason) of each capture
        self.replays = self.eager_steps = 0
        self._why = {}  # StepKey -> why its graph was dropped: the reason of its next capture
        self._next_why = None  # the reason of the next capture of a key not in _why
        self._last = None  # the graph of the last step
        self._rows = {}  # (training view, lens) -> its camera row on the device
        self._skipped_seen = 0
        self._noted = False
        self.reset()

    def reset(self) -> None:
        """Drops the graphs; installs the device learning rates in the trainer's optimizer
        (the means' is worked out by every step) and sets the counter to its step."""
        t = self.trainer
        if self.graphs:
            self._drop_all("parameters loaded")
        lrs = t._lrs(t.step)
        for group in t.optimizer.param_groups:
            group["lr"] = self.lrs[group["name"]].fill_(lrs[group["name"]])
        self.counter.fill_(t.step)

    def step(self) -> torch.Tensor:
        """The trainer's next step (its views, schedule and densification) -> its [2]
        (loss, MSE): a row of the ring, valid for `log_every` steps."""
        t, cfg = self.trainer, self.trainer.cfg
        step = t.step
        views = t._next_views(cfg.batch_size)
        key = self._key(views, step)
        self._forget_stale(key)
        graph = self.graphs.get(key)
        if graph is None:
            buffers = StepBuffers(key, t.device)
            graph = self.graphs[key] = StepGraph(key, self.context, self._step_function(key, buffers), buffers,
                                                 self.stream)
        self._fill(graph.buffers, key.lens, views)
        if graph.recorded:
            graph.replay()
            self.replays += 1
        else:
            self._run_and_capture(graph, step)
        self._last = graph
        if dens.step_post_backward(t.params, t.optimizer, t.stats, cfg.densify, step, t.scene_scale,
                                   t.densify_gen) is not None:  # refined: new parameters, moments, statistics
            self._drop_all("densified")
        t.step += 1
        return self.ring[step % self.ring.shape[0]]

    def check(self) -> None:
        """Right after a step (the trainer's logging interval; one wait): the last render's
        checks (ValueError for bad inputs raises), then each graph whose renders needed more
        tile intersections than its sort holds grows the sort and is dropped (captured
        again at its next step), with a note of the steps skipped."""
        if self._last is None:
            return
        try:
            self._last.check()
        except RuntimeError:  # an overflow: in its graph's peak too
            pass
        graphs = [g for g in self.graphs.values() if g.recorded]
        values = torch.stack([self.skipped, *(g.buffers.peak.to(torch.int64) for g in graphs)]).tolist()
        skipped, new = values[0], values[0] - self._skipped_seen
        self._skipped_seen = skipped
        overflowed = [(g, peak) for g, peak in zip(graphs, values[1:]) if peak > g.capacity]
        for graph, peak in overflowed:
            capacity = GaussianRenderer.capacity_for(peak)
            for renderer in graph.renderers():
                if (renderer.capacity or 0) < capacity:
                    renderer.resize(renderer.num_gaussians, capacity)
            self._drop(graph.key, "overflow")
            self.note(f"step {self.trainer.step}: a captured render had {peak} tile intersections, more "
                      f"than the {graph.capacity} its sort holds ({new} steps skipped since the last check); "
                      f"the sort grows to {capacity}, and the step is captured again")
        if new and not overflowed:
            self.note(f"step {self.trainer.step}: {new} steps were skipped since the last check (their "
                      "renders found bad inputs or overflowed)")

    def summary(self) -> dict:
        """What the run's metrics report of the graphs (reads the skipped count: a wait)."""
        return {"captures": sum(self.captures.values()),
                "recaptures": sum(n for why, n in self.captures.items() if why != "first step"),
                "capture_reasons": dict(self.captures), "replayed_steps": self.replays,
                "eager_steps": self.eager_steps, "skipped_steps": int(self.skipped)}

    # ------------------------------------------------------------------ internals

    def _key(self, views: list, step: int) -> StepKey:
        t = self.trainer
        batch = [t._train[i] for i in views]
        _, height, width, _ = batch[0].image.shape
        lens = max(0 if v.distortion is None else v.distortion.shape[1] for v in batch)
        return StepKey(width, height, len(batch), batch[0].model, lens, t.sh_degree_at(step),
                       step < t.cfg.densify.refine_stop)

    def _forget_stale(self, key: StepKey) -> None:
        """Drops the graphs that no step will replay: all of them if the trainer holds other
        parameters, optimizer or statistics than they read (replaced by other code than
        the densification `step` knows of); those of another SH degree or statistics phase
        than `key`'s (the schedule never returns to them)."""
        if not self.graphs:
            return
        t = self.trainer
        params, optimizer, grad2d = next(iter(self.graphs.values())).buffers.held
        if optimizer is not t.optimizer or grad2d is not t.stats.grad2d or \
                any(t.params[name] is not p for name, p in params.items()):
            self._drop_all("parameters replaced")
            return
        old = [k for k in self.graphs if (k.sh_degree, k.accumulate) != (key.sh_degree, key.accumulate)]
        for k in old:
            self._drop(k)
        if old:
            self._why, self._next_why = {}, "sh degree" if old[0].sh_degree != key.sh_degree else "statistics stop"

    def _drop(self, key: StepKey, why: str | None = None) -> None:
        del self.graphs[key]
        if why is not None:
            self._why[key] = why
        if self._last is not None and self._last.key == key:
            self._last = None

    def _drop_all(self, why: str) -> None:
        """Drops every graph; each key, and the next new one, is captured again for `why`."""
        self._why = dict.fromkeys(self.graphs, why)
        self._next_why = why
        self.graphs.clear()
        self._last = None

    def _run_and_capture(self, graph: StepGraph, step: int) -> None:
        """This step eagerly, then its graph captured, unless MAX_GRAPHS are held (the
        steps of this key then run eagerly)."""
        self.eager_steps += 1
        capture = sum(g.recorded for g in self.graphs.values()) < MAX_GRAPHS
        if capture and self.stream is not None:  # the warm-up on a side stream, as torch's CUDA graph notes ask
            current = torch.cuda.current_stream(self.trainer.device)
            self.stream.wait_stream(current)
            with torch.cuda.stream(self.stream):
                graph.fn()
            current.wait_stream(self.stream)
        else:
            graph.fn()
        if not capture:
            if not self._noted:
                self._noted = True
                self.note(f"step {step}: more than {MAX_GRAPHS} image sizes or camera models since the last "
                          "densification; the steps of the others run eagerly")
            return
        graph.capture()
        why = self._why.pop(graph.key, None) or self._next_why or \
            ("first step" if not self.events else "view size or camera")
        self._next_why = None
        self.captures[why] += 1
        self.events.append((step, why))

    def _row(self, view: int, lens: int) -> torch.Tensor:
        """Training view `view`'s camera as a [1, CAMERA_FLOATS + lens] row on the device:
        viewmat, K, and its lens coefficients (zeros for a view without)."""
        row = self._rows.get((view, lens))
        if row is None:
            v = self.trainer._train[view]
            coefficients = torch.zeros(1, lens) if v.distortion is None else v.distortion
            row = torch.cat([v.viewmat.reshape(1, 16), v.K.reshape(1, 9), coefficients], dim=1)
            row = self._rows[(view, lens)] = row.to(self.trainer.device)
        return row

    def _fill(self, buffers: StepBuffers, lens: int, views: list) -> None:
        """The step's views into its static buffers (device-to-device copies)."""
        t = self.trainer
        if len(views) == 1:
            buffers.image.copy_(t._train[views[0]].image)
            buffers.cameras.copy_(self._row(views[0], lens))
        else:
            torch.cat([t._train[i].image for i in views], out=buffers.image)
            torch.cat([self._row(i, lens) for i in views], out=buffers.cameras)

    def _step_function(self, key: StepKey, buffers: StepBuffers):
        """The whole step of `key` on the tensors the trainer holds now, as a function of no
        arguments that reads and writes only memory that outlives it: `buffers`, the
        trainer's tensors and this object's."""
        t, cfg = self.trainer, self.trainer.cfg
        c, w, h = key.cameras, key.width, key.height
        # held by address, as a CUDA graph holds them: a CPU "replay" after a
        # densification would still update these
        params, optimizer, stats = dict(t.params), t.optimizer, copy.copy(t.stats)
        buffers.held = (params, optimizer, stats.grad2d)
        image = buffers.image
        viewmats = buffers.cameras[:, :16].view(c, 4, 4)
        Ks = buffers.cameras[:, 16:25].view(c, 3, 3)
        lens = buffers.cameras[:, 25:] if key.lens else None
        n = params["means"].shape[0]
        base, factor = cfg.lr_means * t.scene_scale, cfg.lr_means_final_factor
        counter, lr_means, ring, skipped, peak = self.counter, self.lrs["means"], self.ring, self.skipped, buffers.peak
        sparse, absgrad = cfg.optimizer == "sparse_adam", cfg.densify.absgrad

        def step():
            # Trainer._lrs on the device: lr_means * scene_scale * factor^min(step / steps, 1)
            lr_means.copy_(base * torch.pow(factor, torch.clamp(counter.to(torch.float64) / cfg.steps, max=1.0)))
            colors, _, meta = render_views(params, viewmats, Ks, w, h, key.sh_degree, t._background, cfg.reduce,
                                           absgrad, key.model, lens)
            loss, _, _ = photometric_loss(colors, image, cfg.ssim_lambda)
            loss.backward()
            if key.accumulate:
                means2d = meta["means2d"]
                stats.accumulate(means2d.absgrad if absgrad else means2d.grad, meta["radii"], w, h)
            mse = ((colors.detach().clamp(0.0, 1.0) - image) ** 2).mean()
            status = meta["status"]
            flags = wp.to_torch(status.flags)  # (C, FLAG_SLOTS): the total, then the checks
            skipped.add_((flags[:, 1:] != 0).any())  # what the optimizer's skip reads
            torch.maximum(peak, flags[:, 0].amax(), out=peak)
            if sparse:  # visible in any view: radii > 0
                optimizer.step((meta["radii"] > 0).all(dim=-1).any(dim=0), n, skip=status)
            else:
                optimizer.step(skip=status)
            optimizer.zero_grad(set_to_none=True)
            slot = torch.remainder(counter, ring.shape[0]).view(1)
            ring.index_copy_(0, slot, torch.stack([loss.detach(), mse]).view(1, 2))
            counter.add_(1)
            buffers.status = status

        return step
