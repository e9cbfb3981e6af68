"""Particle-to-grid and grid-to-particle transfers (MPM-like), with ARC in the tape's backward.

Three ordinary Warp kernels, written as a Warp user writes them:

- ``p2g`` scatters each particle's mass and momentum into the 3 x 3 grid nodes around it
  with quadratic B-spline weights (``wp.atomic_add``; many particles per cell contend in
  the *forward*, which :func:`arc_warp.arc_adjoint` reduces with ARC too);
- ``grid_update`` turns momentum into velocity (a branch on empty nodes);
- ``g2p`` gathers each particle's new velocity from the same nodes: its reads of the grid
  are what the *backward* scatters, many particles into each node's gradient.

The loss is ``sum(cotangent * v_new)``; the gradients are those of the particles' positions,
velocities and masses. Run ``python -m arc_warp.examples.arc_adjoint_p2g [--cpu-blocks]``
to print each mode's distance from Warp's own adjoint.
"""

from dataclasses import dataclass

import numpy as np
import warp as wp

from arc_warp.examples._arc_adjoint_common import kernels_for, parse_args, report


@wp.func
def quadratic_weights(f: float) -> wp.vec3:
    # f: position past the base node in cells, in [0.5, 1.5)
    return wp.vec3(0.5 * (1.5 - f) * (1.5 - f), 0.75 - (f - 1.0) * (f - 1.0), 0.5 * (f - 0.5) * (f - 0.5))


@wp.kernel
def p2g(
    x: wp.array(dtype=wp.vec2),  # (P,) positions, world units
    v: wp.array(dtype=wp.vec2),  # (P,) velocities
    mass: wp.array(dtype=float),  # (P,)
    inv_dx: float,  # grid nodes per world unit
    grid_m: wp.array2d(dtype=float),  # (G, G) node mass, accumulated
    grid_mv: wp.array2d(dtype=wp.vec2),  # (G, G) node momentum, accumulated
):
    p = wp.tid()
    xp = x[p] * inv_dx
    bx = int(xp[0] - 0.5)
    by = int(xp[1] - 0.5)
    wx = quadratic_weights(xp[0] - float(bx))
    wy = quadratic_weights(xp[1] - float(by))
    mp = mass[p]
    mv = mp * v[p]
    for i in range(3):
        for j in range(3):
            w = wx[i] * wy[j]
            wp.atomic_add(grid_m, bx + i, by + j, w * mp)
            wp.atomic_add(grid_mv, bx + i, by + j, w * mv)


@wp.kernel
def grid_update(
    grid_m: wp.array2d(dtype=float),  # (G, G)
    grid_mv: wp.array2d(dtype=wp.vec2),  # (G, G)
    grid_v: wp.array2d(dtype=wp.vec2),  # (G, G) node velocity, written
):
    i, j = wp.tid()
    m = grid_m[i, j]
    vel = wp.vec2(0.0)
    if m > 0.0:
        vel = grid_mv[i, j] / m
    grid_v[i, j] = vel


@wp.kernel
def g2p(
    x: wp.array(dtype=wp.vec2),  # (P,)
    grid_v: wp.array2d(dtype=wp.vec2),  # (G, G)
    inv_dx: float,
    v_new: wp.array(dtype=wp.vec2),  # (P,) written
):
    p = wp.tid()
    xp = x[p] * inv_dx
    bx = int(xp[0] - 0.5)
    by = int(xp[1] - 0.5)
    wx = quadratic_weights(xp[0] - float(bx))
    wy = quadratic_weights(xp[1] - float(by))
    acc = wp.vec2(0.0)
    for i in range(3):
        for j in range(3):
            acc += wx[i] * wy[j] * grid_v[bx + i, by + j]
    v_new[p] = acc


KERNELS = {"p2g": p2g, "grid_update": grid_update, "g2p": g2p}


@dataclass
class Problem:
    """Particles in a square of ``grid`` x ``grid`` cells of width ``1 / inv_dx``."""

    x: wp.array
    v: wp.array
    mass: wp.array
    inv_dx: float
    grid_m: wp.array
    grid_mv: wp.array
    grid_v: wp.array
    v_new: wp.array
    cotangent: wp.array  # (P,) vec2: dL/dv_new


def make_problem(rng, particles: int = 512, grid: int = 16, sort: bool = True, device=None) -> Problem:
    """Particles uniform over the interior (one cell away from the border, so every 3 x 3
    stencil is inside); ``sort`` orders them by cell, as MPM codes do for locality (then
    the lanes of a warp share nodes)."""
    inv_dx = float(grid)
    x = rng.uniform(1.0, grid - 1.5 - 1e-3, size=(particles, 2)) / inv_dx  # base node + 2 < grid
    if sort:
        cell = np.floor(x * inv_dx).astype(np.int64)
        x = x[np.lexsort((cell[:, 1], cell[:, 0]))]

    def arr(values, dtype, grad=True):
        return wp.array(np.asarray(values, np.float32), dtype=dtype, device=device, requires_grad=grad)

    grid_v = wp.zeros((grid, grid), dtype=wp.vec2, device=device, requires_grad=True)
    grid_v.retain_grad = True  # keep dL/dgrid_v after grid_update's backward (a store's adjoint clears it)
    return Problem(
        x=arr(x, wp.vec2),
        v=arr(rng.normal(size=(particles, 2)), wp.vec2),
        mass=arr(rng.uniform(0.5, 1.5, size=particles), float),
        inv_dx=inv_dx,
        grid_m=wp.zeros((grid, grid), dtype=float, device=device, requires_grad=True),
        grid_mv=wp.zeros((grid, grid), dtype=wp.vec2, device=device, requires_grad=True),
        grid_v=grid_v,
        v_new=wp.zeros(particles, dtype=wp.vec2, device=device, requires_grad=True),
        cotangent=arr(rng.normal(size=(particles, 2)), wp.vec2, grad=False),
    )


def forward(pb: Problem, kernels: dict, block_dim: int = 256) -> None:
    """Clears the grid and runs the three transfers (recorded by an enclosing tape)."""
    pb.grid_m.zero_()
    pb.grid_mv.zero_()
    n, g = pb.x.shape[0], pb.grid_m.shape
    wp.launch(kernels["p2g"], n, inputs=[pb.x, pb.v, pb.mass, pb.inv_dx], outputs=[pb.grid_m, pb.grid_mv],
              block_dim=block_dim)
    wp.launch(kernels["grid_update"], g, inputs=[pb.grid_m, pb.grid_mv], outputs=[pb.grid_v], block_dim=block_dim)
    wp.launch(kernels["g2p"], n, inputs=[pb.x, pb.grid_v, pb.inv_dx], outputs=[pb.v_new], block_dim=block_dim)


def cotangents(pb: Problem) -> dict:
    return {pb.v_new: pb.cotangent}


def gradients(pb: Problem, mode: str | None, block_dim: int = 256, threshold: int | None = None) -> dict:
    """dL/dx, dL/dv, dL/dmass and dL/dgrid_v (what g2p's reads accumulate) through a tape,
    with Warp's adjoint (``mode=None``) or ARC's."""
    kernels = kernels_for(KERNELS, mode, threshold)
    tape = wp.Tape()
    with tape:
        forward(pb, kernels, block_dim)
    tape.backward(grads=cotangents(pb))
    out = {name: getattr(pb, name).grad.numpy().copy() for name in ("x", "v", "mass", "grid_v")}
    tape.zero()
    return out


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    wp.config.enable_cpu_blocks = args.cpu_blocks
    with wp.ScopedDevice(args.device):
        pb = make_problem(np.random.default_rng(args.seed))
        report("p2g -> grid_update -> g2p", gradients, pb, block_dim=64)


if __name__ == "__main__":
    main()
