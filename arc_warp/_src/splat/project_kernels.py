"""EWA projection of 3D Gaussians to screen space: forward, and the hand-written per-Gaussian
backward (also the colour stage's, where ``sh_kernels.make_sh_bwd`` does not run)."""

import functools

import warp as wp

from arc_warp._src.splat.geometry_funcs import (
    ALPHA_MIN,
    EXTEND_MAX,
    RADIUS_MAX,
    G_ABS,
    G_CONIC,
    G_DEPTH,
    G_OPACITY,
    G_RGB,
    G_XY,
    MODEL_FISHEYE,
    CameraParams,
    Splat2D,
    float_bits,
    footprint,
    grad_vector,
    quat_to_rotmat,
    quat_to_rotmat_vjp,
    scale_columns,
    row_span,
    tile_bbox,
)
from arc_warp._src.splat.bin_kernels import INT32_MAX
from arc_warp._src.splat.camera_funcs import camera_project, camera_vjp, pinhole_project, pinhole_vjp, radial_limit
from arc_warp._src.splat.sh_kernels import make_clear_colors, make_color_vjp
from arc_warp._src.splat.validate_kernels import nonfinite3

coeffs8 = wp.types.vector(8, wp.float32)  # OpenCV's distortion coefficients, zero-padded


@wp.func
def count_tiles(geom: wp.vec4, conic: wp.vec4, radius: wp.vec2i, tiles_x: int, tiles_y: int) -> wp.int64:
    """Tiles the splat's footprint reaches; ``write_keys`` walks the same ``row_span``s."""
    f = footprint(geom, conic)
    box = tile_bbox(wp.vec2(geom[0], geom[1]), radius, tiles_x, tiles_y)
    n = wp.int64(0)
    for ty in range(box[1], box[3]):
        span = row_span(f, ty, box)
        n += wp.int64(span[1] - span[0])
    return n


@wp.func
def aa_compensation(cov2d: wp.mat22, eps2d: float) -> float:
    """sqrt(det(cov2d) / det(cov2d + eps2d I)): the opacity factor of the antialiased
    (Mip-Splatting) 2D filter, which keeps a Gaussian's integral when it is dilated."""
    det_orig = cov2d[0, 0] * cov2d[1, 1] - cov2d[0, 1] * cov2d[1, 0]
    det = (cov2d[0, 0] + eps2d) * (cov2d[1, 1] + eps2d) - cov2d[0, 1] * cov2d[1, 0]
    return wp.sqrt(wp.max(0.0, det_orig / det))


@wp.func
def exp3(v: wp.vec3) -> wp.vec3:
    """Componentwise exp: linear scales from log-scales (``scale_activation="exp"``)."""
    return wp.vec3(wp.exp(v[0]), wp.exp(v[1]), wp.exp(v[2]))


@wp.func
def sigmoid(x: float) -> float:
    """1 / (1 + exp(-x)) from exp(-|x|), which cannot overflow (``opacity_activation="sigmoid"``)."""
    t = wp.exp(-wp.abs(x))
    if x >= 0.0:
        return 1.0 / (1.0 + t)
    return t / (1.0 + t)


@wp.func
def sigmoid_slope(x: float) -> float:
    """d sigmoid / dx = o (1 - o), as t / (1 + t)^2 with t = exp(-|x|): no cancellation in
    1 - o for large logits (o rounds to 1 in float32 from x ~ 17 on, the slope does not)."""
    t = wp.exp(-wp.abs(x))
    d = 1.0 + t
    return t / (d * d)


@functools.cache
def make_project_fwd(antialiased: bool, scale_activation: str = "none", opacity_activation: str = "none",
                     pinhole_only: bool = False):
    """Projection forward; ``antialiased`` scales each opacity by ``aa_compensation``;
    ``scale_activation`` "exp" / ``opacity_activation`` "sigmoid": the kernel reads
    log-scales / logits and activates them (compile-time constants, as ``antialiased``);
    ``pinhole_only``: the kernel handles only undistorted pinhole cameras (no code, and no
    registers, for the other models; see ``renderer.is_plain_pinhole``)."""

    @wp.kernel(enable_backward=False, module="unique")
    def project_fwd(
        means: wp.array(dtype=wp.vec3),
        quats: wp.array(dtype=wp.vec4),
        scales: wp.array(dtype=wp.vec3),
        opacities: wp.array(dtype=float),
        cams: wp.array(dtype=CameraParams),
        eps2d: float,
        tiles_x: int,
        tiles_y: int,
        means2d: wp.array(dtype=wp.vec2),
        splats: wp.array(dtype=Splat2D),
        radii: wp.array(dtype=wp.vec2i),
        tiles_per_gauss: wp.array(dtype=wp.int32),
        depth_keys: wp.array(dtype=wp.int32),
        order: wp.array(dtype=wp.int32),
        bad: wp.array(dtype=wp.int32),
    ):
        # the camera is read from device memory, so cameras on the device need no host copy
        project_one(wp.tid(), means, quats, scales, opacities, cams[0], eps2d, tiles_x, tiles_y, means2d,
                    splats, radii, tiles_per_gauss, depth_keys, order, bad, wp.static(antialiased),
                    wp.static(scale_activation == "exp"), wp.static(opacity_activation == "sigmoid"),
                    wp.static(pinhole_only))

    return project_fwd


@wp.func
def project_one(
    i: int,
    means: wp.array(dtype=wp.vec3),
    quats: wp.array(dtype=wp.vec4),
    scales: wp.array(dtype=wp.vec3),
    opacities: wp.array(dtype=float),
    cam: CameraParams,
    eps2d: float,
    tiles_x: int,
    tiles_y: int,
    means2d: wp.array(dtype=wp.vec2),
    splats: wp.array(dtype=Splat2D),
    radii: wp.array(dtype=wp.vec2i),
    tiles_per_gauss: wp.array(dtype=wp.int32),
    depth_keys: wp.array(dtype=wp.int32),
    order: wp.array(dtype=wp.int32),
    bad: wp.array(dtype=wp.int32),
    antialiased: bool,  # a compile-time constant (wp.static) in each kernel variant
    exp_scales: bool,  # scales are log-scales (compile-time, as antialiased)
    sigmoid_opacities: bool,  # opacities are logits (compile-time, as antialiased)
    pinhole_only: bool,  # the camera is an undistorted pinhole (compile-time, as antialiased)
):
    """Culls (each test written so that NaN culls) and projects Gaussian ``i`` through the
    camera's model (``camera_funcs.camera_project``; a distorted camera also culls centres
    beyond its ``r2_max``).

    With ``exp_scales`` / ``sigmoid_opacities`` every use below (culling, compensation,
    extent, splat) sees the activated values; a log-scale whose exp overflows is flagged
    as a non-finite scale.

    Huge but finite covariances are inverted after scaling, and radii are clamped at
    ``RADIUS_MAX`` before the int cast, so such a Gaussian covers the whole image; a
    covariance that overflows float32 (NaN/Inf entries) is culled.

    Also writes the depth sort's inputs (the renderer sorts them), so
    that takes no pass of its own: ``order[i] = i`` and the key, the depth's float bits
    (depth >= near > 0, so they order like the depth), or ``INT32_MAX`` for a Gaussian
    without tiles (culled, or its footprint reaches none), which sorts last.
    """
    mean = means[i]
    quat = quats[i]
    scale = scales[i]
    opacity = opacities[i]
    # non-finite inputs are reported through the same readback that sizes the sort
    if nonfinite3(mean):
        bad[1] = 1
    if not (wp.isfinite(quat[0]) and wp.isfinite(quat[1]) and wp.isfinite(quat[2]) and wp.isfinite(quat[3])):
        bad[2] = 1
    elif wp.dot(quat, quat) == 0.0:
        bad[6] = 1
    if nonfinite3(scale):
        bad[3] = 1
    if not wp.isfinite(opacity):
        bad[4] = 1
    if exp_scales:
        scale = exp3(scale)
        if nonfinite3(scale):  # exp overflowed float32 (raw +-Inf/NaN are flagged above)
            bad[3] = 1
    if sigmoid_opacities:
        opacity = sigmoid(opacity)

    radii[i] = wp.vec2i(0, 0)
    means2d[i] = wp.vec2(0.0, 0.0)  # culled entries read 0 (here, not in a separate memset launch)
    tiles_per_gauss[i] = 0
    depth_keys[i] = INT32_MAX
    order[i] = i
    p = cam.rot * mean + cam.trans
    if not (p[2] >= cam.near and p[2] <= cam.far and opacity >= ALPHA_MIN):
        return

    if pinhole_only:
        xy, jac, inside = pinhole_project(p, cam)
    else:
        xy, jac, inside = camera_project(p, cam)
    if not inside:
        return
    m = scale_columns(quat_to_rotmat(quat), scale)
    cov_c = cam.rot * (m * wp.transpose(m)) * wp.transpose(cam.rot)
    cov2d = jac * cov_c * wp.transpose(jac)
    a = cov2d[0, 0] + eps2d
    b = cov2d[0, 1]
    c = cov2d[1, 1] + eps2d
    if not (wp.isfinite(a) and wp.isfinite(b) and wp.isfinite(c)):
        return
    det = a * c - b * b
    inv_det = 1.0 / det
    conic = wp.vec4(c * inv_det, -b * inv_det, a * inv_det, 0.0)
    if not wp.isfinite(det):
        # a * c overflowed: invert the covariance divided by its largest entry
        s = wp.max(a, c)
        a1 = a / s
        b1 = b / s
        c1 = c / s
        det = a1 * c1 - b1 * b1
        inv_det = 1.0 / (det * s)
        conic = wp.vec4(c1 * inv_det, -b1 * inv_det, a1 * inv_det, 0.0)
    if not (det > 0.0):
        return
    if antialiased:
        opacity = opacity * aa_compensation(cov2d, eps2d)
        if opacity < ALPHA_MIN:
            return

    # opacity-aware extent (gsplat / arXiv 2402.00525 B.2); the box is not differentiated
    extend = wp.min(EXTEND_MAX, wp.sqrt(2.0 * wp.log(opacity / ALPHA_MIN)))
    rx = wp.min(wp.ceil(extend * wp.sqrt(a)), RADIUS_MAX)
    ry = wp.min(wp.ceil(extend * wp.sqrt(c)), RADIUS_MAX)
    if not (rx > 0.0 and ry > 0.0):
        return
    if not (
        xy[0] + rx > 0.0
        and xy[0] - rx < float(cam.width)
        and xy[1] + ry > 0.0
        and xy[1] - ry < float(cam.height)
    ):
        return

    radius = wp.vec2i(int(rx), int(ry))
    geom = wp.vec4(xy[0], xy[1], opacity, p[2])
    radii[i] = radius
    # at most the grid's tile count (< 2^23, renderer.MAX_TILES): exact in an int32
    tiles = wp.int32(count_tiles(geom, conic, radius, tiles_x, tiles_y))
    tiles_per_gauss[i] = tiles
    if tiles > 0:
        depth_keys[i] = float_bits(geom[3])
    means2d[i] = xy
    splats[i] = Splat2D(geom, conic)


@functools.cache
def make_project_bwd(n_coeffs: int, absgrad: bool, antialiased: bool = False, overwrite: bool = False,
                     sh_apart: bool = False, scale_activation: str = "none", opacity_activation: str = "none",
                     means2d: bool = True, pinhole_only: bool = False):
    """Per-Gaussian backward of the projection stage, and of the colour stage unless
    ``sh_apart``.

    Reads the packed rasteriser gradient once; the colour part is ``make_color_vjp``
    (``n_coeffs`` = 0: plain RGB ``colors`` (N,), else (N, K) SH coefficients).
    ``sh_apart``: ``make_sh_bwd`` ran first and wrote the colour gradients; its share of
    dL/dmean, ``sh_v_means`` (N,) vec3, is added here (``colors`` and ``v_colors`` are not
    touched; ``sh_v_means`` may be None otherwise, and for ``n_coeffs`` 1; with ``overwrite``
    it may be ``v_means`` itself: each entry is read before it is written).
    ``antialiased``: the rasteriser's opacity was ``opacities * aa_compensation``.
    ``overwrite``: every gradient entry is written rather than added to (culled Gaussians
    get 0), so the gradient arrays need not be zeroed (nor read) first; the values are
    those of adding into zeros.
    ``scale_activation`` "exp" / ``opacity_activation`` "sigmoid": ``scales`` / ``opacities``
    are log-scales / logits (activated as in the forward) and their gradients are w.r.t.
    those raw values: dL/ds * s and dL/do * o (1 - o), applied to this call's share before
    it is added (or written).
    ``means2d`` False: nobody reads dL/dmeans2d, so ``v_means2d`` is not touched (it may be
    None).
    ``pinhole_only``: as ``make_project_fwd``'s.
    """
    exp_scales = scale_activation == "exp"
    sigmoid_opacities = opacity_activation == "sigmoid"
    grad_t = grad_vector(absgrad)
    color_t = wp.array(dtype=wp.vec3) if n_coeffs == 0 else wp.array2d(dtype=wp.vec3)
    color_vjp = make_color_vjp(n_coeffs, overwrite)
    clear_colors = make_clear_colors(n_coeffs)

    # 3 blocks of 256 per SM caps registers at 80 (unbounded 90: 2 blocks), no spills
    @wp.kernel(enable_backward=False, module="unique", launch_bounds=(256, 3))
    def project_bwd(
        means: wp.array(dtype=wp.vec3),
        quats: wp.array(dtype=wp.vec4),
        scales: wp.array(dtype=wp.vec3),
        colors: color_t,
        opacities: wp.array(dtype=float),
        cams: wp.array(dtype=CameraParams),
        eps2d: float,
        radii: wp.array(dtype=wp.vec2i),
        splats: wp.array(dtype=Splat2D),
        rgb: wp.array(dtype=wp.vec3),
        raster_grads: wp.array(dtype=grad_t),
        v_means: wp.array(dtype=wp.vec3),
        v_quats: wp.array(dtype=wp.vec4),
        v_scales: wp.array(dtype=wp.vec3),
        v_opacities: wp.array(dtype=float),
        v_colors: color_t,
        v_means2d: wp.array(dtype=wp.vec2),
        v_means2d_abs: wp.array(dtype=wp.vec2),
        sh_v_means: wp.array(dtype=wp.vec3),
    ):
        i = wp.tid()
        if radii[i][0] <= 0:
            if wp.static(overwrite):
                v_means[i] = wp.vec3(0.0)
                v_quats[i] = wp.vec4(0.0)
                v_scales[i] = wp.vec3(0.0)
                v_opacities[i] = 0.0
                if wp.static(means2d):
                    v_means2d[i] = wp.vec2(0.0)
                if wp.static(absgrad):
                    v_means2d_abs[i] = wp.vec2(0.0)
                if wp.static(not sh_apart):
                    clear_colors(i, v_colors)
            return
        cam = cams[0]
        g = raster_grads[i]
        mean = means[i]
        v_xy = wp.vec2(g[G_XY], g[G_XY + 1])
        # "x + g" below is "g" when overwriting: adding into 0 gives the same bits
        if wp.static(not antialiased):
            v_o = g[G_OPACITY]
            if wp.static(sigmoid_opacities):
                v_o = v_o * sigmoid_slope(opacities[i])
            if wp.static(not overwrite):
                v_o = v_opacities[i] + v_o
            v_opacities[i] = v_o
        if wp.static(means2d):
            v_m2 = v_xy
            if wp.static(not overwrite):
                v_m2 = v_means2d[i] + v_m2
            v_means2d[i] = v_m2
        if wp.static(absgrad):
            v_abs = wp.vec2(g[G_ABS], g[G_ABS + 1])
            if wp.static(not overwrite):
                v_abs = v_means2d_abs[i] + v_abs
            v_means2d_abs[i] = v_abs

        # conic = inverse(cov2d): dL/dcov2d = -C V C with V the symmetric dL/dconic
        conic = splats[i].conic
        cm = wp.mat22(conic[0], conic[1], conic[1], conic[2])
        half_b = 0.5 * g[G_CONIC + 1]
        v_cov2d = -(cm * wp.mat22(g[G_CONIC], half_b, half_b, g[G_CONIC + 2]) * cm)

        quat = quats[i]
        scale = scales[i]
        if wp.static(exp_scales):
            scale = exp3(scale)
        rot = quat_to_rotmat(quat)
        m = scale_columns(rot, scale)
        cov_c = cam.rot * (m * wp.transpose(m)) * wp.transpose(cam.rot)
        p = cam.rot * mean + cam.trans
        if wp.static(pinhole_only):
            xy, jac, inside = pinhole_project(p, cam)
        else:
            xy, jac, inside = camera_project(p, cam)

        if wp.static(antialiased):
            # opacity' = opacity * sqrt(r), r = det(S) / det(S + eps I), S = cov2d
            cov2d = jac * cov_c * wp.transpose(jac)
            comp = aa_compensation(cov2d, eps2d)
            v_o = g[G_OPACITY] * comp
            if wp.static(sigmoid_opacities):
                logit = opacities[i]
                v_o = v_o * sigmoid_slope(logit)
            if wp.static(not overwrite):
                v_o = v_opacities[i] + v_o
            v_opacities[i] = v_o
            if comp > 0.0:
                det_orig = cov2d[0, 0] * cov2d[1, 1] - cov2d[0, 1] * cov2d[1, 0]
                det = (cov2d[0, 0] + eps2d) * (cov2d[1, 1] + eps2d) - cov2d[0, 1] * cov2d[1, 0]
                if wp.static(sigmoid_opacities):
                    opacity = sigmoid(logit)
                else:
                    opacity = opacities[i]
                v_r = g[G_OPACITY] * opacity * 0.5 / (comp * det * det)
                off = -v_r * cov2d[0, 1] * (det - det_orig)
                v_cov2d += wp.mat22(
                    v_r * (cov2d[1, 1] * det - det_orig * (cov2d[1, 1] + eps2d)), off,
                    off, v_r * (cov2d[0, 0] * det - det_orig * (cov2d[0, 0] + eps2d)))
        v_cov_c = wp.transpose(jac) * v_cov2d * jac
        v_jac = (v_cov2d + wp.transpose(v_cov2d)) * jac * cov_c
        if wp.static(pinhole_only):
            v_p = pinhole_vjp(p, cam, v_xy, g[G_DEPTH], v_jac)
        else:
            v_p = camera_vjp(p, cam, v_xy, g[G_DEPTH], v_jac)

        # cov = M M^T with M = rot diag(scale)
        v_cov = wp.transpose(cam.rot) * v_cov_c * cam.rot
        v_m = (v_cov + wp.transpose(v_cov)) * m
        v_scale = wp.vec3(
            rot[0, 0] * v_m[0, 0] + rot[1, 0] * v_m[1, 0] + rot[2, 0] * v_m[2, 0],
            rot[0, 1] * v_m[0, 1] + rot[1, 1] * v_m[1, 1] + rot[2, 1] * v_m[2, 1],
            rot[0, 2] * v_m[0, 2] + rot[1, 2] * v_m[1, 2] + rot[2, 2] * v_m[2, 2],
        )
        v_quat = quat_to_rotmat_vjp(quat, scale_columns(v_m, scale))
        if wp.static(exp_scales):
            v_scale = wp.cw_mul(v_scale, scale)  # d exp(l) / dl = exp(l)
        if wp.static(not overwrite):
            v_scale = v_scales[i] + v_scale
            v_quat = v_quats[i] + v_quat
        v_scales[i] = v_scale
        v_quats[i] = v_quat

        # the colour stage last (fewer live registers); its view-direction share of
        # dL/dmean is added before the projection's, in the order of two separate passes
        v_dir = wp.vec3(0.0)
        if wp.static(not sh_apart):
            v_dir = color_vjp(i, mean, colors, cam.center, rgb[i], wp.vec3(g[G_RGB], g[G_RGB + 1], g[G_RGB + 2]),
                              v_colors)
        elif wp.static(n_coeffs > 1):
            v_dir = sh_v_means[i]
        v_mean = wp.vec3(0.0)
        if wp.static(not overwrite):
            v_mean = v_means[i]
        if wp.static(n_coeffs > 1):
            v_mean = v_mean + v_dir
        v_means[i] = v_mean + wp.transpose(cam.rot) * v_p

    return project_bwd


@wp.kernel(enable_backward=False)
def camera_from_matrices(
    viewmats: wp.array(dtype=wp.mat44),
    intrinsics: wp.array(dtype=wp.mat33),
    index: int,
    width: int,
    height: int,
    near: float,
    far: float,
    model: int,
    distortion: wp.array2d(dtype=float),
    cams: wp.array(dtype=CameraParams),
    bad: wp.array(dtype=wp.int32),
    slot: int,
    distortion_slot: int,
):
    """``cams[0]`` = camera ``index`` of device-side matrices, of camera model ``model``
    (``CameraParams.model``) with ``distortion`` (C, K) OpenCV coefficients (K = 0: none).
    An invalid camera (non-finite, focal length <= 0, last row not (0, 0, 0, 1)) sets
    ``bad[slot]``, an invalid distortion (non-finite, or a radial map that folds inside the
    image: ``camera_funcs.radial_limit``) ``bad[distortion_slot]``; either gets an empty
    depth range, so every Gaussian is culled."""
    m = viewmats[index]
    k = intrinsics[index]
    cam = CameraParams()
    cam.rot = wp.mat33(m[0, 0], m[0, 1], m[0, 2], m[1, 0], m[1, 1], m[1, 2], m[2, 0], m[2, 1], m[2, 2])
    cam.trans = wp.vec3(m[0, 3], m[1, 3], m[2, 3])
    cam.center = -(wp.transpose(cam.rot) * cam.trans)  # rigid: R^T (-t)
    cam.fx = k[0, 0]
    cam.fy = k[1, 1]
    cam.cx = k[0, 2]
    cam.cy = k[1, 2]
    cam.width = width
    cam.height = height
    cam.near = near
    cam.far = far
    cam.model = model
    finite = True
    for r in range(4):
        for c in range(4):
            finite = finite and wp.isfinite(m[r, c])
    for r in range(3):
        for c in range(3):
            finite = finite and wp.isfinite(k[r, c])
    last_row = m[3, 0] == 0.0 and m[3, 1] == 0.0 and m[3, 2] == 0.0 and m[3, 3] == 1.0
    valid = finite and last_row and cam.fx > 0.0 and cam.fy > 0.0
    if not valid:
        bad[slot] = 1
    elif distortion.shape[1] > 0:
        d = coeffs8()
        lens_ok = bool(True)
        for j in range(distortion.shape[1]):
            d[j] = distortion[index, j]
            lens_ok = lens_ok and wp.isfinite(d[j])
            if d[j] != 0.0:
                cam.distorted = 1
        if model == MODEL_FISHEYE:
            cam.radial = wp.vec4(d[0], d[1], d[2], d[3])
        else:  # OpenCV's order: k1, k2, p1, p2, k3, k4, k5, k6
            cam.radial = wp.vec4(d[0], d[1], d[4], 0.0)
            cam.radial_den = wp.vec3(d[5], d[6], d[7])
            cam.tangential = wp.vec2(d[2], d[3])
        if lens_ok and cam.distorted != 0:
            dx = wp.max(wp.abs(cam.cx), wp.abs(float(width) - cam.cx)) / cam.fx
            dy = wp.max(wp.abs(cam.cy), wp.abs(float(height) - cam.cy)) / cam.fy
            cam.r2_max = radial_limit(cam, wp.sqrt(dx * dx + dy * dy))
            lens_ok = cam.r2_max >= 0.0
        if not lens_ok:
            bad[distortion_slot] = 1
            valid = False
    if not valid:
        cam.near = 1.0
        cam.far = 0.0
    cams[0] = cam
