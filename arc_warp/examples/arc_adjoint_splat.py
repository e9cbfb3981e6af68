"""A small differentiable splatting kernel (Gaussians into an image), with ARC in the
tape's backward.

``splat`` is an ordinary Warp kernel with one thread per (Gaussian, footprint pixel): each
adds its Gaussian's colour, weighted by opacity and falloff, into its pixel
(``wp.atomic_add`` on an (H, W) vec3 image; pixels outside the image are skipped, so lanes
branch). Additive splatting: no depth order, so the order of the adds does not matter.
In the backward the reads of a Gaussian's mean, conic, colour and opacity become adds
into that Gaussian's gradients from all its footprint's threads, consecutive lanes of a
warp: the contention :func:`arc_warp.arc_adjoint` reduces with ARC.

Run ``python -m arc_warp.examples.arc_adjoint_splat [--cpu-blocks]`` to print each mode's
distance from Warp's own adjoint.
"""

from dataclasses import dataclass

import numpy as np
import warp as wp

from arc_warp.examples._arc_adjoint_common import kernels_for, parse_args, report


@wp.kernel
def splat(
    means: wp.array(dtype=wp.vec2),  # (N,) centres, pixels (x right, y down)
    conics: wp.array(dtype=wp.vec3),  # (N,) inverse 2-D covariance (a, b, c), 1/pixels^2
    colors: wp.array(dtype=wp.vec3),  # (N,) RGB
    opacities: wp.array(dtype=float),  # (N,) in [0, 1]
    radius: int,  # footprint half-width, pixels
    image: wp.array2d(dtype=wp.vec3),  # (H, W) RGB, accumulated
):
    g, t = wp.tid()
    side = 2 * radius + 1
    m = means[g]
    px = int(wp.floor(m[0])) + t % side - radius
    py = int(wp.floor(m[1])) + t // side - radius
    if px >= 0 and px < image.shape[1] and py >= 0 and py < image.shape[0]:
        dx = float(px) + 0.5 - m[0]
        dy = float(py) + 0.5 - m[1]
        q = conics[g]
        alpha = opacities[g] * wp.exp(-0.5 * (q[0] * dx * dx + 2.0 * q[1] * dx * dy + q[2] * dy * dy))
        wp.atomic_add(image, py, px, alpha * colors[g])


KERNELS = {"splat": splat}


@dataclass
class Problem:
    """``N`` Gaussians of a few pixels' extent over an (H, W) image."""

    means: wp.array
    conics: wp.array
    colors: wp.array
    opacities: wp.array
    radius: int
    image: wp.array
    cotangent: wp.array  # (H, W) vec3: dL/dimage


def make_problem(rng, gaussians: int = 40, height: int = 24, width: int = 32, radius: int = 2,
                 device=None) -> Problem:
    """Centres uniform over the image widened by ``radius`` (some footprints cross the
    border), standard deviations of 0.5 to 2 pixels in a random orientation."""
    means = rng.uniform([-radius, -radius], [width + radius, height + radius], size=(gaussians, 2))
    angle = rng.uniform(0.0, np.pi, size=gaussians)
    sx, sy = rng.uniform(0.5, 2.0, size=(2, gaussians))
    c, s = np.cos(angle), np.sin(angle)
    # covariance R diag(sx^2, sy^2) R^T, inverted in closed form
    cxx, cxy, cyy = c * c * sx**2 + s * s * sy**2, c * s * (sx**2 - sy**2), s * s * sx**2 + c * c * sy**2
    det = cxx * cyy - cxy * cxy
    conics = np.stack([cyy / det, -cxy / det, cxx / det], -1)

    def arr(values, dtype, grad=True):
        return wp.array(np.asarray(values, np.float32), dtype=dtype, device=device, requires_grad=grad)

    return Problem(
        means=arr(means, wp.vec2),
        conics=arr(conics, wp.vec3),
        colors=arr(rng.uniform(0.0, 1.0, size=(gaussians, 3)), wp.vec3),
        opacities=arr(rng.uniform(0.1, 0.9, size=gaussians), float),
        radius=radius,
        image=wp.zeros((height, width), dtype=wp.vec3, device=device, requires_grad=True),
        cotangent=arr(rng.normal(size=(height, width, 3)), wp.vec3, grad=False),
    )


def forward(pb: Problem, kernels: dict, block_dim: int = 256) -> None:
    """Clears the image and splats every Gaussian (recorded by an enclosing tape)."""
    pb.image.zero_()
    taps = (2 * pb.radius + 1) ** 2
    wp.launch(kernels["splat"], (pb.means.shape[0], taps), inputs=[pb.means, pb.conics, pb.colors, pb.opacities,
              pb.radius], outputs=[pb.image], block_dim=block_dim)


def cotangents(pb: Problem) -> dict:
    return {pb.image: pb.cotangent}


def gradients(pb: Problem, mode: str | None, block_dim: int = 256, threshold: int | None = None) -> dict:
    """dL/d(means, conics, colors, opacities) through a tape, with Warp's adjoint
    (``mode=None``) or ARC's."""
    kernels = kernels_for(KERNELS, mode, threshold)
    tape = wp.Tape()
    with tape:
        forward(pb, kernels, block_dim)
    tape.backward(grads=cotangents(pb))
    out = {name: getattr(pb, name).grad.numpy().copy() for name in ("means", "conics", "colors", "opacities")}
    out["image"] = pb.image.numpy().copy()
    tape.zero()
    return out


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    wp.config.enable_cpu_blocks = args.cpu_blocks
    with wp.ScopedDevice(args.device):
        pb = make_problem(np.random.default_rng(args.seed))
        report("splat", gradients, pb, block_dim=64)


if __name__ == "__main__":
    main()
