"""`arc-warp train` on captured steps (apps/arc_warp_train/captured.py).

On the CPU, which has no CUDA graphs, `TrainConfig(capture=True)` runs the captured
path's logic (static buffers, learning rates and step counter on the device, the metrics
ring, recapture triggers, fallbacks) with each graph's step function called in place of
a replay: its losses are the eager loop's, bitwise with the same (capturable) optimizer
and to float32 rounding with the eager loop's own. The GPU tests replay real CUDA graphs.
"""

import dataclasses
import json
import threading
import time
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the trainer needs torch (pip install arc-warp[torch])")
pytest.importorskip("PIL.Image", reason="datasets need pillow (arc-warp[app])")
pytest.importorskip("tqdm", reason="the trainer needs tqdm (arc-warp[app])")
pytest.importorskip("matplotlib", reason="the trainer needs matplotlib (arc-warp[app])")

import warp as wp  # noqa: E402

import arc_warp._src.splat.renderer as renderer_module  # noqa: E402
from arc_warp import Distortion  # noqa: E402
from arc_warp.cli import main  # noqa: E402
from arc_warp_train import captured as captured_module  # noqa: E402
from arc_warp_train import model as model_module  # noqa: E402
from arc_warp_train import trainer as trainer_module  # noqa: E402
from arc_warp_train.datasets import load_nerf_synthetic  # noqa: E402
from arc_warp_train.densify import DensifyConfig  # noqa: E402
from arc_warp_train.trainer import TrainConfig, Trainer  # noqa: E402
from arc_warp_train.synthetic import make_synthetic_dataset  # noqa: E402

wp.config.log_level = wp.LOG_WARNING

# refines after steps 25, 50, 75 and 100 (each replaces the parameters: captured again at
# the next step), the SH degree grows at step 50, an opacity reset (in place: no capture)
# after step 60, and the statistics stop at step 120
STEPS = 200
CAPTURES = [(0, "first step"), (26, "densified"), (50, "sh degree"), (51, "densified"), (76, "densified"),
            (101, "densified"), (120, "statistics stop")]


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    root = tmp_path_factory.mktemp("scene")
    make_synthetic_dataset(str(root), num_train=4, num_test=2, width=24, height=24, num_gaussians=120, seed=3,
                           device="cpu" if wp.is_cpu_available() else "cuda")  # the accelerator's Warp may lack a CPU backend
    return load_nerf_synthetic(str(root))


def _cfg(device="cpu", **kw):
    dens = DensifyConfig(refine_start=20, refine_every=25, reset_every=60, refine_stop=120, max_gaussians=700)
    base = dict(steps=STEPS, sh_degree=1, sh_degree_interval=50, init_points=150, densify=dens,
                eval_every=10**6, log_every=10, device=device, progress=False, cpu_threads=1)
    base.update(kw)
    return TrainConfig(**base)


def _run(dataset, cfg, out):
    """(trainer, [steps, 2] float64 (loss, MSE) per step, Gaussian count after each step),
    checking captured runs at each logging interval as `Trainer.train` does."""
    trainer = Trainer(dataset, cfg, out)
    metrics, counts = [], []
    while trainer.step < cfg.steps:
        metrics.append(trainer.train_step().clone())  # captured: a row of the ring, rewritten later
        counts.append(trainer.params["means"].shape[0])
        if trainer.captured is not None and trainer.step % cfg.log_every == 0:
            trainer.captured.check()
    return trainer, torch.stack(metrics).double().cpu().numpy(), counts


def _apart(a, b) -> float:
    """The largest relative difference of two runs' (loss, MSE) over all steps."""
    return float((np.abs(a - b) / np.abs(b)).max())


def _float32_spread(dataset, cfg, out, eager) -> tuple[float, list]:
    """How far the eager loop's own losses move when one learning rate changes by one
    float32 ulp (relative 2^-23): the float32 tolerance of a run, since rounding
    differences grow through the optimisation (measured here over 200 steps: 1.8e-5 for
    "adam", 9e-4 for "sparse_adam"); and that nudged run's Gaussian counts."""
    _, nudged, counts = _run(dataset, dataclasses.replace(cfg, lr_means=cfg.lr_means * (1 + 2**-23)), out)
    return _apart(nudged, eager), counts


@pytest.mark.parametrize("optimizer", ["adam", "sparse_adam"])
def test_captured_steps_train_as_the_eager_loop(scene, tmp_path, optimizer):
    """200 steps across four densifications, an SH degree change, an opacity reset and the
    end of the statistics: the captured path's losses are the eager loop's (with its own
    optimizer: torch's Adam for "adam") to float32 rounding, with the same Gaussian count
    at every step, and graphs captured exactly where the key or the parameters change."""
    cfg = _cfg(optimizer=optimizer, capture=False)
    _, eager, eager_counts = _run(scene, cfg, tmp_path / "eager")
    trainer, captured, counts = _run(scene, dataclasses.replace(cfg, capture=True), tmp_path / "captured")
    assert counts == eager_counts
    # The fused kernel's float32 rounding (its bias corrections on the device, for "adam"
    # its update against torch's) is that of a one-ulp nudge: measured 1.0-1.3x its spread
    spread, _ = _float32_spread(scene, cfg, tmp_path / "nudged", eager)
    assert 0 < _apart(captured, eager) <= 4 * spread, (_apart(captured, eager), spread)
    assert trainer.captured.events == CAPTURES
    (key,) = trainer.captured.graphs  # those of the earlier SH degree and statistics phase are gone
    assert (key.sh_degree, key.accumulate) == (1, False)
    summary = trainer.training_summary()
    assert summary["mode"] == "captured" and summary["skipped_steps"] == 0
    assert summary["captures"] == len(CAPTURES) and summary["recaptures"] == len(CAPTURES) - 1
    assert summary["eager_steps"] == len(CAPTURES) and summary["replayed_steps"] == STEPS - len(CAPTURES)


@pytest.fixture
def capturable_eager(monkeypatch):
    """The eager loop with the captured path's optimizer (capturable SparseGaussianAdam)."""
    make = model_module.make_optimizer
    monkeypatch.setattr(trainer_module, "make_optimizer",
                        lambda params, lrs, kind, capturable=False: make(params, lrs, kind, capturable=True))


@pytest.mark.parametrize("optimizer", ["fused_adam", "sparse_adam"])
def test_captured_logic_is_the_eager_loop_bitwise(scene, tmp_path, optimizer, monkeypatch, capturable_eager):
    """With the same (capturable) optimizer, the captured path is the eager loop bit for bit
    through densifications and an SH degree change: the views copied into static buffers,
    the learning rates on the device (the means' decay worked out from the step counter:
    each step's rate is Trainer._lrs's, rounded to float32) and the metrics ring."""
    rates = []
    step = captured_module.CapturedSteps.step

    def recording(self):  # each step's rates on the device, as its optimizer step read them
        result = step(self)
        rates.append({k: float(v) for k, v in self.lrs.items()})
        return result

    monkeypatch.setattr(captured_module.CapturedSteps, "step", recording)
    trainer, captured, _ = _run(scene, _cfg(capture=True, optimizer=optimizer, steps=80), tmp_path / "captured")
    for s, lrs in enumerate(rates):
        assert lrs == {k: float(np.float32(v)) for k, v in trainer._lrs(s).items()}, s
    eager_trainer, eager, _ = _run(scene, _cfg(capture=False, optimizer=optimizer, steps=80), tmp_path / "eager")
    assert np.array_equal(captured, eager)
    for name, p in trainer.params.items():
        assert torch.equal(p, eager_trainer.params[name]), name


def test_eager_is_the_default_on_the_cpu_and_the_option_everywhere(scene, tmp_path):
    """TrainConfig.capture None steps eagerly on the CPU (today's loop, its torch Adam);
    False too; True captures; data-parallel ranks step eagerly, with a note why."""
    for capture, mode in ((None, "eager"), (False, "eager"), (True, "captured")):
        trainer = Trainer(scene, _cfg(capture=capture), tmp_path)
        assert (trainer.captured is None) == (mode == "eager")
        assert isinstance(trainer.optimizer, torch.optim.Adam)
        assert (type(trainer.optimizer) is torch.optim.Adam) == (mode == "eager")  # "adam"
        assert trainer.training_summary()["mode"] == mode
    trainer.dist = dataclasses.replace(trainer.dist, world_size=2)
    assert trainer.dist.enabled and not trainer._captures()
    assert "data-parallel ranks step eagerly" in trainer.notes[-1]


def _two_sizes(dataset):
    """`dataset` with its second and fourth training views cropped to 16 pixels wide."""
    train = [dataclasses.replace(v, image=np.ascontiguousarray(v.image[:, :16])) if i % 2 else v
             for i, v in enumerate(dataset.train)]
    return dataclasses.replace(dataset, train=train)


def test_one_graph_per_view_size_and_eager_steps_past_the_bound(scene, tmp_path, monkeypatch):
    """Views of two sizes get a graph each; with room for one graph, the other size's steps
    run eagerly (a note says so once) and train the same, bit for bit."""
    dataset = _two_sizes(scene)
    cfg = _cfg(capture=True, steps=24)
    both, metrics, _ = _run(dataset, cfg, tmp_path / "both")
    assert [why for _, why in both.captured.events] == ["first step", "view size or camera"]
    assert {(k.width, k.height) for k in both.captured.graphs} == {(24, 24), (16, 24)}
    assert not both.notes
    monkeypatch.setattr(captured_module, "MAX_GRAPHS", 1)
    one, bounded, _ = _run(dataset, cfg, tmp_path / "one")
    assert len(one.captured.events) == 1 and len(one.captured.graphs) == 2
    twin = Trainer(dataset, cfg, tmp_path / "twin")  # the same seed: the same views, step by step
    widths = [dataset.train[twin._next_views(1)[0]].width for _ in range(cfg.steps)]
    others = sum(w != widths[0] for w in widths)  # the steps of the size captured second
    assert one.captured.eager_steps == 1 + others and one.captured.replays == cfg.steps - 1 - others
    assert len(one.notes) == 1 and "run eagerly" in one.notes[0]
    assert np.array_equal(metrics, bounded)


def test_a_step_whose_render_overflowed_is_skipped_then_the_sort_grows_and_is_captured_again(
        scene, tmp_path, monkeypatch):
    """Checks left on the device (as on CUDA): a replay whose render has more tile
    intersections than its sort holds updates nothing (the step, and Adam's count, are
    skipped on the device); the check at the logging interval says so, grows the sort and
    drops the graph, which the next step captures again; the steps after it fit."""
    from arc_warp_torch import _autograd, default_context

    monkeypatch.setattr(_autograd, "_contexts", threading.local())  # renderers sized by this test alone
    monkeypatch.setattr(renderer_module, "SORT_SLACK", 0)  # a tiny scene overflows the 25% headroom
    monkeypatch.setattr(default_context(torch.device("cpu")), "check", False)
    trainer = Trainer(scene, _cfg(capture=True, steps=40, densify=DensifyConfig(refine_start=1000)), tmp_path)
    for _ in range(3):
        trainer.train_step()
    graph = trainer.captured._last
    assert graph.recorded and trainer.captured.replays == 2
    with torch.no_grad():
        trainer.params["scales"] += 1.0  # e x larger Gaussians: more tiles each
    before = {k: v.detach().clone() for k, v in trainer.params.items()}
    count = float(trainer.optimizer.state[trainer.params["means"]]["step"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the renderer's own note of the overflow
        trainer.train_step()
        assert int(trainer.captured.skipped) == 1
        for name, p in trainer.params.items():
            assert torch.equal(p, before[name]), name
        assert float(trainer.optimizer.state[trainer.params["means"]]["step"]) == count
        monkeypatch.setattr(renderer_module, "SORT_SLACK", 10**5)  # the grown sort holds every view
        trainer.captured.check()
        assert len(trainer.notes) == 1 and "1 steps skipped" in trainer.notes[0], trainer.notes
        assert graph.key not in trainer.captured.graphs
        assert all(r.capacity >= int(graph.buffers.peak) * 5 // 4 + 10**5 for r in graph.renderers())
        for _ in range(6):
            trainer.train_step()
        trainer.captured.check()
    assert trainer.captured.events[-1] == (4, "overflow")
    assert trainer.training_summary()["skipped_steps"] == 1 and len(trainer.notes) == 1
    assert float(trainer.optimizer.state[trainer.params["means"]]["step"]) == count + 6


def test_captured_runs_resume_bitwise_and_across_step_modes(scene, tmp_path):
    """A captured run resumed from its checkpoint ends as the uninterrupted one, bit for
    bit; a captured checkpoint resumes eagerly (into torch's Adam) and an eager one
    captured: the learning rates are saved as numbers, the step counts move."""
    cfg = _cfg(capture=True, steps=40)
    full = Trainer(scene, cfg, tmp_path / "full")
    full.train()
    first = Trainer(scene, cfg, tmp_path / "split")
    first.train(stop_at=27)  # after the refine at 25: the resumed run captures at its first step
    first.save_checkpoint(tmp_path / "captured.pt")
    state = torch.load(tmp_path / "captured.pt", weights_only=True)
    assert all(isinstance(g["lr"], float) for g in state["optimizer"]["param_groups"])
    resumed = Trainer(scene, cfg, tmp_path / "split")
    resumed.load_checkpoint(tmp_path / "captured.pt")
    resumed.train()
    for name, p in full.params.items():
        assert torch.equal(p, resumed.params[name]), name
    assert resumed.captured.events[0] == (27, "first step")
    eager = Trainer(scene, dataclasses.replace(cfg, capture=False), tmp_path / "eager")
    eager.load_checkpoint(tmp_path / "captured.pt")
    eager.train()
    eager.save_checkpoint(tmp_path / "eager.pt")
    back = Trainer(scene, dataclasses.replace(cfg, steps=45), tmp_path / "back")
    back.load_checkpoint(tmp_path / "eager.pt")
    back.train()
    assert back.step == 45 and back.captured.events == [(40, "first step")]
    assert all(np.isfinite(p.detach().numpy()).all() for p in back.params.values())


def test_cli_eager_flag_and_the_metrics_of_a_run(scene, tmp_path, capsys, monkeypatch):
    """`arc-warp train` reports steps, their seconds and rate, the step mode (and, captured,
    the captures) in metrics.json and its last line; `--eager` steps eagerly, where the
    default captures on CUDA."""
    from arc_warp_train.commands import training_line

    root = tmp_path / "data"
    make_synthetic_dataset(str(root), num_train=2, num_test=1, width=16, height=16, num_gaussians=40, device="cpu")
    args = ["train", str(root), "--steps", "3", "--init-points", "30", "--eval-every", "3",
            "--device", "cpu", "--threads", "1", "--no-progress"]
    asked = []
    train = trainer_module.train
    monkeypatch.setattr(trainer_module, "train", lambda data, cfg, *a, **kw: asked.append(cfg.capture) or
                        train(data, cfg, *a, **kw))
    assert main(args + ["-o", str(tmp_path / "default")]) == 0
    out = tmp_path / "out"
    assert main(args + ["-o", str(out), "--eager"]) == 0
    assert asked == [None, False]
    with open(out / "metrics.json") as f:
        metrics = json.load(f)
    training = metrics["training"]
    assert training["mode"] == "eager" and training["steps"] == 3 and training["seconds"] > 0
    assert training["it_per_s"] == pytest.approx(3 / training["seconds"])
    assert {"psnr", "ssim", "num_gaussians"} <= set(metrics)
    assert "3 steps in" in capsys.readouterr().out
    trainer = Trainer(scene, _cfg(capture=True, steps=12), tmp_path / "captured")
    trainer.train()
    line = training_line(trainer.training_summary())
    assert line.startswith("12 steps in") and "captured: 1 graphs captured (0 recaptures)" in line


# ------------------------------------------------------------------------------ GPU


def _host_ms(trainer, steps):
    """Mean host milliseconds of a train_step (no wait for the device) over `steps`."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        trainer.train_step()
    host = (time.perf_counter() - start) / steps * 1e3
    torch.cuda.synchronize()
    return host


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("optimizer", ["adam", "sparse_adam"])
def test_cuda_graph_steps_train_as_the_eager_loop(scene, tmp_path, optimizer, capsys):
    """Real CUDA graphs: 200 replayed steps (captured again at each densification, the SH
    degree change and the end of the statistics) have the eager loop's losses to float32
    rounding and its Gaussian counts; prints the host time per step of each."""
    cfg = _cfg("cuda", optimizer=optimizer, capture=False)
    _, eager, eager_counts = _run(scene, cfg, tmp_path / "eager")
    trainer, captured, counts = _run(scene, dataclasses.replace(cfg, capture=True), tmp_path / "captured")
    # as on the CPU; the eager loop's own spread also holds its atomics' run-to-run order
    spread, nudged_counts = _float32_spread(scene, cfg, tmp_path / "nudged", eager)
    assert _apart(captured, eager) <= 4 * spread, (_apart(captured, eager), spread)
    # on the GPU a float32 rounding apart (capturable Adam's device learning rate, atomics'
    # order) tips a few Gaussians across a densification threshold, and the difference is
    # carried to later densifications: counts agree to 2%, or to twice the nudged run's
    assert all(abs(c - e) <= max(0.02 * e, 2 * abs(n - e))
               for c, e, n in zip(counts, eager_counts, nudged_counts, strict=True)), (counts, eager_counts)
    assert trainer.captured.events == CAPTURES
    assert trainer.training_summary()["skipped_steps"] == 0
    runs = {}
    for capture in (False, True):
        timed = Trainer(scene, _cfg("cuda", optimizer=optimizer, capture=capture, steps=400,
                                    densify=DensifyConfig(refine_start=1000)), tmp_path / f"timed{capture}")
        _host_ms(timed, 5)  # capture, warm-up
        runs[capture] = _host_ms(timed, 100)
    with capsys.disabled():
        print(f"\n{optimizer}: host time per step: eager {runs[False]:.3f} ms, replayed {runs[True]:.3f} ms")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("model,lens", [("pinhole", Distortion(k1=0.058, k2=-0.081, p1=-0.00098, p2=0.00016)),
                                        ("fisheye", Distortion(k1=0.02, k2=-0.01, k3=0.001, k4=0.0))])
def test_cuda_graph_steps_render_lenses_from_device_coefficients(scene, tmp_path, model, lens):
    """Views with a lens (OpenCV k1, k2, p1, p2 as the instant-ngp fox's; a fisheye) train
    from graphs, their coefficients read on the device, as the eager loop trains them."""
    train = [dataclasses.replace(v, model=model, distortion=lens) for v in scene.train]
    dataset = dataclasses.replace(scene, train=train, test=[])
    cfg = _cfg("cuda", capture=False, steps=30)
    _, eager, _ = _run(dataset, cfg, tmp_path / "eager")
    trainer, captured, _ = _run(dataset, dataclasses.replace(cfg, capture=True), tmp_path / "captured")
    spread, _ = _float32_spread(dataset, cfg, tmp_path / "nudged", eager)  # as above
    assert _apart(captured, eager) <= 4 * max(spread, 1e-6), (_apart(captured, eager), spread)
    assert next(iter(trainer.captured.graphs)).lens == len(lens.coefficients(model))
