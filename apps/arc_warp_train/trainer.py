"""3D Gaussian Splatting training loop on arc_warp (Adam, L1 + D-SSIM, densification)."""

import contextlib
import dataclasses
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from arc_warp.files import write_atomically
from arc_warp.ply import write_ply

from . import densify as dens
from .captured import CapturedSteps
from .checkpoint import check_checkpoint, dataset_fingerprint, read_checkpoint
from .datasets import Dataset
from .distributed import DistContext
from .losses import mse_to_psnr, photometric_loss, psnr, ssim
from .model import OPTIMIZERS, init_params, make_optimizer, random_points, render_views, to_ply
from .outputs import comparison, ensure_dir, plot_psnr, write_image, write_json
from .run_folder import VIEWS_DIR, claim_output_folder, run_results, view_image_name


@dataclass
class TrainConfig:
    """Training settings (3DGS defaults; learning rates per parameter).

    lr_means is multiplied by the scene scale and decays exponentially to
    lr_means * lr_means_final_factor at `steps`. init_points is used when the dataset has
    no point cloud: random points in a cube of half-size init_extent * scene_scale.
    batch_size: training views per step, the global batch: the loss is the mean over these
    views (all training images must then share one size and camera model: one render
    call per step); with data-parallel ranks each
    renders batch_size / world_size of them (which must divide evenly).
    sh_degree grows by one every sh_degree_interval steps. device None picks cuda when
    available. Evaluation every eval_every steps, checkpoint every checkpoint_every
    steps (0 = only at the end). cpu_threads, when set and training on the CPU, is passed
    to torch.set_num_threads (1 is fastest for tiny images on a busy machine). check_sync:
    with several ranks, verify at every evaluation and checkpoint that parameters, Adam
    state and RNG states are bitwise equal on all ranks (RuntimeError if not).
    optimizer: "adam" (torch.optim.Adam, the default until the GPU benchmark ranks them),
    "fused_adam" (one Warp launch per step for all parameters, torch Adam's updates up to
    float32 rounding) or "sparse_adam" (that kernel over the Gaussians visible in the
    step's views only); one optimizer with a named param group per parameter, see
    model.make_optimizer.
    capture: None (default) replays each step from a CUDA graph on CUDA (captured.py) and
    runs it eagerly on the CPU; False always eagerly (`--eager`: the Python loop of
    `Trainer.train_step`); True captured on any device (on the CPU, which has no graphs,
    the captured path's logic with its step function called in place of a graph: for
    tests). Data-parallel ranks always step eagerly. The captured path steps every
    optimizer kind with SparseGaussianAdam (see model.make_optimizer's capturable).
    """

    steps: int = 30000
    batch_size: int = 1
    sh_degree: int = 3
    sh_degree_interval: int = 1000
    ssim_lambda: float = 0.2
    lr_means: float = 1.6e-4
    lr_means_final_factor: float = 0.01
    lr_quats: float = 1e-3
    lr_scales: float = 5e-3
    lr_opacities: float = 5e-2
    lr_sh0: float = 2.5e-3
    lr_shN: float = 2.5e-3 / 20
    init_points: int = 100_000
    init_extent: float = 0.3
    init_opacity: float = 0.1
    init_scale: float = 1.0
    densify: dens.DensifyConfig = field(default_factory=dens.DensifyConfig)
    eval_every: int = 5000
    checkpoint_every: int = 0
    log_every: int = 10
    seed: int = 0
    device: str = None
    reduce: str = "arc"
    progress: bool = True
    cpu_threads: int = None
    check_sync: bool = False
    optimizer: str = "adam"
    capture: bool = None

    def __post_init__(self):
        if isinstance(self.densify, dict):
            self.densify = dens.DensifyConfig(**self.densify)
        for name in ("steps", "batch_size", "sh_degree_interval", "eval_every", "log_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TrainConfig.{name} must be an int >= 1, got {value!r}")
        if isinstance(self.checkpoint_every, bool) or not isinstance(self.checkpoint_every, int) \
                or self.checkpoint_every < 0:
            raise ValueError("TrainConfig.checkpoint_every must be an int >= 0, got "
                             f"{self.checkpoint_every!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"TrainConfig.optimizer must be one of {OPTIMIZERS}, got "
                             f"{self.optimizer!r}")
        if not 0 <= self.sh_degree <= 3:
            raise ValueError(f"TrainConfig.sh_degree must be in 0..3, got {self.sh_degree!r}")
        if self.capture not in (None, True, False):
            raise ValueError(f"TrainConfig.capture must be None, True or False, got {self.capture!r}")


@dataclass
class ViewTensors:
    """C views of one camera model as the renderer takes them: image (C,H,W,3) float32 on
    the trainer's device; viewmat (C,4,4), K (C,3,3) and distortion (C,K) float32 on the
    host (the renderer reads host cameras without a device sync); `model` "pinhole" or
    "fisheye"; distortion in OpenCV's order for the model
    (`arc_warp.Distortion.coefficients`), None when no view has one."""

    image: torch.Tensor
    viewmat: torch.Tensor
    K: torch.Tensor
    model: str = "pinhole"
    distortion: torch.Tensor = None

    @classmethod
    def of(cls, view, device) -> "ViewTensors":
        """One `datasets.View`."""
        lens = None if view.distortion is None else torch.tensor(
            [view.distortion.coefficients(view.model)], dtype=torch.float32)
        return cls(torch.as_tensor(view.image, device=device)[None],
                   torch.as_tensor(view.world_to_camera, dtype=torch.float32)[None],
                   torch.as_tensor(view.K, dtype=torch.float32)[None], view.model, lens)

    @staticmethod
    def cat(items) -> "ViewTensors":
        """One batch of views of one model (zero coefficients for views without distortion)."""
        first = items[0]
        if len(items) == 1:
            return first
        lenses = [v.distortion for v in items]
        width = next((d.shape[1] for d in lenses if d is not None), 0)
        return ViewTensors(torch.cat([v.image for v in items]), torch.cat([v.viewmat for v in items]),
                           torch.cat([v.K for v in items]), first.model,
                           None if not width else torch.cat([torch.zeros(1, width) if d is None else d
                                                             for d in lenses]))


class TrainingInterrupted(Exception):
    """Ctrl-C stopped training at `step`; a checkpoint to resume from was saved at `path`."""

    def __init__(self, step: int, path: str):
        super().__init__(f"interrupted at step {step}; checkpoint saved to {path}")
        self.step, self.path = step, path


@dataclass
class TrainResult:
    """Final held-out metrics (PSNR dB, SSIM), Gaussian count, wall seconds, the
    evaluation history, the files written and the training figures of this process
    (`Trainer.training_summary`)."""

    psnr: float
    ssim: float
    num_gaussians: int
    wall_s: float
    history: list
    files: dict
    training: dict = None


class Trainer:
    """Optimises Gaussians on `dataset`; writes outputs under `out_dir`.

    Data-parallel when `dist` (default: `DistContext.current()`, i.e. the initialised
    default process group, if any) has several ranks: every rank builds the same model,
    renders its share of each step's batch and applies the rank-averaged gradients, and
    the densification statistics are summed over ranks before each refinement. `train`,
    `save_checkpoint`, `state_dict` and `check_consistency` are then collective (call them
    on every rank); `export` and the evaluation history belong to rank 0.

    Steps run eagerly or from CUDA graphs (`TrainConfig.capture`; `captured` holds the
    `captured.CapturedSteps` then, else None). `notes` lists what the run was told of
    its step mode (fallbacks to eager steps, overflows).
    """

    def __init__(self, dataset: Dataset, cfg: TrainConfig, out_dir, dist: DistContext = None):
        if not dataset.train:
            raise ValueError("Trainer: the dataset has no training views")
        self.data, self.cfg, self.out_dir = dataset, cfg, os.fspath(out_dir)
        self.dist = DistContext.current() if dist is None else dist
        if cfg.batch_size % self.dist.world_size:
            raise ValueError(f"TrainConfig.batch_size ({cfg.batch_size}) must be a multiple of "
                             f"the number of data-parallel ranks ({self.dist.world_size})")
        self.local_batch = cfg.batch_size // self.dist.world_size
        sizes = {v.image.shape for v in dataset.train}
        if cfg.batch_size > 1 and len(sizes) > 1:
            raise ValueError(f"batch_size {cfg.batch_size} > 1 needs training images of one "
                             f"size, got {sorted(sizes)}")
        models = {v.model for v in dataset.train}
        if cfg.batch_size > 1 and len(models) > 1:  # one rasterization call per step
            raise ValueError(f"batch_size {cfg.batch_size} > 1 needs training views of one camera "
                             f"model, got {sorted(models)}; train with a batch of 1, or with "
                             "--undistort (every view a pinhole)")
        self.device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if self.dist.backend == "nccl" and self.device.type != "cuda":
            raise ValueError(f"the NCCL process group needs a CUDA device, got {self.device}")
        self.scene_scale = dataset.scene_scale
        if cfg.cpu_threads and self.device.type == "cpu":
            torch.set_num_threads(cfg.cpu_threads)
        self.view_gen = torch.Generator().manual_seed(cfg.seed)
        self.densify_gen = torch.Generator().manual_seed(cfg.seed + 1)
        if dataset.points is not None and len(dataset.points):
            points, colors = dataset.points, dataset.point_colors
        else:
            points, colors = random_points(cfg.init_points, cfg.init_extent * self.scene_scale,
                                           torch.Generator().manual_seed(cfg.seed + 2))
        self.params = init_params(points, colors, cfg.sh_degree, cfg.init_opacity,
                                  cfg.init_scale, self.device)
        # Ranks build the same model from the same seeds; the broadcast also covers a
        # GPU kNN (scale init) whose bits could differ between processes.
        self.dist.broadcast_(*self.params.values())
        self.notes = []
        capture = self._captures()
        self.optimizer = make_optimizer(self.params, self._lrs(0), cfg.optimizer, capturable=capture)
        self._background = torch.as_tensor(dataset.background, dtype=torch.float32,
                                           device=self.device)
        self.stats = dens.DensifyStats(len(points), self.device)
        self.step, self.history, self.train_log = 0, [], []
        self.stop_requested = False  # set by a Ctrl-C handler: stop after the current step
        self.on_step = None  # optional hook(trainer, train_step result) after each step (the viewer)
        self._perm = torch.empty(0, dtype=torch.long)
        self._cursor = 0
        self._train = [ViewTensors.of(v, self.device) for v in dataset.train]
        self._test = [ViewTensors.of(v, self.device) for v in dataset.test]
        self.timing = {"steps": 0, "seconds": 0.0}  # the steps this process ran and their time
        self.captured = CapturedSteps(self, self._note) if capture else None

    def _captures(self) -> bool:
        """Whether steps replay from graphs (TrainConfig.capture), with a note where they
        cannot."""
        capture = self.cfg.capture if self.cfg.capture is not None else self.device.type == "cuda"
        if capture and self.dist.enabled:
            self._note("data-parallel ranks step eagerly (their gradients' all-reduce runs between the "
                       "backward and the optimizer step, outside any graph)")
            return False
        return capture

    def _note(self, message: str) -> None:
        """Tell the run (rank 0 prints it, above the progress bar)."""
        self.notes.append(message)
        if self.dist.is_main:
            from tqdm.auto import tqdm

            tqdm.write(f"note: {message}", file=sys.stderr)

    def _lrs(self, step: int) -> dict:
        c = self.cfg
        decay = c.lr_means_final_factor ** min(step / c.steps, 1.0)
        return {"means": c.lr_means * self.scene_scale * decay, "quats": c.lr_quats,
                "scales": c.lr_scales, "opacities": c.lr_opacities, "sh0": c.lr_sh0,
                "shN": c.lr_shN}

    def sh_degree_at(self, step: int) -> int:
        return min(step // self.cfg.sh_degree_interval, self.cfg.sh_degree)

    def render(self, views: ViewTensors, sh_degree: int, absgrad: bool = False):
        """Render `views` (their size, cameras and lens) -> render_views' results."""
        return render_views(self.params, views.viewmat, views.K, views.image.shape[2],
                            views.image.shape[1], sh_degree, self._background, self.cfg.reduce,
                            absgrad, views.model, views.distortion)

    def _next_views(self, count: int) -> list:
        """The next `count` training-view indices: an endless sequence of random
        permutations of all views (identical on every rank: same seed, same calls)."""
        n, out = len(self._train), []
        while len(out) < count:
            if self._cursor >= self._perm.numel():
                self._perm = torch.randperm(n, generator=self.view_gen)
                self._cursor = 0
            out.append(int(self._perm[self._cursor]))
            self._cursor += 1
        return out

    def train_step(self) -> torch.Tensor:
        """One optimisation step on the next batch_size training views (this rank renders
        its contiguous share) -> [2] device tensor (loss, MSE) over the whole batch. Nothing
        in a step waits for the device except refinement steps; read the metrics at the
        logging interval (`metrics_of`). Captured (`self.captured`), the step is replayed
        from a graph and the tensor is a row of a ring the graph writes, valid for
        cfg.log_every steps; eagerly, it runs in Python here."""
        if self.captured is not None:
            return self.captured.step()
        cfg = self.cfg
        views = self._next_views(cfg.batch_size)
        start = self.dist.rank * self.local_batch
        batch = ViewTensors.cat([self._train[i] for i in views[start:start + self.local_batch]])
        image = batch.image
        lrs = self._lrs(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lrs[group["name"]]
        absgrad = cfg.densify.absgrad
        colors, _, meta = self.render(batch, self.sh_degree_at(self.step), absgrad)
        means2d = meta["means2d"]
        if means2d.requires_grad:
            means2d.retain_grad()
        loss, _, _ = photometric_loss(colors, image, cfg.ssim_lambda)
        loss.backward()
        if self.step < cfg.densify.refine_stop:
            key = "means2d_absgrad" if absgrad else "means2d_grad"
            grad2d = meta.get(key)
            if grad2d is None:
                grad2d = means2d.absgrad if absgrad else means2d.grad
            self.stats.accumulate(grad2d, meta["radii"], colors.shape[2], colors.shape[1])
        mse = ((colors.detach().clamp(0.0, 1.0) - image) ** 2).mean()
        extras = [torch.stack([loss.detach(), mse])]
        sparse = cfg.optimizer == "sparse_adam"
        if sparse:  # visible in any view of any rank: all ranks update the same rows
            extras.append((meta["radii"] > 0).all(dim=-1).any(dim=0).to(mse.dtype))
        averaged = self.dist.average_gradients(self.params, torch.cat(extras))
        if sparse:
            self.optimizer.step(averaged[2:] > 0, self.params["means"].shape[0])
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if dens.refines_at(cfg.densify, self.step):
            # Each rank holds the statistics of its own views; decide on the sums.
            self.dist.sum_(self.stats.grad2d, self.stats.count)
        dens.step_post_backward(self.params, self.optimizer, self.stats, cfg.densify,
                                self.step, self.scene_scale, self.densify_gen)
        self.step += 1
        return averaged[:2]

    @staticmethod
    def metrics_of(steps: list) -> tuple:
        """(mean loss, mean PSNR) of `train_step` results; reads them back (one sync)."""
        values = torch.stack(steps).tolist()
        return (float(np.mean([v[0] for v in values])),
                float(np.mean([mse_to_psnr(v[1]) for v in values])))

    @torch.no_grad()
    def evaluate(self, views=None) -> dict:
        """Mean PSNR / SSIM over held-out views (training views if there are none), or over
        `views` (`ViewTensors` or `datasets.View`s: e.g. another loading of the capture),
        each over its full frame with its own camera, with the full active SH degree; also
        returns the renders as (H,W,3) numpy arrays."""
        views = views if views is not None else (self._test or self._train)
        views = [v if isinstance(v, ViewTensors) else ViewTensors.of(v, self.device) for v in views]
        sh = self.sh_degree_at(self.step)
        ps, ss, renders = [], [], []
        for view in views:
            colors, _, _ = self.render(view, sh)
            colors = colors.clamp(0.0, 1.0)
            ps.append(psnr(colors, view.image))
            ss.append(float(ssim(colors, view.image)))
            renders.append(colors[0].cpu().numpy())
        return {"psnr": float(np.mean(ps)), "ssim": float(np.mean(ss)), "renders": renders,
                "view_psnr": ps, "view_ssim": ss}

    def _record_eval(self):
        ev = self.evaluate()
        entry = {"step": self.step, "psnr": ev["psnr"], "ssim": ev["ssim"],
                 "num_gaussians": int(self.params["means"].shape[0])}
        if self.history and self.history[-1]["step"] == self.step:
            self.history[-1] = entry
        else:
            self.history.append(entry)
        return ev

    def train(self, stop_at: int = None) -> None:
        """Run steps until `stop_at` (default cfg.steps), evaluating every eval_every steps and
        checkpointing every checkpoint_every steps into out_dir/checkpoint.pt."""
        from tqdm.auto import tqdm

        cfg = self.cfg
        main = self.dist.is_main
        end = cfg.steps if stop_at is None else min(stop_at, cfg.steps)
        bar = tqdm(total=cfg.steps, initial=self.step, disable=not (cfg.progress and main),
                   dynamic_ncols=True, desc="train")
        window = []
        clock = self._clock()  # the steps' time: evaluations and checkpoints left out
        while self.step < end and not self.stop_requested:
            result = self.train_step()
            self.timing["steps"] += 1
            window.append(result)
            if self.on_step is not None:
                self.on_step(self, result)
            bar.update(1)
            if self.step % cfg.log_every == 0 or self.step == end:
                mean_loss, mean_psnr = self.metrics_of(window)
                if self.captured is not None:
                    self.captured.check()
                self.train_log.append({"step": self.step, "loss": mean_loss, "psnr": mean_psnr})
                bar.set_postfix(loss=f"{mean_loss:.4f}", psnr=f"{mean_psnr:.2f}",
                                n=int(self.params["means"].shape[0]))
                window = []
            evaluates = self.step % cfg.eval_every == 0 or self.step == cfg.steps
            saves = cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0
            if evaluates or saves:
                self.timing["seconds"] += self._clock() - clock
            if evaluates:
                if cfg.check_sync:
                    self.check_consistency()
                if main:  # the other ranks wait at the barrier
                    ev = self._record_eval()
                    bar.write(f"step {self.step}: held-out PSNR {ev['psnr']:.2f} dB, SSIM "
                              f"{ev['ssim']:.4f}, {self.history[-1]['num_gaussians']} Gaussians")
                self.dist.barrier()
            if saves:
                self.save_checkpoint(os.path.join(ensure_dir(self.out_dir), "checkpoint.pt"))
            if evaluates or saves:
                clock = self._clock()
        self.timing["seconds"] += self._clock() - clock
        bar.close()

    def _clock(self) -> float:
        """time.perf_counter() once the device has done the work queued (the steps' time)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def training_summary(self) -> dict:
        """This process's training figures: the steps it ran, their seconds (evaluations and
        checkpoints left out) and steps per second, the step mode and, when captured, the
        graphs' counts (`CapturedSteps.summary`)."""
        steps, seconds = self.timing["steps"], self.timing["seconds"]
        summary = {"steps": steps, "seconds": seconds, "it_per_s": steps / seconds if seconds else None,
                   "mode": "eager" if self.captured is None else "captured"}
        if self.captured is not None:
            summary.update(self.captured.summary())
        return summary

    def state_dict(self) -> dict:
        """Collective with several ranks: the densification statistics are stored summed
        over ranks, so a checkpoint resumes on any number of ranks. "optimizer" is the
        state dict of the one optimizer (a param group per parameter, in PARAM_NAMES order;
        checkpoint.read_checkpoint converts the per-parameter "optimizers" of older files)."""
        stats = self.stats.state_dict()
        self.dist.sum_(*stats.values())
        optimizer = self.optimizer.state_dict()
        for group in optimizer["param_groups"]:  # captured: the device learning rates as numbers
            group["lr"] = float(group["lr"])
        return {
            "step": self.step,
            "params": {k: v.detach().clone() for k, v in self.params.items()},
            "optimizer": optimizer,
            "stats": stats,
            "view_gen": self.view_gen.get_state(),
            "densify_gen": self.densify_gen.get_state(),
            "perm": self._perm.clone(),
            "view_cursor": self._cursor,
            "history": list(self.history),
            "train_log": list(self.train_log),
            "config": dataclasses.asdict(self.cfg),
            "dataset": dataset_fingerprint(self.data),
        }

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        self.params = {k: torch.nn.Parameter(v.to(self.device).contiguous())
                       for k, v in state["params"].items()}
        capturable = self.captured is not None
        self.optimizer = make_optimizer(self.params, self._lrs(self.step), self.cfg.optimizer, capturable)
        self.optimizer.load_state_dict(state["optimizer"])
        for group in self.optimizer.param_groups:  # a checkpoint of the other step mode saved the other
            group["capturable"] = capturable
        stats = {k: v.to(self.device) for k, v in state["stats"].items()}
        if not self.dist.is_main:  # rank 0 carries the saved sums; the others restart at 0
            stats = {k: torch.zeros_like(v) for k, v in stats.items()}
        self.stats.load_state_dict(stats)
        self.view_gen.set_state(state["view_gen"])
        self.densify_gen.set_state(state["densify_gen"])
        self._perm = state["perm"].clone()
        # Checkpoints from before batched steps drew one view per step from `perm`.
        n = len(self._train)
        self._cursor = int(state.get("view_cursor", self.step % n or n))
        self.history, self.train_log = list(state["history"]), list(state["train_log"])
        if self.captured is not None:
            self.captured.reset()

    def save_checkpoint(self, path) -> None:
        """Everything needed to resume bit-for-bit: parameters, Adam moments, densification
        statistics, RNG states, step and logs. Collective with several ranks (rank 0
        writes; with cfg.check_sync the ranks are first checked for equality)."""
        state = self.state_dict()
        if self.cfg.check_sync:
            self.check_consistency()
        if self.dist.is_main:
            with write_atomically(path) as tmp:
                torch.save(state, tmp)
        self.dist.barrier()

    def check_consistency(self) -> None:
        """Collective: RuntimeError unless parameters, Adam state, RNG states and the view
        order are bitwise equal on all ranks (a checksum per tensor is compared; no-op for
        a single process)."""
        tensors = {f"params.{k}": v for k, v in self.params.items()}
        for name, p in self.params.items():
            for key, value in self.optimizer.state.get(p, {}).items():
                tensors[f"adam.{name}.{key}"] = torch.as_tensor(value)
        tensors["view_gen"] = self.view_gen.get_state()
        tensors["densify_gen"] = self.densify_gen.get_state()
        tensors["view_order"] = torch.cat([self._perm, torch.tensor([self._cursor, self.step])])
        self.dist.check_consistent(tensors)

    def load_checkpoint(self, path) -> None:
        """Resume from `path` after checking that it fits this run (checkpoint.py)."""
        state = read_checkpoint(path)
        check_checkpoint(state, path, self.data, self.cfg)
        self.load_state_dict(state)

    def export(self) -> dict:
        """Write point_cloud.ply, test_views/view_<i>.png (ground truth | render | error, full
        size, labelled), psnr.png and metrics.json (means and per-view PSNR / SSIM) into
        out_dir, each atomically, and delete view images of an earlier export that this one
        did not write; returns {kind: path} and the final metrics. Not collective: with
        several ranks call it on rank 0 only."""
        out = ensure_dir(self.out_dir)
        ev = self._record_eval()
        files = {"ply": os.path.join(out, "point_cloud.ply"),
                 "plot": os.path.join(out, "psnr.png"),
                 "metrics": os.path.join(out, "metrics.json"),
                 "images": os.path.join(out, VIEWS_DIR)}
        write_ply(files["ply"], to_ply(self.params))
        ensure_dir(files["images"])
        views, names = (self._test, self.data.test) if self._test else \
            (self._train, self.data.train)
        per_view = []
        for i, (view, render) in enumerate(zip(views, ev["renders"])):
            gt = view.image[0].cpu().numpy()
            image = view_image_name(i)
            write_image(os.path.join(files["images"], image),
                        comparison(gt, render, ev["view_psnr"][i]))
            per_view.append({"image": image, "name": names[i].name, "camera": names[i].lens,
                             "psnr": ev["view_psnr"][i], "ssim": ev["view_ssim"][i]})
        written = {os.path.join(VIEWS_DIR, v["image"]) for v in per_view}
        for stale in run_results(out):
            if stale.startswith(VIEWS_DIR + os.sep) and stale not in written:
                os.remove(os.path.join(out, stale))
        plot_psnr(files["plot"], {
            "training view (mean of last steps)": [(e["step"], e["psnr"]) for e in self.train_log],
            "held-out views": [(e["step"], e["psnr"]) for e in self.history]})
        write_json(files["metrics"], {"step": self.step, "psnr": ev["psnr"], "ssim": ev["ssim"],
                                      "num_gaussians": int(self.params["means"].shape[0]),
                                      "training": self.training_summary(),
                                      "views": per_view, "history": self.history,
                                      "source": self.data.source,
                                      "undistort": self.data.extras.get("undistort", False)})
        return files, ev


def train(dataset: Dataset, cfg: TrainConfig, out_dir, resume=None,
          dist: DistContext = None, on_step=None, overwrite: bool = False) -> TrainResult:
    """Train on `dataset` with `cfg`, optionally resuming from checkpoint `resume`, write the
    outputs (see Trainer.export) and a final checkpoint into `out_dir`. With several ranks
    (`dist`, default the current process group) call it on every rank: rank 0 evaluates
    and writes, and every rank returns rank 0's result. `on_step(trainer, step_result)` is
    called after every step (e.g. viewer.TrainingView).

    Rank 0 holds `out_dir` locked while the run lasts, and refuses it when it holds another
    run's results, unless `resume` continues that run or `overwrite` lets it delete them
    (see run_folder)."""
    start = time.perf_counter()
    trainer = Trainer(dataset, cfg, out_dir, dist)
    lock = claim_output_folder(trainer.out_dir, resume, overwrite) \
        if trainer.dist.is_main else None
    try:
        return _train(trainer, resume, on_step, start)
    finally:
        if lock is not None:
            lock.release()


def _train(trainer: Trainer, resume, on_step, start: float) -> TrainResult:
    if resume is not None:
        trainer.load_checkpoint(resume)
    trainer.on_step = on_step
    with _stop_on_ctrl_c(trainer):
        trainer.train()
    if trainer.stop_requested:
        path = os.path.join(ensure_dir(trainer.out_dir), "checkpoint.pt")
        trainer.save_checkpoint(path)
        raise TrainingInterrupted(trainer.step, path)
    files, metrics = {}, None
    if trainer.dist.is_main:
        files, ev = trainer.export()
        metrics = (ev["psnr"], ev["ssim"])
    files["checkpoint"] = os.path.join(trainer.out_dir, "checkpoint.pt")
    trainer.save_checkpoint(files["checkpoint"])
    metrics, history, files = trainer.dist.broadcast_object((metrics, trainer.history, files))
    return TrainResult(metrics[0], metrics[1], int(trainer.params["means"].shape[0]),
                       time.perf_counter() - start, list(history), files, trainer.training_summary())


@contextlib.contextmanager
def _stop_on_ctrl_c(trainer: Trainer):
    """While training a single process in the main thread, the first Ctrl-C asks the trainer
    to stop after the current step (so a consistent checkpoint can be saved); a second one
    interrupts at once."""
    if trainer.dist.enabled or threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        trainer.stop_requested = True
        signal.signal(signal.SIGINT, previous)

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
