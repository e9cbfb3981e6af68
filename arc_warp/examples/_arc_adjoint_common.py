"""What the three ``arc_adjoint_*`` examples share: a tape run per mode, and the report."""

import argparse

import numpy as np
import warp as wp

import arc_warp

MODES = ("atomic", "warp", "arc", "deterministic")
"""The modes each example compares with Warp's generated adjoint."""


def kernels_for(kernels: dict, mode: str | None, threshold: int | None = None) -> dict:
    """``kernels`` (name -> ``wp.Kernel``) as given (``mode=None``: Warp's own adjoint) or
    through :func:`arc_warp.arc_adjoint` in ``mode``."""
    if mode is None:
        return dict(kernels)
    return {name: arc_warp.arc_adjoint(k, mode=mode, threshold=threshold) for name, k in kernels.items()}


def max_relative_error(got: dict, ref: dict) -> dict:
    """Per gradient: max |got - ref| over max |ref| (0 where the reference is all zero)."""
    out = {}
    for name, r in ref.items():
        scale = float(np.max(np.abs(r))) or 1.0
        out[name] = float(np.max(np.abs(got[name] - r))) / scale
    return out


def parse_args(description: str):
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--device", default=None, help="Warp device (default: Warp's default)")
    parser.add_argument("--cpu-blocks", action="store_true",
                        help="on the CPU, emulate 32-lane warps (wp.config.enable_cpu_blocks)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def report(title: str, gradients, problem, block_dim: int) -> None:
    """Prints each mode's largest relative difference from Warp's adjoint, per gradient.

    ``gradients(problem, mode, block_dim)`` returns name -> numpy gradient.
    """
    ref = gradients(problem, None, block_dim)
    print(f"{title}: max |grad - Warp's| / max |Warp's|, block_dim {block_dim}, "
          f"device {wp.get_device()}, cpu blocks {wp.config.enable_cpu_blocks}")
    for mode in MODES:
        errors = max_relative_error(gradients(problem, mode, block_dim), ref)
        print(f"  {mode:13s} " + "  ".join(f"{k} {v:.2e}" for k, v in errors.items()))
