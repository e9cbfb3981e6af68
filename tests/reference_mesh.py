"""Dense float64 torch references of the mesh ops (tests only, never exported).

Written plainly from the definitions, with none of the kernels' structure: every
pixel tests every triangle. Layouts follow nvdiffrast: pos [B, V, 4] clip space,
tri [F, 3], images [B, H, W, C], pixel centres at +0.5, row 0 at NDC y = -1.
"""

import torch

F64 = torch.float64


def pixel_centres(height, width):
    """NDC (x, y) of every pixel centre, each [H, W]."""
    ys = (2.0 * torch.arange(height, dtype=F64) + 1.0) / height - 1.0
    xs = (2.0 * torch.arange(width, dtype=F64) + 1.0) / width - 1.0
    return xs[None, :].expand(height, width), ys[:, None].expand(height, width)


def edge_functions(pos, tri, height, width):
    """E [B, F, 3, H, W]: E_i = (v_j x v_k) . (X, Y, 1) with v = (x, y, w), and det [B, F]."""
    v = pos[..., [0, 1, 3]][:, tri.long()]  # [B, F, 3 verts, 3]
    x, y = pixel_centres(height, width)
    p = torch.stack([x, y, torch.ones_like(x)], -1)  # [H, W, 3]
    lines = torch.stack([torch.cross(v[:, :, (i + 1) % 3], v[:, :, (i + 2) % 3], dim=-1) for i in range(3)], 2)
    e = torch.einsum("bfic,hwc->bfihw", lines, p)
    det = (lines[:, :, 0] * v[:, :, 0]).sum(-1)
    return e, det, lines


def rasterize(pos, tri, height, width):
    """Brute-force (rast, rast_db, margin): margin [B, H, W] is how far the decision at each
    pixel is from flipping (smallest |b_i| of the winner, depth gap to the runner-up)."""
    e, det, lines = edge_functions(pos, tri, height, width)
    sgn = torch.sign(det)[..., None, None, None]
    s = e.sum(2)
    b = e / s[:, :, None]
    zs = pos[..., 2][:, tri.long()]
    ws = pos[..., 3][:, tri.long()]
    zw = (zs[..., None, None] * e).sum(2) / (ws[..., None, None] * e).sum(2)
    inside = (e * sgn > 0).all(2) & (zw >= -1) & (zw <= 1) & (det != 0)[..., None, None]
    depth = torch.where(inside, zw, torch.full_like(zw, float("inf")))
    best, idx = depth.min(1)  # [B, H, W]
    hit = torch.isfinite(best)
    gather = idx[:, None, None].expand(-1, 1, 3, -1, -1)
    bw = torch.gather(b, 1, gather)[:, 0]  # [B, 3, H, W]
    rast = torch.stack([bw[:, 0], bw[:, 1], best, (idx + 1).to(F64)], -1)
    rast = torch.where(hit[..., None], rast, torch.zeros_like(rast))
    db = bary_derivatives(pos, tri, rast, height, width)
    # decision margins: barycentrics of triangles that nearly cover the pixel, the depth
    # gap to the runner-up, and the distance of z/w from the clip planes
    near = (b > -1e-3).all(2) & (det != 0)[..., None, None]
    inf = torch.full_like(zw, float("inf"))
    edge_gap = torch.where(near, b.abs().amin(2), inf).amin(1)
    clip_gap = torch.where(near, torch.minimum((zw - 1).abs(), (zw + 1).abs()), inf).amin(1)
    second = depth.topk(2, dim=1, largest=False).values[:, 1] if depth.shape[1] > 1 else inf[:, 0]
    depth_gap = torch.nan_to_num(second - best, nan=float("inf"))
    return rast, db, torch.minimum(torch.minimum(edge_gap, clip_gap), depth_gap)


def barycentrics(pos, tri, ids, height, width):
    """(u, v, du/dX, du/dY, dv/dX, dv/dY) [B, H, W] of triangle ``ids - 1`` at each pixel
    (zeros where ids == 0), differentiable in pos."""
    x, y = pixel_centres(height, width)
    t = (ids - 1).clamp(min=0).long()
    bidx = torch.arange(pos.shape[0])[:, None, None].expand_as(t)
    v = pos[..., [0, 1, 3]][bidx[..., None], tri.long()[t]]  # [B, H, W, 3, 3]
    p = torch.stack([x, y, torch.ones_like(x)], -1)[None].expand(pos.shape[0], -1, -1, -1)
    lines = [torch.cross(v[..., (i + 1) % 3, :], v[..., (i + 2) % 3, :], dim=-1) for i in range(3)]
    e = [(li * p).sum(-1) for li in lines]
    s = e[0] + e[1] + e[2]
    u, vv = e[0] / s, e[1] / s
    a = sum(li[..., 0] for li in lines)
    c = sum(li[..., 1] for li in lines)
    sx, sy = 2.0 / width, 2.0 / height
    out = [u, vv, sx * (lines[0][..., 0] - u * a) / s, sy * (lines[0][..., 1] - u * c) / s,
           sx * (lines[1][..., 0] - vv * a) / s, sy * (lines[1][..., 1] - vv * c) / s]
    hit = ids > 0
    return [torch.where(hit, o, torch.zeros_like(o)) for o in out]


def bary_derivatives(pos, tri, rast, height, width):
    _, _, *db = barycentrics(pos, tri, rast[..., 3], height, width)
    return torch.stack(db, -1)


def interpolate(attr, rast, tri, rast_db=None, diff_attrs=()):
    """(out [B, H, W, A], out_da [B, H, W, 2 len(diff_attrs)]), attr [B or 1, V, A]."""
    ids = rast[..., 3].round().long()
    t = (ids - 1).clamp(min=0)
    b = attr.shape[0]
    bidx = torch.arange(rast.shape[0])[:, None, None].expand_as(t) % b
    a = attr[bidx[..., None], tri.long()[t]]  # [B, H, W, 3, A]
    u, v = rast[..., 0:1], rast[..., 1:2]
    hit = (ids > 0)[..., None]
    out = u * a[..., 0, :] + v * a[..., 1, :] + (1 - u - v) * a[..., 2, :]
    out = torch.where(hit, out, torch.zeros_like(out))
    da = []
    for j in diff_attrs:
        d0 = a[..., 0, j] - a[..., 2, j]
        d1 = a[..., 1, j] - a[..., 2, j]
        da += [d0 * rast_db[..., 0] + d1 * rast_db[..., 2], d0 * rast_db[..., 1] + d1 * rast_db[..., 3]]
    out_da = torch.stack(da, -1) if da else out[..., :0]
    return out, torch.where(hit, out_da, torch.zeros_like(out_da))
