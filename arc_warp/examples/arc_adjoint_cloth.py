"""A cloth's stretch and shear energy over its triangles (a mesh vertex gather), with ARC
in the tape's backward.

``stretch_energy`` is an ordinary Warp kernel, one thread per triangle: it gathers its three
vertices' positions (``x[ids[k]]``), forms the deformation gradient from the rest shape,
and adds the triangle's energy into one total (``wp.atomic_add``: every thread into one
float). In the backward each vertex read becomes an add into the vertex's gradient, shared
by the up to six triangles around the vertex; :func:`arc_warp.arc_adjoint` accumulates
those adds (and the forward's total) with ARC.

The gradients are those of the positions, the rest shapes' inverses and the rest areas,
under a random cotangent of the total. Run ``python -m arc_warp.examples.arc_adjoint_cloth
[--cpu-blocks]`` to print each mode's distance from Warp's own adjoint.
"""

from dataclasses import dataclass

import numpy as np
import warp as wp

from arc_warp.examples._arc_adjoint_common import kernels_for, parse_args, report


@wp.kernel
def stretch_energy(
    x: wp.array(dtype=wp.vec3),  # (V,) vertex positions, world units
    tri: wp.array(dtype=wp.vec3i),  # (T,) vertex ids of each triangle
    dm_inv: wp.array(dtype=wp.mat22),  # (T,) inverse of the rest edge matrix (2-D rest frame)
    area: wp.array(dtype=float),  # (T,) rest areas
    k_stretch: float,
    k_shear: float,
    energy: wp.array(dtype=float),  # (1,) total, accumulated
):
    t = wp.tid()
    ids = tri[t]
    x0 = x[ids[0]]
    e1 = x[ids[1]] - x0
    e2 = x[ids[2]] - x0
    d = dm_inv[t]
    f1 = e1 * d[0, 0] + e2 * d[1, 0]  # columns of the deformation gradient
    f2 = e1 * d[0, 1] + e2 * d[1, 1]
    s1 = wp.length(f1) - 1.0
    s2 = wp.length(f2) - 1.0
    shear = wp.dot(f1, f2)
    wp.atomic_add(energy, 0, area[t] * (k_stretch * (s1 * s1 + s2 * s2) + k_shear * shear * shear))


KERNELS = {"stretch_energy": stretch_energy}


@dataclass
class Problem:
    """A ``rows`` x ``rows`` vertex sheet, two triangles per quad in row-major order."""

    x: wp.array
    tri: wp.array
    dm_inv: wp.array
    area: wp.array
    energy: wp.array
    cotangent: wp.array  # (1,) dL/denergy


def make_problem(rng, rows: int = 12, device=None) -> Problem:
    """A unit-spaced sheet in the plane z = 0, then displaced at random by about 0.1 in
    3-D (so every triangle is stretched and sheared)."""
    i, j = np.meshgrid(np.arange(rows), np.arange(rows), indexing="ij")
    rest = np.stack([j.ravel(), i.ravel()], axis=-1).astype(np.float64)
    v = (i * rows + j)[:-1, :-1].ravel()
    tris = np.concatenate([np.stack([v, v + 1, v + rows + 1], -1), np.stack([v, v + rows + 1, v + rows], -1)], -1)
    tris = tris.reshape(-1, 3)
    dm = np.stack([rest[tris[:, 1]] - rest[tris[:, 0]], rest[tris[:, 2]] - rest[tris[:, 0]]], axis=-1)  # (T, 2, 2)
    x = np.concatenate([rest, np.zeros((rest.shape[0], 1))], -1) + rng.normal(scale=0.1, size=(rest.shape[0], 3))

    def arr(values, dtype, grad=True):
        return wp.array(np.asarray(values, np.float32), dtype=dtype, device=device, requires_grad=grad)

    return Problem(
        x=arr(x, wp.vec3),
        tri=wp.array(tris.astype(np.int32), dtype=wp.vec3i, device=device),
        dm_inv=arr(np.linalg.inv(dm), wp.mat22),
        area=arr(0.5 * np.abs(np.linalg.det(dm)), float),
        energy=wp.zeros(1, dtype=float, device=device, requires_grad=True),
        cotangent=arr(rng.normal(size=1), float, grad=False),
    )


def forward(pb: Problem, kernels: dict, block_dim: int = 256) -> None:
    """Clears the total and adds every triangle's energy (recorded by an enclosing tape)."""
    pb.energy.zero_()
    wp.launch(kernels["stretch_energy"], pb.tri.shape[0], inputs=[pb.x, pb.tri, pb.dm_inv, pb.area, 10.0, 1.0],
              outputs=[pb.energy], block_dim=block_dim)


def cotangents(pb: Problem) -> dict:
    return {pb.energy: pb.cotangent}


def gradients(pb: Problem, mode: str | None, block_dim: int = 256, threshold: int | None = None) -> dict:
    """dL/dx, dL/ddm_inv, dL/darea through a tape, with Warp's adjoint (``mode=None``) or ARC's."""
    kernels = kernels_for(KERNELS, mode, threshold)
    tape = wp.Tape()
    with tape:
        forward(pb, kernels, block_dim)
    tape.backward(grads=cotangents(pb))
    out = {"x": pb.x.grad.numpy().copy(), "dm_inv": pb.dm_inv.grad.numpy().copy(),
           "area": pb.area.grad.numpy().copy(), "energy": pb.energy.numpy().copy()}
    tape.zero()
    return out


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    wp.config.enable_cpu_blocks = args.cpu_blocks
    with wp.ScopedDevice(args.device):
        pb = make_problem(np.random.default_rng(args.seed))
        report("stretch_energy", gradients, pb, block_dim=64)


if __name__ == "__main__":
    main()
