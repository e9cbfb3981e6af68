"""nvdiffrast-style differentiable mesh ops (rasterize, interpolate, texture, antialias) in Warp."""
