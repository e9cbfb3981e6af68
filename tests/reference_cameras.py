"""Dense float64 reference for arc_warp's camera models and lens distortion.

Test-only and never exported; written from the math, independently of arc_warp's kernels,
and composited by reference_splat (every pixel against every Gaussian, float64 autograd).

Models (gsplat 1.5.3's `_ortho_proj` / `_fisheye_proj` conventions), for a camera point
(x, y, z):
- ortho: pixel (fx x + cx, fy y + cy), J = [[fx, 0, 0], [0, fy, 0]];
- fisheye (equidistant): r = |(x, y)|, theta = atan2(r, z), pixel = theta / r (fx x, fy y) +
  (cx, cy); J closed form with a = z / (L^2 r^2), b = theta / r^3, L^2 = r^2 + z^2:
  [[fx (x^2 a + y^2 b), fx x y (a - b), -fx x / L^2], [fy x y (a - b), fy (y^2 a + x^2 b),
  -fy y / L^2]] (gsplat adds 1e-7 to r and x^2 against 0 / 0; here the limit is exact);
- pinhole: reference_splat's (clamped) Jacobian.
Distortion (OpenCV): pixel = F D(n) + c with n the model's normalised point, D the
radial-tangential (pinhole, rational) or theta polynomial (fisheye) map; J is the
autodiff Jacobian (torch.func.jacrev) of that exact function, so autograd through it
gives the second derivatives arc_warp writes by hand. A distorted camera culls centres
with |n|^2 > r2_max, found here by dense sampling of the radial map (`radial_limit`).

`render_exact_distorted` is the method-free reference: each pixel centre is undistorted
exactly (Newton, float64) and the undistorted camera's EWA splats are evaluated there.
"""

import math
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch.func import jacrev, vmap

from reference_splat import ALPHA_MIN, RefCamera, composite, eval_colors, project, render_reference

FOV_MARGIN = 0.3


@dataclass(frozen=True)
class ModelCamera(RefCamera):
    """RefCamera with a model ("pinhole", "ortho", "fisheye") and OpenCV distortion
    coefficients (pinhole: k1, k2, p1, p2, k3, k4, k5, k6; fisheye: k1, k2, k3, k4)."""

    model: str = "pinhole"
    distortion: tuple = ()
    r2_max: float = math.inf  # distorted: centres with |n|^2 above it are culled

    @property
    def distorted(self) -> bool:
        return any(self.distortion)


def unit_point(t, model):
    """Normalised points n (N, 2) of camera points t (N, 3)."""
    x, y, z = t.unbind(-1)
    if model == "ortho":
        return torch.stack([x, y], dim=-1)
    if model == "fisheye":
        r = torch.sqrt(x * x + y * y)
        k = torch.atan2(r, z) / r
        return torch.stack([k * x, k * y], dim=-1)
    return torch.stack([x / z, y / z], dim=-1)


def radial_coeffs(model, coeffs):
    """(numerator, denominator) of rho(s), constant first; (tangential p1, p2)."""
    c = list(coeffs) + [0.0] * (8 - len(coeffs))
    if model == "fisheye":
        return [1.0, c[0], c[1], c[2], c[3]], [1.0], (0.0, 0.0)
    return [1.0, c[0], c[1], c[4]], [1.0, c[5], c[6], c[7]], (c[2], c[3])


def lens(n, model, coeffs):
    """Distorted points m (N, 2) of normalised points n (N, 2), OpenCV's models."""
    num, den, (p1, p2) = radial_coeffs(model, coeffs)
    x, y = n.unbind(-1)
    s = x * x + y * y
    rho = sum(a * s ** i for i, a in enumerate(num)) / sum(b * s ** i for i, b in enumerate(den))
    return torch.stack([rho * x + 2 * p1 * x * y + p2 * (s + 2 * x * x),
                        rho * y + p1 * (s + 2 * y * y) + 2 * p2 * x * y], dim=-1)


def pixel_of(t, cam: ModelCamera):
    """Pixels (N, 2) of camera points t (N, 3): the exact camera function."""
    m = unit_point(t, cam.model)
    if cam.distorted:
        m = lens(m, cam.model, cam.distortion)
    return torch.stack([cam.fx * m[..., 0] + cam.cx, cam.fy * m[..., 1] + cam.cy], dim=-1)


def closed_form_jacobian(t, cam: ModelCamera):
    """gsplat's J (N, 2, 3) of the undistorted ortho / fisheye / (unclamped) pinhole map."""
    x, y, z = t.unbind(-1)
    zero = torch.zeros_like(z)
    if cam.model == "ortho":
        rows = [[cam.fx + zero, zero, zero], [zero, cam.fy + zero, zero]]
    elif cam.model == "fisheye":
        r2 = x * x + y * y
        l2 = r2 + z * z
        a = z / (l2 * r2)
        b = torch.atan2(torch.sqrt(r2), z) / (r2 * torch.sqrt(r2))
        rows = [[cam.fx * (x * x * a + y * y * b), cam.fx * x * y * (a - b), -cam.fx * x / l2],
                [cam.fy * x * y * (a - b), cam.fy * (y * y * a + x * x * b), -cam.fy * y / l2]]
    else:
        rows = [[cam.fx / z, zero, -cam.fx * x / (z * z)], [zero, cam.fy / z, -cam.fy * y / (z * z)]]
    return torch.stack([torch.stack(row, dim=-1) for row in rows], dim=-2)


def autodiff_jacobian(t, cam: ModelCamera):
    """J (N, 2, 3) of `pixel_of` by autodiff; differentiable w.r.t. t (second derivatives)."""
    return vmap(jacrev(lambda p: pixel_of(p[None], cam)[0]))(t)


def camera_fn(cam: ModelCamera):
    """reference_splat.project's `camera_fn` for `cam` (None for the undistorted pinhole,
    whose clamped Jacobian reference_splat has)."""
    if cam.model == "pinhole" and not cam.distorted:
        return None

    def fn(t):
        jac = autodiff_jacobian(t, cam) if cam.distorted else closed_form_jacobian(t, cam)
        n = unit_point(t, cam.model).detach()
        inside = (n * n).sum(-1) <= cam.r2_max
        return pixel_of(t, cam), jac, inside

    return fn


def render(means, quats, scales, opacities, colors, cam: ModelCamera, sh_degree=None,
           background=(0.0, 0.0, 0.0), eps2d=0.3):
    """reference_splat.render_reference through `cam`'s model (linearised at each mean)."""
    return render_reference(means, quats, scales, opacities, colors, cam, sh_degree, background, eps2d,
                            camera_fn(cam))


def corner_radius(cam: RefCamera) -> float:
    """Largest normalised distorted radius over the image's corners."""
    us = np.array([0.0, cam.width])
    vs = np.array([0.0, cam.height])
    return float(np.hypot(*np.meshgrid((us - cam.cx) / cam.fx, (vs - cam.cy) / cam.fy)).max())


def radial_limit(model, coeffs, corner, samples=400_001):
    """(r2_max, valid) by dense sampling of the radial map R(r) = r rho(r^2) over ray angles
    in (0, pi/2) (pinhole r = tan angle, fisheye r = angle): valid if R increases until it
    reaches `corner`; r2_max where R reaches 1.3 `corner`, or the fold, or inf."""
    num, den, _ = radial_coeffs(model, coeffs)
    ang = np.linspace(0.0, 0.5 * np.pi, samples)[1:-1]
    r = ang if model == "fisheye" else np.tan(ang)
    s = r * r
    q = np.polynomial.polynomial.polyval(s, den)
    big_r = r * np.polynomial.polynomial.polyval(s, num) / q
    bad = (np.diff(big_r) <= 0) | (q[1:] <= 0)
    end = int(np.argmax(bad)) if bad.any() else len(r) - 1  # last increasing sample
    if bad.any() and big_r[end] <= corner:
        return None, False
    hit = np.nonzero(big_r[:end + 1] >= (1 + FOV_MARGIN) * corner)[0]
    if hit.size:
        i = hit[0]
        target = (1 + FOV_MARGIN) * corner
        w = (target - big_r[i - 1]) / (big_r[i] - big_r[i - 1])
        return float(((1 - w) * r[i - 1] + w * r[i]) ** 2), True
    return (float(r[end] ** 2) if bad.any() else math.inf), True


def undistort(m, cam: ModelCamera, iters=50):
    """n (N, 2) with lens(n) = m (N, 2 float64), by Newton from n = m; raises if a point
    does not converge to 1e-12."""
    n = m.clone()
    jac = vmap(jacrev(lambda q: lens(q[None], cam.model, cam.distortion)[0]))
    for _ in range(iters):
        res = lens(n, cam.model, cam.distortion) - m
        if float(res.abs().max()) < 1e-13:
            break
        n = n - torch.linalg.solve(jac(n), res[..., None])[..., 0]
    res = (lens(n, cam.model, cam.distortion) - m).abs().max()
    if not float(res) < 1e-12:
        raise RuntimeError(f"undistortion did not converge (residual {float(res):.3g})")
    return n


def render_exact_distorted(means, quats, scales, opacities, colors, cam: ModelCamera, sh_degree=None,
                           background=(0.0, 0.0, 0.0), eps2d=0.0):
    """The distorted image with no approximation of the lens: each pixel centre is
    undistorted exactly and the undistorted camera's splats (same model, same K) are
    evaluated at that point. Gaussians are culled by depth, opacity and det only (every
    visible one is evaluated at every pixel); centres beyond the lens's r2_max count too."""
    plain = replace(cam, distortion=(), r2_max=math.inf)
    proj = project(means, quats, scales, opacities, plain, eps2d, camera_fn(plain))
    with torch.no_grad():
        z = proj.means_cam[:, 2]
        c = proj.cov2d
        det = c[:, 0, 0] * c[:, 1, 1] - c[:, 0, 1] * c[:, 1, 0]
        visible = (z >= cam.near) & (z <= cam.far) & (det > 0) & (opacities >= ALPHA_MIN)
    proj = replace(proj, visible=visible)
    ys, xs = torch.meshgrid(torch.arange(cam.height, dtype=torch.float64),
                            torch.arange(cam.width, dtype=torch.float64), indexing="ij")
    m = torch.stack([(xs.reshape(-1) + 0.5 - cam.cx) / cam.fx, (ys.reshape(-1) + 0.5 - cam.cy) / cam.fy], -1)
    n = undistort(m, cam)
    pixels = torch.stack([cam.fx * n[:, 0] + cam.cx, cam.fy * n[:, 1] + cam.cy], -1)
    rgb = eval_colors(means, colors, cam, sh_degree)
    return composite(proj, opacities, rgb, cam, background, pixels=pixels)
