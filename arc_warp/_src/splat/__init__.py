"""3D Gaussian splatting stages: project -> sh -> bin -> raster fwd -> raster bwd (ARC) -> sh/project bwd."""
