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


def mip_pyramid(tex, levels=None):
    """[tex, level 1, ...]: 2x2 (or 2x1 when a side is 1) box averages down to 1x1."""
    out = [tex]
    while out[-1].shape[1] > 1 or out[-1].shape[2] > 1:
        if levels is not None and len(out) > levels:
            break
        t = out[-1]
        if t.shape[1] > 1:
            t = 0.5 * (t[:, 0::2] + t[:, 1::2])
        if t.shape[2] > 1:
            t = 0.5 * (t[:, :, 0::2] + t[:, :, 1::2])
        out.append(t)
    return out


def _bilinear(tex, uv, boundary):
    """Bilinear sample of tex [Bt, h, w, C] at uv [B, H, W, 2], texel centres at +0.5."""
    bt, h, w, _ = tex.shape
    u, v = uv[..., 0], uv[..., 1]
    if boundary == "wrap":
        u, v = u - torch.floor(u), v - torch.floor(v)
    x, y = u * w - 0.5, v * h - 0.5
    if boundary == "clamp":
        x, y = x.clamp(0, w - 1), y.clamp(0, h - 1)
    x0, y0 = torch.floor(x).detach(), torch.floor(y).detach()
    fx, fy = x - x0, y - y0
    x0, y0 = x0.long(), y0.long()
    x1 = torch.where((boundary == "clamp") & ((x == 0) | (x == w - 1)), x0, x0 + 1) if boundary == "clamp" else x0 + 1
    y1 = torch.where((y == 0) | (y == h - 1), y0, y0 + 1) if boundary == "clamp" else y0 + 1
    z = torch.arange(uv.shape[0])[:, None, None].expand_as(x0) % bt

    def tap(ix, iy):
        if boundary == "wrap":
            ix, iy = ix % w, iy % h
        inside = (ix >= 0) & (ix < w) & (iy >= 0) & (iy < h)
        val = tex[z, iy.clamp(0, h - 1), ix.clamp(0, w - 1)]
        return torch.where(inside[..., None], val, torch.zeros_like(val))

    fx, fy = fx[..., None], fy[..., None]
    return ((1 - fx) * (1 - fy) * tap(x0, y0) + fx * (1 - fy) * tap(x1, y0)
            + (1 - fx) * fy * tap(x0, y1) + fx * fy * tap(x1, y1))


def texture(tex, uv, uv_da=None, bias=None, filter_mode="linear", boundary="wrap", max_mip_level=None):
    """Reference sampler (2D textures), differentiable in tex, uv, uv_da and bias."""
    if filter_mode == "nearest":
        bt, h, w, _ = tex.shape
        u, v = uv[..., 0], uv[..., 1]
        if boundary == "wrap":
            u, v = u - torch.floor(u), v - torch.floor(v)
        ix, iy = torch.floor(u * w).long(), torch.floor(v * h).long()
        inside = (ix >= 0) & (ix < w) & (iy >= 0) & (iy < h)
        z = torch.arange(uv.shape[0])[:, None, None].expand_as(ix) % bt
        val = tex[z, iy.clamp(0, h - 1), ix.clamp(0, w - 1)]
        return torch.where(inside[..., None], val, torch.zeros_like(val)) if boundary == "zero" else val
    if filter_mode == "linear":
        return _bilinear(tex, uv, boundary)
    levels = mip_pyramid(tex, max_mip_level)
    lod = torch.zeros(uv.shape[:3], dtype=F64)
    if uv_da is not None:
        j = uv_da * torch.tensor([tex.shape[2], tex.shape[2], tex.shape[1], tex.shape[1]], dtype=F64)
        a = j[..., 0] ** 2 + j[..., 2] ** 2
        b = j[..., 1] ** 2 + j[..., 3] ** 2
        c = j[..., 0] * j[..., 1] + j[..., 2] * j[..., 3]
        major = 0.5 * (a + b) + torch.sqrt(0.25 * (a - b) ** 2 + c * c)
        lod = 0.5 * torch.log2(major)
    if bias is not None:
        lod = lod + bias
    lod = lod.clamp(0, len(levels) - 1)
    l0 = torch.floor(lod).detach().long()
    samples = torch.stack([_bilinear(t, uv, boundary) for t in levels])  # [L, B, H, W, C]
    pick = lambda idx: torch.gather(samples, 0, idx[None, ..., None].expand(1, *samples.shape[1:]))[0]  # noqa: E731
    a = pick(l0)
    if filter_mode == "linear-mipmap-nearest":
        return a
    frac = (lod - l0)[..., None]
    b = pick((l0 + 1).clamp(max=len(levels) - 1))
    return a + frac * (b - a)


def _sign_bit(a):
    return torch.signbit(torch.as_tensor(a))


def antialias(color, rast, pos, tri, opposite):
    """Plain per-pair transcription of the analytic antialiasing rules, differentiable in
    color and pos (python loops: small images only). ``opposite`` [F, 3] int (-1: none)."""
    b_n, h, w, _ = color.shape
    out = color.clone()
    ids = rast[..., 3].round().long() - 1
    tri = tri.long()
    xh, yh = 0.5 * w, 0.5 * h
    for b in range(b_n):
        for y in range(h):
            for x in range(w):
                for d in (0, 1):
                    x1, y1 = x + 1 - d, y + d
                    if x1 >= w or y1 >= h:
                        continue
                    t0, t1 = int(ids[b, y, x]), int(ids[b, y1, x1])
                    if t0 == t1:
                        continue
                    t = t0 if t0 >= 0 else t1
                    if t0 >= 0 and t1 >= 0 and not rast[b, y, x, 2] < rast[b, y1, x1, 2]:
                        t = t1
                    rx, ry = (x1, y1) if t == t1 else (x, y)
                    fx, fy = rx + 0.5 - xh, ry + 0.5 - yh
                    p = pos[b if pos.shape[0] > 1 else 0]
                    scr = lambda v: torch.stack([p[v, 0] / p[v, 3] * xh - fx, p[v, 1] / p[v, 3] * yh - fy])  # noqa
                    q = [scr(v) for v in tri[t]]
                    o = [scr(int(opposite[t, i])) if opposite[t, i] >= 0 else q[i] for i in range(3)]
                    area = lambda a, b_, c: (b_[0] - a[0]) * (c[1] - a[1]) - (c[0] - a[0]) * (b_[1] - a[1])  # noqa
                    bb = area(*q)
                    wings = [area(o[i], q[(i + 1) % 3], q[(i + 2) % 3]) for i in range(3)]
                    sil = [bool(_sign_bit(wi) == _sign_bit(bb)) for wi in wings]
                    if not any(sil):
                        continue
                    if d:
                        q = [qi.flip(0) for qi in q]
                    ds = 1.0 if t == t0 else -1.0
                    best, best_i = None, None
                    for i in range(3):
                        a, c = q[(i + 1) % 3], q[(i + 2) % 3]
                        if bool(_sign_bit(a[1]) == _sign_bit(c[1])):
                            continue  # does not cross the segment's line
                        crossing = ds * (a[0] - a[1] * (c[0] - a[0]) / (c[1] - a[1]))
                        if best is None or crossing > best:
                            best, best_i = crossing, i
                    if best_i is None:
                        continue
                    a, c = q[(best_i + 1) % 3], q[(best_i + 2) % 3]
                    if not sil[best_i] or abs(c[1] - a[1]) < abs(c[0] - a[0]):
                        continue
                    if not (-0.0625 < best < 1.0625):
                        continue
                    alpha = ds * (0.5 - best.clamp(0.0, 1.0))
                    tx, ty = (x, y) if alpha > 0 else (x1, y1)
                    out[b, ty, tx] = out[b, ty, tx] + alpha * (color[b, y1, x1] - color[b, y, x])
    return out
