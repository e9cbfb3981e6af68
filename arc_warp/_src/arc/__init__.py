"""The ARC primitive: warp intrinsics, plan/reducer/accumulator, scatter_add, threshold calibration."""
