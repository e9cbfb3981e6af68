"""Dense float64 torch references of the mesh ops (tests only, never exported).

Written plainly from the definitions, with none of the kernels' structure: every
pixel tests every triangle. Layouts follow nvdiffrast: pos [B, V, 4] clip space,
tri [F, 3], images [B, H, W, C], pixel centres at +0.5, row 0 at NDC y = -1.
"""

import numpy as np
import torch

F64 = torch.float64


def pixel_centres(height, width):
    """NDC (x, y) of every pixel centre, each [H, W]."""
    ys = (2.0 * torch.arange(height, dtype=F64) + 1.0) / height - 1.0
    xs = (2.0 * torch.arange(width, dtype=F64) + 1.0) / width - 1.0
    return xs[None, :].expand(height, width), ys[:, None].expand(height, width)


# nvdiffrast's CUDA rasteriser, written plainly: viewport tiles of at most 2048 pixels,
# frustum clipping in float32, vertices snapped to a 1/16-pixel grid, integer edge tests
# with its fill rule, and depth on the snapped triangle (here in float64: nvdiffrast's
# fixed point is within ~1e-6 of it, which the returned margin accounts for).
F32 = np.float32
Z_SCALE = F32(4294932095) * F32(0.5)  # z/w -> depth units, as float32 rounds it
DEPTH_MAX = 2.0**32 - 1 - 17600  # the cleared depth: fragments above it are dropped


def _fma(a, b, c):
    """float32 a * b + c with one rounding (float64 holds the product exactly)."""
    return F32(np.float64(a) * np.float64(b) + np.float64(c))


def _tiles(size):
    """[(first pixel, pixels, scale, shift)] of nvdiffrast's viewport tiles along an axis."""
    padded = -(-size // 8) * 8
    count = -(-padded // 2048)
    step = -(-(-(-padded // count)) // 8) * 8
    out = []
    for first in range(0, size, step):
        n = min(size - first, step)
        out.append((first, n, F32(size) / F32(n), F32(size - n - 2 * first) / F32(n)))
    return out


def _clipped(q):
    """Corners [K, 4] float32 of triangle q [3, 4] (viewport clip space) inside the frustum
    |x|, |y|, |z| <= w, rounded as nvdiffrast computes them; empty if it is culled."""
    w = q[:, 3]
    for a in range(3):
        if (w < q[:, a]).all() or (w < -q[:, a]).all():
            return q[:0]
    if (w >= np.abs(q[:, :3]).max(1)).all():
        return q
    d1, d2 = q[1] - q[0], q[2] - q[0]
    poly = [(F32(0), F32(0)), (F32(1), F32(0)), (F32(0), F32(1))]
    for a in range(3):
        if not (w < np.abs(q[:, a])).any():
            continue
        for sgn in (F32(1), F32(-1)):
            h = [q[0, 3] + sgn * q[0, a], d1[3] + sgn * d1[a], d2[3] + sgn * d2[a]]
            value = [_fma(h[2], b2, _fma(h[1], b1, h[0])) for b1, b2 in poly]
            kept = []
            for k in range(len(poly) if len(poly) >= 3 else 0):
                j = k - 1  # the edge from corner j to corner k
                if value[j] * value[k] < 0:
                    tk = value[j] / (value[j] - value[k])
                    tj = F32(1) - tk
                    kept.append(tuple(_fma(poly[j][i], tj, poly[k][i] * tk) for i in (0, 1)))
                if value[k] >= 0:
                    kept.append(poly[k])
            poly = kept
    return np.array([[_fma(d2[c], b2, _fma(d1[c], b1, q[0, c])) for c in range(4)] for b1, b2 in poly], F32)


def _fragments(v, xs, ys):
    """(covered [h, w], depth [h, w] float64) of viewport clip-space triangle v [3, 4] on the
    viewport pixel grid whose centres are at (xs, ys) (1/16-pixel units, [w], [h])."""
    r = F32(1) / v[:, 3]
    nx, ny = -xs[0] + 8, -ys[0] + 8  # 8 W, 8 H
    p = np.stack([np.rint(v[:, 0] * r * F32(nx)), np.rint(v[:, 1] * r * F32(ny))], 1).astype(np.int64)
    zv = np.array([_fma(v[i, 2] * Z_SCALE, r[i], F32(2.0**31)) for i in range(3)], np.float64)
    area = (p[1, 0] - p[0, 0]) * (p[2, 1] - p[0, 1]) - (p[1, 1] - p[0, 1]) * (p[2, 0] - p[0, 0])
    if area < 0:
        p, zv, area = p[[0, 2, 1]], zv[[0, 2, 1]], -area
    X, Y = xs[None, :], ys[:, None]
    covered = np.ones((len(ys), len(xs)), bool)
    lam = []
    for i in range(3):
        a, b = p[i], p[(i + 1) % 3]
        d = b - a
        e = (a[0] - X) * d[1] - (a[1] - Y) * d[0]  # > 0 on the inner side
        owns = d[1] < 0 or (d[1] == 0 and d[0] > 0)  # a centre on this edge is covered
        covered &= (e > 0) | ((e == 0) & owns)
        lam.append(e / area if area else 0 * e)
    # lam[i] weighs the vertex opposite edge i (i -> i + 1), i.e. vertex i + 2
    depth = lam[1] * zv[0] + lam[2] * zv[1] + lam[0] * zv[2]
    return covered & (area != 0), depth


def rasterize(pos, tri, height, width):
    """Brute-force (rast, rast_db, margin): margin [B, H, W] is how far the depth test at
    each pixel is from flipping, in z/w (inf where at most one triangle is in the running)."""
    P = np.asarray(pos, F32)
    T = np.asarray(tri, np.int64)
    B, F = P.shape[0], len(T)
    depth = np.full((B, F, height, width), np.inf)
    for y0, h, ys_, yo_ in _tiles(height):
        for x0, w, xs_, xo_ in _tiles(width):
            xs = 16 * np.arange(w) + 8 - 8 * w
            ys = 16 * np.arange(h) + 8 - 8 * h
            for b in range(B):
                for f in range(F):
                    v = P[b, T[f]]
                    if not np.isfinite(v).all() or (v[:, 3] <= 0).all():
                        continue
                    q = v.copy()
                    q[:, 0] = [_fma(c, xs_, wv * xo_) for c, wv in zip(v[:, 0], v[:, 3])]
                    q[:, 1] = [_fma(c, ys_, wv * yo_) for c, wv in zip(v[:, 1], v[:, 3])]
                    c = _clipped(q)
                    for i in range(2, len(c)):
                        cov, d = _fragments(c[[0, i - 1, i]], xs, ys)
                        tile = depth[b, f, y0:y0 + h, x0:x0 + w]
                        tile[...] = np.where(cov & (d <= DEPTH_MAX), np.minimum(tile, d), tile)
    # nearest wins; ties go to the later triangle
    order = np.argsort(depth[:, ::-1], axis=1, kind="stable")
    idx = F - 1 - order[:, 0]
    best = np.take_along_axis(depth, idx[:, None], 1)[:, 0]
    hit = np.isfinite(best)
    second = np.take_along_axis(depth[:, ::-1], order[:, 1:2], 1)[:, 0] if F > 1 else np.full_like(best, np.inf)
    # near-ties and fragments near the far cut are decided by nvdiffrast's rounding
    near_far = np.where(np.isfinite(depth), np.abs(depth - DEPTH_MAX), np.inf).min(1)
    gap = np.where(np.isfinite(second), second - np.where(hit, best, 0), np.inf)
    margin = np.minimum(gap, near_far) / float(Z_SCALE)
    ids = torch.from_numpy(np.where(hit, idx + 1, 0))
    u, v, *db = barycentrics(torch.as_tensor(P, dtype=F64), torch.from_numpy(T), ids, height, width, clamp=True)
    zw = _depth_zw(torch.as_tensor(P, dtype=F64), torch.from_numpy(T), ids, height, width)
    rast = torch.stack([u, v, zw, ids.to(F64)], -1)
    return rast, torch.stack(db, -1), torch.from_numpy(margin)


def _depth_zw(pos, tri, ids, height, width):
    """z/w [B, H, W] of triangle ``ids - 1`` at each pixel centre, clamped to [-1, 1]."""
    x, y = pixel_centres(height, width)
    t = (ids - 1).clamp(min=0).long()
    bidx = torch.arange(pos.shape[0])[:, None, None].expand_as(t)
    v = pos[bidx[..., None], tri.long()[t]]  # [B, H, W, 3, 4]
    h = v[..., [0, 1, 3]]
    p = torch.stack([x, y, torch.ones_like(x)], -1)[None, :, :, None]
    e = [(torch.cross(h[..., (i + 1) % 3, :], h[..., (i + 2) % 3, :], dim=-1) * p[..., 0, :]).sum(-1)
         for i in range(3)]
    zw = sum(v[..., i, 2] * e[i] for i in range(3)) / sum(v[..., i, 3] * e[i] for i in range(3))
    return torch.where(ids > 0, zw.clamp(-1, 1), torch.zeros_like(zw))


def barycentrics(pos, tri, ids, height, width, clamp=False):
    """(u, v, du/dX, du/dY, dv/dX, dv/dY) [B, H, W] of triangle ``ids - 1`` at each pixel
    (zeros where ids == 0), differentiable in pos. ``clamp``: u, v clamped as nvdiffrast's
    forward does (u, v >= 0, u + v <= 1), the derivatives taken at the clamped values."""
    x, y = pixel_centres(height, width)
    t = (ids - 1).clamp(min=0).long()
    bidx = torch.arange(pos.shape[0])[:, None, None].expand_as(t)
    v = pos[..., [0, 1, 3]][bidx[..., None], tri.long()[t]]  # [B, H, W, 3, 3]
    p = torch.stack([x, y, torch.ones_like(x)], -1)[None].expand(pos.shape[0], -1, -1, -1)
    lines = [torch.cross(v[..., (i + 1) % 3, :], v[..., (i + 2) % 3, :], dim=-1) for i in range(3)]
    e = [(li * p).sum(-1) for li in lines]
    s = e[0] + e[1] + e[2]
    u, vv = e[0] / s, e[1] / s
    if clamp:
        u, vv = u.clamp(0, 1), vv.clamp(0, 1)
        total = (u + vv).clamp(min=1)
        u, vv = u / total, vv / total
    a = sum(li[..., 0] for li in lines)
    c = sum(li[..., 1] for li in lines)
    sx, sy = 2.0 / width, 2.0 / height
    out = [u, vv, sx * (lines[0][..., 0] - u * a) / s, sy * (lines[0][..., 1] - u * c) / s,
           sx * (lines[1][..., 0] - vv * a) / s, sy * (lines[1][..., 1] - vv * c) / s]
    hit = ids > 0
    return [torch.where(hit, o, torch.zeros_like(o)) for o in out]


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
