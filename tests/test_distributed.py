"""Data-parallel training: 2 gloo processes on the CPU against one process on the same
combined batch, rank equality, the consistency check, and `arc-warp train --gpus 2`."""

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="data-parallel training needs torch")
pytest.importorskip("PIL.Image", reason="datasets need pillow (arc-warp[app])")
pytest.importorskip("tqdm", reason="the trainer needs tqdm (arc-warp[app])")
pytest.importorskip("matplotlib", reason="the trainer needs matplotlib (arc-warp[app])")
import torch.distributed as tdist  # noqa: E402

if not (tdist.is_available() and tdist.is_gloo_available()):
    pytest.skip("torch.distributed with the gloo backend is unavailable in this torch build",
                allow_module_level=True)

import warp as wp  # noqa: E402

from arc_warp_train.datasets import load_nerf_synthetic  # noqa: E402
from arc_warp_train.densify import DensifyConfig  # noqa: E402
from arc_warp_train.distributed import DistContext, init_distributed, launch  # noqa: E402
from arc_warp_train.trainer import TrainConfig, Trainer, ViewTensors  # noqa: E402
from arc_warp_train.losses import photometric_loss  # noqa: E402
from arc_warp_train.model import PARAM_NAMES  # noqa: E402
from arc_warp_train.synthetic import make_synthetic_dataset  # noqa: E402

wp.config.log_level = wp.LOG_WARNING

STEPS = 10


def _cfg(**kw):
    # Refinements after steps 4 and 8, an opacity reset after step 6; step 9 accumulates
    # statistics that are still in the final state.
    dens = DensifyConfig(refine_start=2, refine_every=4, reset_every=6, refine_stop=10,
                         grow_grad2d=1e-4, max_gaussians=700)
    base = dict(steps=STEPS, batch_size=2, sh_degree=1, sh_degree_interval=4, init_points=150,
                densify=dens, eval_every=STEPS, checkpoint_every=5, device="cpu",
                progress=False, cpu_threads=1)
    base.update(kw)
    return TrainConfig(**base)


def _batch_gradients(trainer, view_ids):
    """Gradients of the photometric loss over training views `view_ids` at the trainer's
    initial parameters, averaged over ranks like a training step does -> {name: grad}."""
    views = [trainer.data.train[i] for i in view_ids]
    image = torch.tensor(np.stack([v.image for v in views]))
    viewmats = torch.tensor(np.stack([v.world_to_camera for v in views]), dtype=torch.float32)
    Ks = torch.tensor(np.stack([v.K for v in views]), dtype=torch.float32)
    colors, _, _ = trainer.render(ViewTensors(image, viewmats, Ks), sh_degree=1)
    photometric_loss(colors, image, trainer.cfg.ssim_lambda)[0].backward()
    trainer.dist.average_gradients(trainer.params, torch.zeros(1))
    grads = {k: p.grad.clone() for k, p in trainer.params.items()}
    for p in trainer.params.values():
        p.grad = None
    return grads


def _rank_worker(data_dir, out_dir):
    """One rank: gradients of its view of the batch (views 0, 1), training, its state, then
    the consistency check, which must pass and then catch a one-bit change on rank 1."""
    wp.config.log_level = wp.LOG_WARNING
    dist = init_distributed("cpu")
    try:
        trainer = Trainer(load_nerf_synthetic(data_dir), _cfg(check_sync=True), out_dir, dist)
        grads = _batch_gradients(trainer, [dist.rank])
        trainer.train()
        state = trainer.state_dict()
        trainer.check_consistency()
        if dist.rank == 1:
            with torch.no_grad():
                trainer.params["sh0"].view(torch.int32).view(-1)[7] ^= 1
        try:
            trainer.check_consistency()
            caught = None
        except RuntimeError as exc:
            caught = str(exc)
        os.makedirs(out_dir, exist_ok=True)
        torch.save({"state": state, "caught": caught, "train_log": trainer.train_log,
                    "grads": grads},
                   os.path.join(out_dir, f"rank{dist.rank}.pt"))
    finally:
        dist.close()


@pytest.fixture(scope="module")
def tiny_data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    make_synthetic_dataset(str(root), num_train=4, num_test=2, width=24, height=24,
                           num_gaussians=120, seed=3, device="cpu")
    return str(root)


def test_two_processes_match_one_process_on_the_combined_batch(tiny_data_dir, tmp_path):
    single = Trainer(load_nerf_synthetic(tiny_data_dir), _cfg(), tmp_path / "single")
    ref_grads = _batch_gradients(single, [0, 1])
    single.train()
    ref = single.state_dict()

    launch(_rank_worker, 2, (tiny_data_dir, str(tmp_path / "multi")))
    ranks = [torch.load(tmp_path / "multi" / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    assert os.path.isfile(tmp_path / "multi" / "checkpoint.pt")  # rank 0 wrote it

    # Rank-averaged per-view gradients are the gradient of the loss over both views: the
    # averaging matches the one-process normalisation (Adam alone would hide a wrong
    # scale). Measured max difference 5e-10 (float32 rounding of the sum order).
    for name, g in ref_grads.items():
        for r in ranks:
            np.testing.assert_allclose(r["grads"][name].numpy(), g.numpy(), rtol=1e-5,
                                       atol=1e-8, err_msg=name)

    # The ranks end bitwise identical: parameters, Adam moments and step counts.
    s0, s1 = ranks[0]["state"], ranks[1]["state"]
    for index, name in enumerate(PARAM_NAMES):
        assert torch.equal(s0["params"][name], s1["params"][name]), name
        m0, m1 = (s["optimizer"]["state"][index] for s in (s0, s1))
        for key in m0:
            assert torch.equal(m0[key], m1[key]), (name, key)

    # Same densification decisions as one process: it grew, and to the same count.
    n = ref["params"]["means"].shape[0]
    assert n != 150 and s0["params"]["means"].shape[0] == n
    assert single.train_log[-1]["step"] == STEPS
    for name, p in ref["params"].items():
        # One process sums both views' gradients inside autograd before the activation
        # chain rules; the ranks apply them per view and sum in the all-reduce (float32
        # reduction order, ~1e-7 relative). Adam's update lr * m / sqrt(v) (eps 1e-15)
        # magnifies this for near-zero gradients, e.g. the quaternions of still isotropic
        # Gaussians: measured max |difference| 3.3e-5 (quats, lr 1e-3) after 10 steps.
        np.testing.assert_allclose(s0["params"][name].numpy(), p.detach().numpy(),
                                   rtol=0, atol=1e-4, err_msg=name)
    # The saved statistics (of step 9) are the sums over ranks, i.e. the one-process
    # statistics, up to the parameter differences above: measured 3.4e-8 absolute on
    # values up to 1.7e-3; visibility counts are exact.
    np.testing.assert_allclose(s0["stats"]["grad2d"].numpy(), ref["stats"]["grad2d"].numpy(),
                               rtol=1e-3, atol=1e-6)
    assert float(ref["stats"]["count"].sum()) > 0
    np.testing.assert_array_equal(s0["stats"]["count"].numpy(), ref["stats"]["count"].numpy())
    # Logged loss: the rank average is the loss over the batch (measured 5e-9 relative).
    np.testing.assert_allclose([e["loss"] for e in ranks[0]["train_log"]],
                               [e["loss"] for e in single.train_log], rtol=1e-6)

    # One flipped bit on rank 1 is reported on every rank, naming the tensor.
    for r in ranks:
        assert r["caught"] is not None and "params.sh0 (rank 1)" in r["caught"]


def test_batch_must_split_evenly_over_ranks(tiny_data_dir, tmp_path):
    data = load_nerf_synthetic(tiny_data_dir)
    # Validated before any collective, so no process group is needed here.
    with pytest.raises(ValueError, match="multiple of the number of data-parallel ranks"):
        Trainer(data, _cfg(batch_size=3), tmp_path, DistContext(0, 2, 0, "gloo"))
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        _cfg(batch_size=0)


def test_cli_spawns_processes_and_only_rank0_writes(tiny_data_dir, tmp_path, capfd):
    from arc_warp.cli import main

    out = tmp_path / "out"
    code = main(["train", tiny_data_dir, "-o", str(out), "--gpus", "2", "--device", "cpu",
                 "--steps", "3", "--init-points", "40", "--sh-degree", "0", "--eval-every",
                 "3", "--threads", "1", "--no-progress", "--check-sync"])
    assert code == 0
    text = capfd.readouterr().out
    assert text.count("final test-view PSNR") == 1 and "2 data-parallel ranks (gloo)" in text
    for name in ("point_cloud.ply", "psnr.png", "metrics.json", "checkpoint.pt"):
        assert (out / name).is_file(), name
    assert len(os.listdir(out / "test_views")) == 2
