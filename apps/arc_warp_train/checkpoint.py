"""Checkpoint files: reading one safely and checking that it fits the run resuming it.

Everything here runs before the first training step, so a wrong `--resume` costs seconds,
not a run. A checkpoint records its dataset as a fingerprint (training view names and
image sizes) besides the trainer state (see Trainer.state_dict).
"""

import os

import numpy as np

from .model import PARAM_NAMES

REQUIRED_KEYS = ("step", "params", "optimizers", "stats", "view_gen", "densify_gen", "perm",
                 "history", "train_log", "config")


def dataset_fingerprint(dataset) -> dict:
    """What identifies a dataset for resuming: training view names and image sizes."""
    return {"train": [v.name for v in dataset.train],
            "sizes": [list(v.image.shape[:2]) for v in dataset.train]}


def read_checkpoint(path) -> dict:
    """Load checkpoint `path` onto the CPU (memory-mapped, so this is cheap); ValueError with
    one line naming the file when it is missing, a folder, truncated or not a checkpoint."""
    import torch

    where = f"--resume {path}"
    if os.path.isdir(path):
        raise ValueError(f"{where} is a folder; give the checkpoint.pt file inside it")
    if not os.path.isfile(path):
        raise ValueError(f"{where}: no such file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # torch raises many kinds (zip, pickle, EOF) for a bad file
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{where}: not a readable checkpoint ({reason[:120]}); the file may "
                         "be truncated or not a checkpoint.pt; resume from an intact one or "
                         "drop --resume") from None
    missing = [k for k in REQUIRED_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise ValueError(f"{where}: not an arc-warp train checkpoint (missing "
                         f"{', '.join(missing)})")
    return state


def check_checkpoint(state: dict, path, dataset, cfg) -> None:
    """ValueError (one line, naming `path`) unless `state` can resume a run of `cfg` on
    `dataset`: same SH degree, the trainer's parameter layout, the same training views."""
    where = f"--resume {path}"
    saved_sh = state["config"].get("sh_degree")
    if saved_sh != cfg.sh_degree:
        raise ValueError(f"{where} was trained with --sh-degree {saved_sh}, this run asks for "
                         f"{cfg.sh_degree}; pass --sh-degree {saved_sh} to resume it")
    params = state["params"]
    if not isinstance(params, dict) or set(params) != set(PARAM_NAMES) \
            or set(state["optimizers"]) != set(PARAM_NAMES):
        raise ValueError(f"{where}: parameters {sorted(params) if isinstance(params, dict) else params!r} "
                         f"are not the trainer's layout {list(PARAM_NAMES)}")
    n = params["means"].shape[0]
    k = (cfg.sh_degree + 1) ** 2
    expected = {"means": (n, 3), "quats": (n, 4), "scales": (n, 3), "opacities": (n,),
                "sh0": (n, 1, 3), "shN": (n, k - 1, 3)}
    for name, shape in expected.items():
        if tuple(params[name].shape) != shape:
            raise ValueError(f"{where}: parameter {name} has shape {tuple(params[name].shape)}, "
                             f"expected {shape}; the file does not match this trainer")
        if not bool(np.isfinite(params[name].float().numpy()).all()):
            raise ValueError(f"{where}: parameter {name} holds non-finite values; resume from "
                             "an earlier checkpoint")
    saved = state.get("dataset")
    current = dataset_fingerprint(dataset)
    if saved is not None and saved != current:
        raise ValueError(f"{where} was trained on another dataset ({len(saved['train'])} "
                         f"training views, first {saved['train'][:1]}) than this one "
                         f"({len(current['train'])}, first {current['train'][:1]}); pass the "
                         "same data folder and --downscale, or drop --resume")
