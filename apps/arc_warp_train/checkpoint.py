"""Checkpoint files: reading one safely and checking that it fits the run resuming it.

Everything here runs before the first training step, so a wrong `--resume` costs seconds,
not a run. A checkpoint records its dataset as a fingerprint (training view names, image
sizes and camera handling: each view's lens, and whether lenses were undistorted on
load) besides the trainer state (see Trainer.state_dict).

The Adam state is stored as the state dict of the trainer's one optimizer ("optimizer",
one param group per parameter, in PARAM_NAMES order). Checkpoints written when the trainer
had one optimizer per parameter ("optimizers": name -> state dict) are converted to it
on reading, so they still resume.
"""

import os

import numpy as np

from .model import PARAM_NAMES

REQUIRED_KEYS = ("step", "params", "optimizer", "stats", "view_gen", "densify_gen", "perm",
                 "history", "train_log", "config")


def dataset_fingerprint(dataset) -> dict:
    """What identifies a dataset for resuming: training view names, image sizes and lenses
    (`datasets.View.lens`: "pinhole", "fisheye + distortion", ...), the downscale factor
    the images were loaded at and whether lenses were undistorted on load (None when the
    reader does not say)."""
    return {"train": [v.name for v in dataset.train],
            "sizes": [list(v.image.shape[:2]) for v in dataset.train],
            "lenses": [v.lens for v in dataset.train],
            "downscale": dataset.extras.get("downscale"),
            "undistort": dataset.extras.get("undistort")}


def _merge_optimizer_states(per_name: dict) -> dict:
    """The state dict of one optimizer with a param group per parameter (PARAM_NAMES order)
    from the state dicts of one optimizer per parameter (each of one group, holding its
    parameter, whose state has index 0; the oldest groups lack the "name" key)."""
    groups, state = [], {}
    for index, name in enumerate(PARAM_NAMES):
        saved = per_name[name]
        groups.append({**saved["param_groups"][0], "name": name, "params": [index]})
        if 0 in saved["state"]:
            state[index] = saved["state"][0]
    return {"state": state, "param_groups": groups}


def read_checkpoint(path) -> dict:
    """Load checkpoint `path` onto the CPU (memory-mapped, so this is cheap); ValueError with
    one line naming the file when it is missing, a folder, truncated or not a checkpoint.
    The per-parameter optimizer states of older checkpoints become one optimizer's."""
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
    if isinstance(state, dict) and "optimizer" not in state \
            and set(state.get("optimizers", ())) == set(PARAM_NAMES):
        state["optimizer"] = _merge_optimizer_states(state.pop("optimizers"))
    missing = [k for k in REQUIRED_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise ValueError(f"{where}: not an arc-warp train checkpoint (missing "
                         f"{', '.join(missing)})")
    return state


def check_checkpoint(state: dict, path, dataset, cfg) -> None:
    """ValueError (one line, naming `path`) unless `state` can resume a run of `cfg` on
    `dataset`: same SH degree, the trainer's parameter layout, a step not past cfg.steps,
    the same training views with the same lenses at the same sizes (the error names the
    first that differs and the option to fix)."""
    where = f"--resume {path}"
    saved_sh = state["config"].get("sh_degree")
    if saved_sh != cfg.sh_degree:
        raise ValueError(f"{where} was trained with --sh-degree {saved_sh}, this run asks for "
                         f"{cfg.sh_degree}; pass --sh-degree {saved_sh} to resume it")
    params = state["params"]
    groups = [group.get("name") for group in state["optimizer"]["param_groups"]]
    if not isinstance(params, dict) or set(params) != set(PARAM_NAMES) \
            or groups != list(PARAM_NAMES):
        raise ValueError(f"{where}: parameters {sorted(params) if isinstance(params, dict) else params!r} "
                         f"and optimizer groups {groups} are not the trainer's layout "
                         f"{list(PARAM_NAMES)}")
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
    check_resume_steps(state, path, cfg.steps)
    saved = state.get("dataset")
    if saved is not None:
        _check_same_views(saved, dataset_fingerprint(dataset), where)


def check_resume_steps(state: dict, path, steps: int) -> None:
    """ValueError when checkpoint `state` is already past `steps` (--steps)."""
    if int(state["step"]) > steps:
        raise ValueError(f"--resume {path} is at step {int(state['step'])}, past --steps "
                         f"{steps}; pass --steps {int(state['step']) + 1} or more to train on "
                         "from it, or drop --resume to start a new run")


def _check_same_views(saved: dict, current: dict, where: str) -> None:
    """ValueError naming the first training view that differs between a checkpoint's
    dataset fingerprint and this run's, and the option to fix."""
    names, now = saved["train"], current["train"]
    if names != now:
        first = next((i for i, (a, b) in enumerate(zip(names, now)) if a != b),
                     min(len(names), len(now)))
        differs = (f"training view {first} is {names[first]!r} there and "
                   f"{now[first]!r} here" if first < min(len(names), len(now)) else
                   f"it has {len(names)} training views, this one {len(now)}")
        raise ValueError(f"{where} was trained on another dataset ({differs}); pass the same "
                         "data folder (and --format), or drop --resume")
    # checkpoints from before lenses were kept saw every view as a pinhole (undistorted)
    saved_lenses = saved.get("lenses", ["pinhole"] * len(names))
    for name, was, lens in zip(names, saved_lenses, current["lenses"]):
        if was != lens:  # before the sizes: undistortion changes them too
            undistorted = saved.get("undistort") if "lenses" in saved else True
            hint = {True: "pass --undistort", False: "drop --undistort"}.get(
                undistorted, "load it as it was trained (with or without --undistort)")
            raise ValueError(f"{where} was trained on {name} as a {was} camera, this run loads it "
                             f"as a {lens} camera; {hint} to resume it, or drop --resume")
    for name, was, size in zip(names, saved["sizes"], current["sizes"]):
        if list(was) != list(size):
            old, new = saved.get("downscale"), current.get("downscale")
            hint = f"pass --downscale {old}" if old is not None and old != new else \
                "pass the --downscale it was trained with"
            raise ValueError(f"{where} was trained on {name} at {was[1]}x{was[0]} pixels, this "
                             f"run loads it at {size[1]}x{size[0]}"
                             f"{f' (--downscale {new})' if new is not None else ''}; {hint}, "
                             "or drop --resume")
