"""Dense float64 reference for 3D Gaussian splatting (gsplat 1.5.3 "classic" conventions).

Test-only and never exported. Written from the math, independently of arc_warp's
renderer: every pixel is evaluated against every non-culled Gaussian, with no tiles,
in torch float64 so gradients come from autograd (it follows the inputs' dtype, so the
tests can also run it in float32 to size float32 tolerances).

Conventions:
- camera: OpenCV (x right, y down, z forward), 4x4 world_to_camera, pinhole K, pixel
  centres at (x + 0.5, y + 0.5);
- projection: EWA splatting, cov2d = J W Sigma W^T J^T + eps2d * I, where J is the
  perspective Jacobian with x/z, y/z clamped to the field of view widened by 30 %
  (the clamp changes J only, never the projected mean);
- culling: depth outside [near, far], opacity < 1/255, det(cov2d) <= 0, or the
  opacity-aware box (extent min(3.33, sqrt(2 ln(255 o))) std-devs) fully off-image;
- compositing: front to back by camera depth (stable order for ties), alpha clamped
  to 0.999, contributions under 1/255 skipped, and a pixel stops at the first
  Gaussian that would bring its transmittance to <= 1e-4 (that one is not composited);
- hybrid compositing (optional): an opaque surface per pixel (colour, camera depth,
  +inf for none) hides each Gaussian whose centre depth is >= the surface depth at that
  pixel, and its colour replaces the background where its depth is finite.
"""

import math
from dataclasses import dataclass

import numpy as np
import torch

ALPHA_MIN = 1.0 / 255.0
ALPHA_MAX = 0.999
T_MIN = 1e-4
EXTENT_MAX = 3.33
FOV_MARGIN = 0.3


@dataclass(frozen=True)
class RefCamera:
    """Pinhole camera; world_to_camera is (4, 4) float64, intrinsics in pixels."""

    fx: float
    fy: float
    cx: float
    cy: float
    width: int
    height: int
    world_to_camera: np.ndarray
    near: float = 0.01
    far: float = 1e10

    @property
    def center(self) -> np.ndarray:
        """(3,) world position of the camera centre."""
        return np.linalg.inv(self.world_to_camera)[:3, 3]


@dataclass
class RefProjection:
    """Per-Gaussian projection results, all (N, ...) float64 tensors except the masks."""

    means_cam: torch.Tensor  # (N, 3)
    means2d: torch.Tensor  # (N, 2) pixels
    cov2d: torch.Tensor  # (N, 2, 2) after eps2d
    conics: torch.Tensor  # (N, 3) = (inv00, inv01, inv11)
    radii: torch.Tensor  # (N, 2) int64, 0 when culled
    visible: torch.Tensor  # (N,) bool
    ratios: torch.Tensor  # (N, 2) unclamped x/z, y/z (for margin checks)
    ratio_limits: tuple  # ((-lim_x_neg, lim_x_pos), (-lim_y_neg, lim_y_pos))
    extents_px: torch.Tensor  # (N, 2) extent * sqrt(cov2d diagonal) before ceil


@dataclass
class RefRender:
    """Images (H, W[, 3]) float64 plus the per-pixel bookkeeping used by the tests."""

    color: torch.Tensor  # (H, W, 3)
    alpha: torch.Tensor  # (H, W)
    depth: torch.Tensor  # (H, W) sum of w_i z_i
    expected_depth: torch.Tensor  # (H, W) depth / alpha, 0 where alpha == 0
    projection: RefProjection
    order: torch.Tensor  # (M,) indices of visible Gaussians, front to back
    alpha_raw: torch.Tensor  # (P, M) opacity * exp(-power), unclamped, detached
    power: torch.Tensor  # (P, M) detached
    valid: torch.Tensor  # (P, M) bool: passes power >= 0 and alpha >= 1/255
    alive: torch.Tensor  # (P, M) bool: composited before termination
    t_next: torch.Tensor  # (P, M) transmittance after each Gaussian, detached
    terminated: torch.Tensor  # (H, W) bool: pixel hit the 1e-4 transmittance floor


def quat_to_rotmat(quats: torch.Tensor) -> torch.Tensor:
    """(N, 4) wxyz, any norm -> (N, 3, 3) rotation of the normalised quaternion."""
    q = quats / torch.linalg.norm(quats, dim=-1, keepdim=True)
    w, x, y, z = q.unbind(-1)
    rows = [
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
    ]
    return torch.stack(rows, dim=-1).reshape(q.shape[:-1] + (3, 3))


def covariance_3d(quats: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Sigma = R S S^T R^T with S = diag(scales); (N, 3, 3)."""
    m = quat_to_rotmat(quats) * scales[:, None, :]
    return m @ m.transpose(-1, -2)


def project(means, quats, scales, opacities, cam: RefCamera, eps2d=0.3, camera_fn=None) -> RefProjection:
    """EWA projection and culling of N Gaussians (float tensors, normally float64) into `cam`.

    `camera_fn`, if given, replaces the pinhole: camera-space means (N, 3) -> (means2d (N, 2),
    Jacobian (N, 2, 3), in_domain (N,) bool, False culls), as reference_cameras' models."""
    view = torch.as_tensor(cam.world_to_camera, dtype=means.dtype)
    rot, trans = view[:3, :3], view[:3, 3]
    t = means @ rot.T + trans
    cov_cam = rot @ covariance_3d(quats, scales) @ rot.T
    tx, ty, tz = t.unbind(-1)

    lim_x = (cam.cx / cam.fx + FOV_MARGIN * 0.5 * cam.width / cam.fx,
             (cam.width - cam.cx) / cam.fx + FOV_MARGIN * 0.5 * cam.width / cam.fx)
    lim_y = (cam.cy / cam.fy + FOV_MARGIN * 0.5 * cam.height / cam.fy,
             (cam.height - cam.cy) / cam.fy + FOV_MARGIN * 0.5 * cam.height / cam.fy)
    rx, ry = tx / tz, ty / tz
    if camera_fn is None:
        rx_c = torch.clamp(rx, -lim_x[0], lim_x[1])
        ry_c = torch.clamp(ry, -lim_y[0], lim_y[1])
        zero = torch.zeros_like(tz)
        jac = torch.stack([
            torch.stack([cam.fx / tz, zero, -cam.fx * rx_c / tz], dim=-1),
            torch.stack([zero, cam.fy / tz, -cam.fy * ry_c / tz], dim=-1),
        ], dim=-2)
        means2d = torch.stack([cam.fx * rx + cam.cx, cam.fy * ry + cam.cy], dim=-1)
        in_domain = torch.ones_like(tz, dtype=torch.bool)
    else:
        means2d, jac, in_domain = camera_fn(t)
        rx, ry = torch.zeros_like(tz), torch.zeros_like(tz)  # no clamp: no fov margin to keep
        lim_x = lim_y = (1e30, 1e30)
    cov2d = jac @ cov_cam @ jac.transpose(-1, -2) + eps2d * torch.eye(2, dtype=means.dtype)
    det = cov2d[:, 0, 0] * cov2d[:, 1, 1] - cov2d[:, 0, 1] * cov2d[:, 1, 0]
    # Guard the division for culled (det <= 0) Gaussians; they never reach compositing.
    safe_det = torch.where(det > 0, det, torch.ones_like(det))
    conics = torch.stack([cov2d[:, 1, 1] / safe_det, -cov2d[:, 0, 1] / safe_det,
                          cov2d[:, 0, 0] / safe_det], dim=-1)

    with torch.no_grad():
        op = opacities.detach()
        extent = torch.clamp(torch.sqrt(2.0 * torch.log(torch.clamp(op / ALPHA_MIN, min=1.0))),
                             max=EXTENT_MAX)
        diag = torch.stack([cov2d[:, 0, 0], cov2d[:, 1, 1]], dim=-1).detach()
        extents_px = extent[:, None] * torch.sqrt(torch.clamp(diag, min=0.0))
        rad = torch.ceil(extents_px)
        m2 = means2d.detach()
        off_image = ((m2[:, 0] + rad[:, 0] <= 0) | (m2[:, 0] - rad[:, 0] >= cam.width)
                     | (m2[:, 1] + rad[:, 1] <= 0) | (m2[:, 1] - rad[:, 1] >= cam.height))
        depth_ok = (tz.detach() >= cam.near) & (tz.detach() <= cam.far)
        visible = depth_ok & (det.detach() > 0) & (op >= ALPHA_MIN) & ~off_image & in_domain
        radii = torch.where(visible[:, None], rad, torch.zeros_like(rad)).to(torch.int64)
    return RefProjection(t, means2d, cov2d, conics, radii, visible,
                         torch.stack([rx, ry], dim=-1).detach(),
                         ((-lim_x[0], lim_x[1]), (-lim_y[0], lim_y[1])), extents_px)


def sh_basis(degree: int, dirs: torch.Tensor) -> torch.Tensor:
    """Real SH basis (3DGS sign convention) at unit `dirs` (N, 3) -> (N, (degree+1)^2)."""
    c0 = 0.5 / math.sqrt(math.pi)
    out = [torch.full_like(dirs[:, 0], c0)]
    if degree >= 1:
        c1 = math.sqrt(3.0 / (4.0 * math.pi))
        x, y, z = dirs.unbind(-1)
        out += [-c1 * y, c1 * z, -c1 * x]
    if degree >= 2:
        c2a = 0.5 * math.sqrt(15.0 / math.pi)
        c2b = 0.25 * math.sqrt(5.0 / math.pi)
        c2c = 0.25 * math.sqrt(15.0 / math.pi)
        xx, yy, zz = x * x, y * y, z * z
        out += [c2a * x * y, -c2a * y * z, c2b * (2 * zz - xx - yy), -c2a * x * z,
                c2c * (xx - yy)]
    if degree >= 3:
        c3a = 0.25 * math.sqrt(35.0 / (2.0 * math.pi))
        c3b = 0.5 * math.sqrt(105.0 / math.pi)
        c3c = 0.25 * math.sqrt(21.0 / (2.0 * math.pi))
        c3d = 0.25 * math.sqrt(7.0 / math.pi)
        c3e = 0.25 * math.sqrt(105.0 / math.pi)
        out += [-c3a * y * (3 * xx - yy), c3b * x * y * z, -c3c * y * (4 * zz - xx - yy),
                c3d * z * (2 * zz - 3 * xx - 3 * yy), -c3c * x * (4 * zz - xx - yy),
                c3e * z * (xx - yy), -c3a * x * (xx - 3 * yy)]
    return torch.stack(out, dim=-1)


def eval_colors(means, colors, cam: RefCamera, sh_degree) -> torch.Tensor:
    """(N, 3) RGB: `colors` as-is when sh_degree is None, else SH evaluated toward the means."""
    if sh_degree is None:
        return colors
    centre = torch.as_tensor(cam.center, dtype=means.dtype)
    d = means - centre
    dirs = d / torch.linalg.norm(d, dim=-1, keepdim=True)
    k = (sh_degree + 1) ** 2
    rgb = (sh_basis(sh_degree, dirs)[:, :, None] * colors[:, :k, :]).sum(dim=1)
    return torch.clamp(rgb + 0.5, min=0.0)


def composite(proj: RefProjection, opacities, rgb, cam: RefCamera, background,
              pixel_means2d=None, surface_colors=None, surface_depths=None, pixels=None) -> RefRender:
    """Dense front-to-back compositing over every pixel x every visible Gaussian.

    `pixel_means2d` (P, M, 2), if given, replaces `proj.means2d[order]` with one copy per
    pixel (P = H * W row-major, M = visible Gaussians front to back), so autograd gives
    each pixel's own gradient with respect to each 2D mean (see `means2d_grads`).

    `surface_colors` (H, W, 3) and `surface_depths` (H, W), if given, put an opaque
    surface behind the Gaussians: a Gaussian counts at a pixel only where its camera depth
    is below the surface's (the test is per pair, independent of the order), and the
    composite is sum w_i c_i + T_final * (surface colour where its depth is finite, else
    the background). Alpha and the depths stay the visible Gaussians' own.

    `pixels` (P, 2), if given, are the points where each pixel evaluates the splats,
    instead of its centre (reference_cameras' exact distortion reference)."""
    h, w = cam.height, cam.width
    vis_idx = torch.nonzero(proj.visible).flatten()
    depth_all = proj.means_cam[:, 2]
    order = vis_idx[torch.argsort(depth_all.detach()[vis_idx], stable=True)]

    dtype = opacities.dtype
    ys, xs = torch.meshgrid(torch.arange(h, dtype=dtype), torch.arange(w, dtype=dtype),
                            indexing="ij")
    px, py = xs.reshape(-1, 1) + 0.5, ys.reshape(-1, 1) + 0.5
    if pixels is not None:
        px, py = pixels[:, :1], pixels[:, 1:]
    m2 = proj.means2d[order][None] if pixel_means2d is None else pixel_means2d
    con = proj.conics[order]
    dx, dy = m2[..., 0] - px, m2[..., 1] - py
    power = 0.5 * (con[None, :, 0] * dx * dx + con[None, :, 2] * dy * dy) \
        + con[None, :, 1] * dx * dy
    alpha_raw = opacities[order][None, :] * torch.exp(-power)
    alpha = torch.clamp(alpha_raw, max=ALPHA_MAX)
    valid = ((power >= 0) & (alpha >= ALPHA_MIN)).detach()
    if surface_depths is not None:
        sd = torch.as_tensor(surface_depths, dtype=dtype).reshape(-1, 1)
        valid = valid & (depth_all.detach()[order][None, :] < sd)
    a = torch.where(valid, alpha, torch.zeros_like(alpha))
    one_minus = 1.0 - a
    t_next = torch.cumprod(one_minus, dim=1)
    t_prev = torch.cat([torch.ones_like(t_next[:, :1]), t_next[:, :-1]], dim=1)
    # T only decreases, so "still alive" is a prefix mask; the Gaussian that would push
    # T to <= 1e-4 ends the pixel without being composited.
    alive = (t_next > T_MIN).detach()
    weight = torch.where(alive, a * t_prev, torch.zeros_like(a))
    t_final = torch.where(alive, one_minus, torch.ones_like(one_minus)).prod(dim=1)

    behind = torch.as_tensor(background, dtype=dtype)[None, :].expand(h * w, 3)
    if surface_depths is not None:
        has_surface = torch.isfinite(sd)  # (P, 1)
        behind = torch.where(has_surface, torch.as_tensor(surface_colors, dtype=dtype).reshape(-1, 3), behind)
    color = weight @ rgb[order] + t_final[:, None] * behind
    depth = weight @ depth_all[order]
    alpha_out = 1.0 - t_final
    has = alpha_out > 0
    expected = torch.where(has, depth / torch.where(has, alpha_out, torch.ones_like(alpha_out)),
                           torch.zeros_like(depth))
    terminated = (~alive & valid).any(dim=1)
    return RefRender(color.reshape(h, w, 3), alpha_out.reshape(h, w), depth.reshape(h, w),
                     expected.reshape(h, w), proj, order, alpha_raw.detach(), power.detach(),
                     valid, alive, t_next.detach(), terminated.reshape(h, w))


def render_reference(means, quats, scales, opacities, colors, cam: RefCamera, sh_degree=None,
                     background=(0.0, 0.0, 0.0), eps2d=0.3, camera_fn=None, surface_colors=None,
                     surface_depths=None) -> RefRender:
    """Render N Gaussians (float64 torch tensors, shapes as arc_warp's inputs with vectors as
    trailing dims: means (N,3), quats (N,4) wxyz, scales (N,3) linear, opacities (N,),
    colors (N,3) RGB or (N,K,3) SH with K >= (sh_degree+1)^2), optionally over a surface
    (`composite`'s (H, W, 3) `surface_colors` and (H, W) `surface_depths`); `camera_fn`:
    see `project`."""
    proj = project(means, quats, scales, opacities, cam, eps2d, camera_fn)
    rgb = eval_colors(means, colors, cam, sh_degree)
    return composite(proj, opacities, rgb, cam, background, surface_colors=surface_colors,
                     surface_depths=surface_depths)


def means2d_grads(means, quats, scales, opacities, colors, cam: RefCamera, cotangents: dict,
                  sh_degree=None, background=(0.0, 0.0, 0.0), eps2d=0.3):
    """Screen-space gradients of L = sum over outputs k of <cotangents[k], image k>.

    Returns (grad, absgrad), each (N, 2) float64 numpy, 0 for culled Gaussians:
    grad[i] = dL/dmeans2d[i] through compositing only (conics, opacities and colours
    held fixed: gsplat's `means2d.grad`, the densification signal), and
    absgrad[i] = sum over pixels p of |dL_p/dmeans2d[i]| per component, L_p being
    pixel p's part of L (gsplat's `absgrad`). `cotangents` maps "color" (H, W, 3),
    "alpha", "depth", "expected_depth" (H, W) to arrays."""
    with torch.no_grad():
        proj = project(means, quats, scales, opacities, cam, eps2d)
        rgb = eval_colors(means, colors, cam, sh_degree)
        vis_idx = torch.nonzero(proj.visible).flatten()
        order = vis_idx[torch.argsort(proj.means_cam[vis_idx, 2], stable=True)]
    n_pix = cam.height * cam.width
    per_pixel = proj.means2d[order][None].expand(n_pix, -1, -1).clone().requires_grad_(True)
    ref = composite(proj, opacities, rgb, cam, background, pixel_means2d=per_pixel)
    loss = sum((getattr(ref, k) * torch.as_tensor(v, dtype=means.dtype)).sum()
               for k, v in cotangents.items())
    loss.backward()
    g = per_pixel.grad.double()  # (P, M, 2): pixel p's gradient w.r.t. Gaussian order[m]
    grad = torch.zeros(means.shape[0], 2, dtype=torch.float64)
    absgrad = torch.zeros_like(grad)
    grad[order] = g.sum(0)
    absgrad[order] = g.abs().sum(0)
    return grad.numpy(), absgrad.numpy()


@dataclass(frozen=True)
class Margins:
    """How far a float64 render sits from each discrete decision (smaller = more fragile)."""

    depth_near_far: float  # relative distance of visible-candidate depths to near / far
    opacity_cull: float  # |opacity - 1/255|
    radius_ceil: float  # distance of extent*sqrt(cov) to the nearest integer
    box_edge: float  # distance of mean2d +- radius to the image borders
    fov_clamp: float  # relative distance of x/z, y/z to the Jacobian clamp limits
    alpha_cut: float  # min |alpha - 1/255| over pixel x Gaussian pairs
    alpha_clamp: float  # min |opacity*exp(-power) - 0.999|
    power_sign: float  # min |power|
    transmittance: float  # min |T_next - 1e-4| over pairs that could matter
    depth_order: float  # min relative depth gap of two Gaussians sharing a pixel


# Thresholds sized to float32 noise in a renderer (unit roundoff 6e-8, pixel coordinates
# up to ~1e2 px, so power errs by up to ~1e-5 and T by ~30 roundoffs ~ 2e-6 relative):
# a float64 value this close to a decision may land on the other side in float32 and
# change the image by a jump (e.g. 1/255 in one pixel) rather than by rounding. Each
# threshold is >= 5x the float32 error it guards: alpha_cut 2e-7 vs 1/255 * 1e-5;
# transmittance 1e-8 = 1e-4 relative vs 2e-6; positions 1e-4 px vs ~1e-5 px.
SAFE = Margins(depth_near_far=1e-5, opacity_cull=1e-6, radius_ceil=1e-4, box_edge=1e-4,
               fov_clamp=1e-5, alpha_cut=2e-7, alpha_clamp=1e-6, power_sign=1e-6,
               transmittance=1e-8, depth_order=1e-5)


def margins(ref: RefRender, opacities, cam: RefCamera) -> Margins:
    """Distances of `ref` (rendered from float64 `opacities`) to every discrete decision."""
    inf = float("inf")
    proj = ref.projection
    with torch.no_grad():
        z = proj.means_cam[:, 2]
        dnf = torch.minimum((z - cam.near).abs(), (z - cam.far).abs()) / z.abs().clamp(min=1.0)
        depth_near_far = float(dnf.min()) if len(z) else inf
        op = opacities.detach()
        opacity_cull = float((op - ALPHA_MIN).abs().min()) if len(op) else inf

        cand = (z >= cam.near) & (op >= ALPHA_MIN)
        frac = proj.extents_px[cand] - torch.round(proj.extents_px[cand])
        radius_ceil = float(frac.abs().min()) if cand.any() else inf
        rad = torch.ceil(proj.extents_px[cand])
        m2 = proj.means2d.detach()[cand]
        edges = torch.cat([m2 + rad, m2 - rad - torch.tensor([cam.width, cam.height])], dim=-1)
        box_edge = float(edges.abs().min()) if cand.any() else inf
        (xl, xh), (yl, yh) = proj.ratio_limits
        r = proj.ratios[cand]
        fov = torch.stack([r[:, 0] - xl, r[:, 0] - xh, r[:, 1] - yl, r[:, 1] - yh], dim=-1)
        fov_clamp = float((fov.abs() / max(xh, yh)).min()) if cand.any() else inf

        if ref.order.numel() == 0:
            return Margins(depth_near_far, opacity_cull, radius_ceil, box_edge, fov_clamp,
                           inf, inf, inf, inf, inf)
        alpha = ref.alpha_raw.clamp(max=ALPHA_MAX)
        alpha_cut = float((alpha - ALPHA_MIN).abs().min())
        alpha_clamp = float((ref.alpha_raw - ALPHA_MAX).abs().min())
        power_sign = float(ref.power.abs().min())
        # Only a Gaussian reached with T above the floor decides termination.
        t_prev = torch.cat([torch.ones_like(ref.t_next[:, :1]), ref.t_next[:, :-1]], dim=1)
        reached = ref.valid & (t_prev > T_MIN)
        transmittance = float((ref.t_next[reached] - T_MIN).abs().min()) if reached.any() else inf

        zs = z[ref.order]
        gap = (zs[1:] - zs[:-1]) / zs[1:].abs()
        depth_order = inf
        for k in torch.nonzero(gap < SAFE.depth_order).flatten().tolist():
            for j in range(k + 1, len(zs)):
                if zs[j] - zs[k] >= SAFE.depth_order * zs[j].abs():
                    break
                if (ref.valid[:, k] & ref.valid[:, j]).any():
                    depth_order = min(depth_order, float((zs[j] - zs[k]) / zs[j].abs()))
    return Margins(depth_near_far, opacity_cull, radius_ceil, box_edge, fov_clamp, alpha_cut,
                   alpha_clamp, power_sign, transmittance, depth_order)


def fragile_fields(m: Margins, safe: Margins = SAFE) -> list:
    """Names of the margins of `m` below the `safe` thresholds."""
    return [name for name in Margins.__dataclass_fields__
            if getattr(m, name) < getattr(safe, name)]


def surface_margin(ref: RefRender, surface_depths) -> float:
    """Min relative gap |z_i - d_p| / z_i between the depth z_i of a Gaussian and the
    finite surface depth d_p of a pixel it reaches (power >= 0, alpha >= 1/255, before the
    surface test): the occlusion decision of each such pair, which a float32 renderer
    makes on depths ~1e-7 relative off, is float64's when this is well above that."""
    with torch.no_grad():
        z = ref.projection.means_cam[:, 2].detach()[ref.order]
        reach = (ref.power >= 0) & (ref.alpha_raw.clamp(max=ALPHA_MAX) >= ALPHA_MIN)
        sd = torch.as_tensor(surface_depths, dtype=z.dtype).reshape(-1, 1)
        pairs = reach & torch.isfinite(sd)
        if not pairs.any():
            return float("inf")
        gap = (z[None, :] - sd).abs() / z[None, :].abs()
        return float(gap[pairs].min())
