"""Tile rasteriser: front-to-back compositing and its hand-written backward.

Both kernels run one 256-thread block per 16x16 tile (``tile_pixel``). A block walks
its tile's depth-sorted range in batches of ``block_dim`` entries staged in shared
memory (``batch_funcs``): each thread loads one entry, then every thread reads the
batch with broadcast shared loads. All threads reach every barrier, pixels outside the
image included. In the backward all lanes of a warp read the same entry at a time, so
they reach the accumulator together and with one index.

A warp's 32 pixels are an 8x4 block of the tile, its subtile (a tile holds 2 x 4). The
forward stages with each entry the subtiles its footprint's box reaches
(``subtile_mask``), and each warp evaluates only those entries: a small splat reaches a
few of a tile's 8 subtiles, and fewer of these squarer blocks than of full-width pixel
rows. The box holds every pixel where the splat's alpha passes 1/255 (the binning's own
footprint), so the image is what evaluating every entry gives. The backward stages the
same mask and a warp skips, as one, the entries whose bit it lacks (``warp_skips``): no
lane of it could find them valid, so the gradients and the transmittance it restores
back to front are what evaluating every entry gives.

With a surface (``make_raster_fwd(True)`` and the backward's ``surface``, compile-time
variants: without one the kernels are the plain ones) a pixel's walk also ends at the
first entry not in front of its surface depth, and the surface colour takes the
background's place in the composite and in the backward's ``T_final * background`` term.

The ``deterministic`` backward adds nothing atomically: per entry, each warp sums its
pixels with the fixed reduce-scatter tree, the warps' sums meet in shared memory and
are added in warp order, and the total is written to the entry's own slot of a
per-intersection array (summed per Gaussian in a fixed order afterwards, see
``GaussianRenderer.backward``).
"""

import functools

import warp as wp

from arc_warp._src.arc.intrinsics import ballot, cpu_warp_emulation, drop_lowest, lane_id, lowest_lane, warp_width
from arc_warp._src.splat.raster_batch_funcs import (
    CONIC,
    GEOM,
    PARTIAL_CHUNK,
    PARTIAL_WIDTH,
    RGB,
    batch_buffer,
    batch_get,
    batch_rank,
    batch_stage,
    batch_subtiles,
    block_count,
    block_sync,
    lockstep_any,
    lockstep_max,
    partial_buffer,
    partial_put,
    partial_store,
    partial_take,
    splat_quad,
)
from arc_warp._src.splat.geometry_funcs import (
    ALPHA_MAX,
    ALPHA_MIN,
    BLOCK_PIXELS,
    TILE_SIZE,
    G_ABS,
    G_CONIC,
    G_DEPTH,
    G_OPACITY,
    G_RGB,
    G_XY,
    T_MIN,
    Splat2D,
    float_bits,
    footprint,
    grad_vector,
)

SUB_W = 8  # a warp's pixel block (32 consecutive threads of a tile): 8 wide, 4 high
SUB_H = 32 // SUB_W
SUB_COLS = TILE_SIZE // SUB_W
SUB_ROWS = TILE_SIZE // SUB_H
ALL_SUBTILES = (1 << (SUB_COLS * SUB_ROWS)) - 1


@wp.struct
class TilePixel:
    """Where a rasteriser thread works: its tile, its pixel (x right, y down) and the
    tile's subtile holding the pixel (``SUB_COLS`` per row, in warp order)."""

    tile: int
    x: int
    y: int
    sub: int


@wp.func
def tile_pixel(tid: int, tiles_x: int) -> TilePixel:
    """Tile and pixel of thread ``tid`` in a launch of one 256-thread block per 16x16 tile;
    each warp's 32 threads cover one ``SUB_W`` x ``SUB_H`` subtile, rows of 8 pixels."""
    tp = TilePixel()
    tp.tile = tid // BLOCK_PIXELS
    local = tid - tp.tile * BLOCK_PIXELS
    tp.sub = local // 32
    lane = local - tp.sub * 32
    ty = tp.tile // tiles_x
    tp.x = (tp.tile - ty * tiles_x) * TILE_SIZE + (tp.sub % SUB_COLS) * SUB_W + lane % SUB_W
    tp.y = ty * TILE_SIZE + (tp.sub // SUB_COLS) * SUB_H + lane // SUB_W
    return tp


@wp.struct
class Falloff:
    """A splat seen from a pixel point: ``alpha = opacity * exp(-power)``."""

    power: float  # 0.5 * d^T conic d
    dx: float  # d = centre - point, pixels
    dy: float


@wp.func
def splat_falloff(geom: wp.vec4, conic: wp.vec4, px: float, py: float) -> Falloff:
    """Falloff at pixel point (px, py) of the splat with ``Splat2D`` quads ``geom`` and ``conic``."""
    f = Falloff()
    f.dx = geom[0] - px
    f.dy = geom[1] - py
    f.power = 0.5 * (conic[0] * f.dx * f.dx + conic[2] * f.dy * f.dy) + conic[1] * f.dx * f.dy
    return f


@wp.func
def cell_bits(lo: float, hi: float, size: float, cells: float) -> int:
    """Bit ``i`` set where [lo, hi] reaches a pixel centre of cell ``i`` (pixels
    ``i * size`` to ``(i + 1) * size`` from the tile's edge) of ``cells``; clamped in
    float before the casts."""
    c0 = int(wp.clamp(wp.ceil((lo - (size - 0.5)) / size), 0.0, cells))
    c1 = int(wp.clamp(wp.floor((hi - 0.5) / size), -1.0, cells - 1.0))
    if c1 < c0:
        return 0
    return ((1 << (c1 + 1)) - 1) & ~((1 << c0) - 1)


@wp.func
def subtile_mask(geom: wp.vec4, conic: wp.vec4, col0: int, row0: int) -> int:
    """Bit ``s`` set where the splat can reach a pixel centre of subtile ``s`` (see
    ``tile_pixel``) of the tile whose first pixel is (``col0``, ``row0``): its
    ``footprint``'s box, widened by float32 roundoff; every subtile if the footprint is
    degenerate."""
    f = footprint(geom, conic)
    if not f.exact:
        return ALL_SUBTILES
    # covers the fast-math log / division / sqrt in half_w, half_h (relative error ~1e-6)
    # and the raster's float32 offsets centre - pixel (error <= 2^-11 px in images < 8192 px)
    pad_w = 1e-3 * (1.0 + f.half_w)
    pad_h = 1e-3 * (1.0 + f.half_h)
    dx = f.cx - float(col0)  # small beside the tile, so the bounds round little
    dy = f.cy - float(row0)
    cols = cell_bits(dx - f.half_w - pad_w, dx + f.half_w + pad_w, float(SUB_W), float(SUB_COLS))
    rows = cell_bits(dy - f.half_h - pad_h, dy + f.half_h + pad_h, float(SUB_H), float(SUB_ROWS))
    mask = int(0)
    for r in range(SUB_ROWS):
        if (rows >> r) & 1 != 0:
            mask |= cols << (r * SUB_COLS)
    return mask


@wp.func
def reaches(subtiles: int, sub: int) -> bool:
    """Whether the ``subtile_mask`` ``subtiles`` holds subtile ``sub``."""
    return ((subtiles >> sub) & 1) != 0


@wp.func
def warp_skips(subtiles: int, sub: int) -> bool:
    """Whether the backward's warp of subtile ``sub`` passes over an entry staged with
    mask ``subtiles`` without evaluating it: the mask lacks it (``reaches``). Where the
    CPU emulates warps, collectives synchronise the whole block, so there the block skips
    together, only the entries that reach none of its subtiles (mask 0); its warps that
    the mask lacks then run through them with no lane valid."""
    if cpu_warp_emulation():
        return subtiles == 0
    return not reaches(subtiles, sub)


@wp.func
def stage_entry(
    buf: wp.uint64,
    slot: int,
    gauss_ids: wp.array(dtype=wp.int32),
    splats: wp.array(dtype=Splat2D),
    colors: wp.array(dtype=wp.vec3),
    k: int,
    valid: bool,
    col0: int,
    row0: int,
):
    """Stages sorted entry ``k`` in batch ``slot`` (nothing if not ``valid``), with its
    ``subtile_mask`` in the tile whose first pixel is (``col0``, ``row0``)."""
    if valid:
        g = gauss_ids[k]
        geom = splat_quad(splats, g, 0)
        conic = splat_quad(splats, g, 1)
        batch_stage(buf, slot, geom, conic, colors[g], g, subtile_mask(geom, conic, col0, row0))


@functools.cache
def make_raster_fwd(surface: bool = False):
    """The tile rasteriser's forward; ``surface`` (a compile-time choice) composites the
    Gaussians over an opaque surface per pixel (``surface_colors``, ``surface_depths``;
    None without it, where the kernel is the plain one, code and arithmetic).

    Launch with ``dim = n_tiles * 256, block_dim = 256``. With a surface, an entry whose
    depth (its centre's camera z, ``Splat2D.geom[3]``) is not in front of the pixel's
    surface depth is not composited there. Entries run in depth order (the sort's keys
    are these depths' bits), so the first such entry ends the pixel like the transmittance
    floor does, and ``last_ids`` / ``final_t`` tell the backward where it stopped. The
    surface colour takes the background's place (``T_final * colour``) where its depth is
    below +inf; elsewhere the background shows, as without a surface. ``alpha``, ``depth``
    and ``expected_depth`` stay the Gaussians' own (1 - T_final, sum w_i z_i, their ratio).
    """

    # 8 blocks per SM caps registers at 32: full occupancy (the spills, 56 bytes at sm_90, are
    # in the staging and the epilogue, outside the entry loops)
    @wp.kernel(
        enable_backward=False,
        module_options={"fast_math": True},
        module="unique",
        launch_bounds=(BLOCK_PIXELS, 8),
    )
    def raster_fwd(
        gauss_ids: wp.array(dtype=wp.int32),
        ranges: wp.array(dtype=wp.vec2i),
        splats: wp.array(dtype=Splat2D),
        colors: wp.array(dtype=wp.vec3),
        width: int,
        height: int,
        tiles_x: int,
        background: wp.vec3,
        surface_colors: wp.array2d(dtype=wp.vec3),
        surface_depths: wp.array2d(dtype=float),
        out_color: wp.array2d(dtype=wp.vec3),
        out_alpha: wp.array2d(dtype=float),
        out_depth: wp.array2d(dtype=float),
        out_expected_depth: wp.array2d(dtype=float),
        out_final_t: wp.array2d(dtype=float),
        out_last: wp.array2d(dtype=wp.int32),
    ):
        tp = tile_pixel(wp.tid(), tiles_x)
        x = tp.x
        y = tp.y
        inside = x < width and y < height
        px = float(x) + 0.5
        py = float(y) + 0.5
        r = ranges[tp.tile]
        buf = batch_buffer()
        rank = batch_rank()
        size = wp.block_dim()
        lanes = warp_width()
        lane = lane_id()
        col0 = x - x % TILE_SIZE
        row0 = y - y % TILE_SIZE
        sub = tp.sub
        t = float(1.0)
        rgb = wp.vec3(0.0)
        depth = float(0.0)
        last = int(-1)
        done = not inside
        surface_depth = float(0.0)  # read inside the image only (outside, done from the start)
        if wp.static(surface):
            if inside:
                surface_depth = surface_depths[y, x]
        start = r[0]
        while start < r[1]:
            # the barrier also tells the block that the previous batch is no longer read
            if block_count(done) == size:
                break
            stage_entry(buf, rank, gauss_ids, splats, colors, start + rank, start + rank < r[1], col0, row0)
            block_sync()
            count = wp.min(size, r[1] - start)
            # chunks of one warp's width: each lane tests one entry's subtile bit, then the warp
            # walks the entries that reach its subtile front to back (every lane ballots)
            chunk = int(0)
            while chunk < count:
                hit = False
                if chunk + lane < count:
                    hit = reaches(batch_subtiles(buf, chunk + lane), sub)
                pending = ballot(-1, hit)
                while pending != 0 and not done:
                    j = chunk + lowest_lane(pending)
                    pending = drop_lowest(pending)
                    geom = batch_get(buf, GEOM, j)
                    if wp.static(surface):
                        # in depth order, every entry after one at or behind the surface is too
                        if geom[3] >= surface_depth:
                            done = True
                            break
                    opacity = geom[2]
                    f = splat_falloff(geom, batch_get(buf, CONIC, j), px, py)
                    # -1.0 * power: a sign flip folded into exp's multiply; Warp's unary minus is 0 - x
                    alpha = wp.min(ALPHA_MAX, opacity * wp.exp(-1.0 * f.power))
                    if f.power < 0.0 or alpha < ALPHA_MIN:
                        continue
                    next_t = t * (1.0 - alpha)
                    if next_t <= T_MIN:
                        done = True
                        break
                    w = alpha * t
                    c = batch_get(buf, RGB, j)
                    rgb += w * wp.vec3(c[0], c[1], c[2])
                    splat_depth = geom[3]
                    depth += w * splat_depth
                    last = start + j
                    t = next_t
                chunk += lanes
            start += size
        if inside:
            alpha_out = 1.0 - t
            behind = background
            if wp.static(surface):
                if surface_depth < wp.inf:
                    behind = surface_colors[y, x]
            out_color[y, x] = rgb + t * behind
            out_alpha[y, x] = alpha_out
            if out_depth.shape[0] > 0:  # (0, 0) depth images: not wanted (the torch bridge's RGB mode)
                out_depth[y, x] = depth
                expected = float(0.0)
                if alpha_out > 0.0:
                    expected = depth / alpha_out
                out_expected_depth[y, x] = expected
            out_final_t[y, x] = t
            out_last[y, x] = last

    return raster_fwd


@functools.cache
def make_raster_bwd(mode: str, absgrad: bool, surface: bool = False):
    """Backward of ``make_raster_fwd(surface)``; ``mode`` picks the accumulator (a
    compile-time choice).

    Launch with ``dim = n_tiles * 256, block_dim = 256``. Batches run back to front from
    the block's last contributor; a warp starts each batch at its own last contributor.
    Threads of pixels outside the image run the loop with nothing to add: every lane
    must reach the plan and, in a reducing warp, the reducer.

    Entries are staged with their ``subtile_mask`` and a warp passes over those that
    cannot reach its pixels (``warp_skips``), as the forward does: no lane of it could
    find them valid, so the gradients are those of evaluating every entry.

    ``out_grads`` is (N,) per Gaussian, except for ``deterministic``: (n_isects,) per
    sorted entry, zero-initialised, each written by its tile's block alone. An image
    cotangent may be None (zero), so a missing one costs no zero image.

    With ``surface``, the pixel's surface colour stands in for the background in each
    entry's gradient where its depth is below +inf (the forward's last contributor already
    excludes the entries behind it), and ``grad_surface_colors`` ((H, W) wp.vec3, or None:
    not wanted) gets ``T_final * dL/dcolour`` added there; the surface depths get no
    gradient (visibility is a step in them). Without it the three surface arrays are unused
    (None).
    """
    from arc_warp._src.arc.intrinsics import reduce_scatter
    from arc_warp._src.arc.reduce_funcs import check_mode, lane_adder, warp_plan, warp_reducer

    det = check_mode(mode, accumulating=False) == "deterministic"
    grad_t = grad_vector(absgrad)
    k = grad_t._length_
    if k > PARTIAL_WIDTH:
        raise ValueError(f"the deterministic cells hold {PARTIAL_WIDTH} components; the gradient has {k}")
    # Plan first, then compute inside the branch that adds (see warp_plan). All lanes of
    # a warp read the same batch entry, hence reduce with one index. (deterministic
    # builds the arc helpers only so that every name of the kernel resolves.)
    acc_mode = "arc" if det else mode
    plan = warp_plan(acc_mode)  # never True for atomic and floor
    reduce = warp_reducer(grad_t, acc_mode, uniform_index=True)
    lane_add = lane_adder(grad_t, acc_mode)
    reduce_scatter_k, owned_component = reduce_scatter(k)
    store_component = partial_store(grad_t)
    # deterministic flushes its partials every PARTIAL_CHUNK slots; the others never
    chunk = PARTIAL_CHUNK if det else BLOCK_PIXELS

    def entry_gradient(
        geom: wp.vec4,
        conic: wp.vec4,
        f: Falloff,
        vis: float,
        alpha: float,
        ra: float,
        t: float,
        c: wp.vec3,
        rgb_behind: wp.vec3,
        depth_behind: float,
        v_rgb_px: wp.vec3,
        v_depth_px: float,
        v_final: float,
    ):
        # Gradient of one pixel's outputs with respect to one entry; t is the
        # transmittance in front of it and ra = 1 / (1 - alpha).
        opacity = geom[2]
        splat_depth = geom[3]
        fac = alpha * t
        v = grad_t()
        v_alpha = (
            wp.dot(c * t - rgb_behind * ra, v_rgb_px)
            + (splat_depth * t - depth_behind * ra) * v_depth_px
            + v_final * ra
        )
        v[G_RGB] = fac * v_rgb_px[0]
        v[G_RGB + 1] = fac * v_rgb_px[1]
        v[G_RGB + 2] = fac * v_rgb_px[2]
        v[G_DEPTH] = fac * v_depth_px
        if opacity * vis <= ALPHA_MAX:  # alpha not clamped
            v_power = -opacity * vis * v_alpha
            v[G_CONIC] = 0.5 * v_power * f.dx * f.dx
            v[G_CONIC + 1] = v_power * f.dx * f.dy
            v[G_CONIC + 2] = 0.5 * v_power * f.dy * f.dy
            v[G_XY] = v_power * (conic[0] * f.dx + conic[1] * f.dy)
            v[G_XY + 1] = v_power * (conic[1] * f.dx + conic[2] * f.dy)
            if wp.static(absgrad):
                v[G_ABS] = wp.abs(v[G_XY])
                v[G_ABS + 1] = wp.abs(v[G_XY + 1])
            v[G_OPACITY] = vis * v_alpha
        return v

    entry_gradient = wp.func(entry_gradient, name=f"raster_entry_gradient_{int(absgrad)}", module="unique")

    def put_warp_partial(buf: wp.uint64, slot: int, value: grad_t, valid: bool):
        # The warp's sum over its valid lanes, by the fixed reduce-scatter tree; a CPU
        # warp of one lane stores its own value.
        part = grad_t()
        if valid:
            part = value
        if warp_width() == 32:
            total = reduce_scatter_k(-1, part)
            comp = owned_component(lane_id())
            if comp >= 0:
                partial_put(buf, slot, comp, total)
        else:
            for i in range(wp.static(k)):
                partial_put(buf, slot, i, part[i])

    put_warp_partial = wp.func(put_warp_partial, name=f"raster_put_partial_{int(absgrad)}", module="unique")

    # 4 blocks per SM caps registers at 64; the reducing modes keep 48 bytes on the stack
    # there (sm_90), and still ran faster than the accumulate-after-compute kernel (BENCHMARKS)
    @wp.kernel(
        enable_backward=False,
        module_options={"fast_math": True},
        module="unique",
        launch_bounds=(BLOCK_PIXELS, 4),
    )
    def raster_bwd(
        gauss_ids: wp.array(dtype=wp.int32),
        ranges: wp.array(dtype=wp.vec2i),
        splats: wp.array(dtype=Splat2D),
        colors: wp.array(dtype=wp.vec3),
        width: int,
        height: int,
        tiles_x: int,
        background: wp.vec3,
        surface_colors: wp.array2d(dtype=wp.vec3),
        surface_depths: wp.array2d(dtype=float),
        final_t: wp.array2d(dtype=float),
        last_ids: wp.array2d(dtype=wp.int32),
        depth_img: wp.array2d(dtype=float),
        v_color: wp.array2d(dtype=wp.vec3),
        v_alpha_img: wp.array2d(dtype=float),
        v_depth_img: wp.array2d(dtype=float),
        v_expected_img: wp.array2d(dtype=float),
        threshold: int,
        out_grads: wp.array(dtype=grad_t),
        grad_surface_colors: wp.array2d(dtype=wp.vec3),
    ):
        tp = tile_pixel(wp.tid(), tiles_x)
        x = tp.x
        y = tp.y
        px = float(x) + 0.5
        py = float(y) + 0.5
        t_final = float(1.0)
        last = int(-1)  # outside pixels: no entry is valid
        v_rgb_px = wp.vec3(0.0)
        v_alpha_px = float(0.0)
        v_depth_px = float(0.0)
        behind = background
        if x < width and y < height:
            t_final = final_t[y, x]
            last = last_ids[y, x]
            # a cotangent not given (None: an empty array) is zero; the same arithmetic
            # follows, so the gradients are those of a zero image
            if v_color.shape[0] > 0:
                v_rgb_px = v_color[y, x]
            if v_alpha_img.shape[0] > 0:
                v_alpha_px = v_alpha_img[y, x]
            if v_depth_img.shape[0] > 0:
                v_depth_px = v_depth_img[y, x]
            # expected depth = depth / alpha, folded into the depth and alpha gradients (only
            # with its cotangent: without one the depth image may be (0, 0), never written)
            alpha_out = 1.0 - t_final
            if alpha_out > 0.0 and v_expected_img.shape[0] > 0:
                v_ed = v_expected_img[y, x]
                v_depth_px += v_ed / alpha_out
                v_alpha_px -= v_ed * depth_img[y, x] / (alpha_out * alpha_out)
            if wp.static(surface):
                if surface_depths[y, x] < wp.inf:
                    behind = surface_colors[y, x]
                    if grad_surface_colors.shape[0] > 0:  # one thread per pixel: a plain add
                        grad_surface_colors[y, x] = grad_surface_colors[y, x] + t_final * v_rgb_px
        # d(output)/d(alpha_i) terms that do not depend on i: alpha and what shows behind
        v_final = t_final * (v_alpha_px - wp.dot(behind, v_rgb_px))

        # entries behind every pixel's last contributor are skipped block-wide, and
        # behind the warp's last contributor warp-wide
        block_last = wp.tile_max(wp.tile(last))[0]
        warp_last = lockstep_max(last)
        r = ranges[tp.tile]
        buf = batch_buffer()
        parts = wp.uint64(0)
        if wp.static(det):
            parts = partial_buffer()  # zeroed before the first batch's barrier
        rank = batch_rank()
        size = wp.block_dim()
        t = t_final
        rgb_behind = wp.vec3(0.0)
        depth_behind = float(0.0)
        sub = tp.sub
        hi = wp.min(r[1], block_last + 1)  # batch [lo, hi), slot s holds entry hi - 1 - s
        while hi > r[0]:
            lo = wp.max(r[0], hi - size)
            block_sync()  # the previous batch is no longer read
            stage_entry(buf, rank, gauss_ids, splats, colors, hi - 1 - rank, hi - 1 - rank >= lo,
                        x - x % TILE_SIZE, y - y % TILE_SIZE)
            block_sync()
            # chunks of slots [c0, c1): one per batch, except deterministic's flushes
            c0 = int(0)
            while c0 < hi - lo:
                c1 = wp.min(c0 + wp.static(chunk), hi - lo)
                for s in range(wp.max(c0, hi - 1 - warp_last), c1):
                    # the entry's footprint box misses the warp's pixels (the forward
                    # never evaluated it there): no lane can be valid
                    subtiles = batch_subtiles(buf, s)
                    reach = reaches(subtiles, sub)
                    if warp_skips(subtiles, sub):
                        continue
                    geom = batch_get(buf, GEOM, s)
                    conic = batch_get(buf, CONIC, s)
                    f = splat_falloff(geom, conic, px, py)
                    vis = wp.exp(-1.0 * f.power)  # as the forward's alpha
                    opacity = geom[2]
                    alpha = wp.min(ALPHA_MAX, opacity * vis)
                    # exactly the entries the forward composited, so by the mask too (which
                    # changes nothing while the box holds every pixel passing ALPHA_MIN; it
                    # need not past EXTEND_MAX std-devs, with opacities above ~1)
                    valid = reach and hi - 1 - s <= last and not (f.power < 0.0 or alpha < ALPHA_MIN)
                    # most entries reach no pixel of a warp: skip them before planning
                    if lockstep_any(valid):
                        ra = 1.0 / (1.0 - alpha)
                        t_in_front = t * ra
                        c4 = batch_get(buf, RGB, s)
                        c = wp.vec3(c4[0], c4[1], c4[2])
                        index = float_bits(conic[3])
                        if wp.static(det):
                            # every lane computes (invalid lanes' values are dropped)
                            grad = entry_gradient(geom, conic, f, vis, alpha, ra, t_in_front, c, rgb_behind,
                                                  depth_behind, v_rgb_px, v_depth_px, v_final)
                            put_warp_partial(parts, s - c0, grad, valid)
                        elif plan(valid, threshold):
                            # every lane computes (invalid lanes' values are ignored)
                            grad = entry_gradient(geom, conic, f, vis, alpha, ra, t_in_front, c, rgb_behind,
                                                  depth_behind, v_rgb_px, v_depth_px, v_final)
                            reduce(out_grads, index, grad, valid, threshold)
                        elif valid:
                            grad = entry_gradient(geom, conic, f, vis, alpha, ra, t_in_front, c, rgb_behind,
                                                  depth_behind, v_rgb_px, v_depth_px, v_final)
                            lane_add(out_grads, index, grad, True, threshold)
                        if valid:
                            fac = alpha * t_in_front
                            t = t_in_front
                            rgb_behind += fac * c
                            depth_behind += fac * geom[3]
                if wp.static(det):
                    # the warps' partials of slots [c0, c1) in warp order, one cell per
                    # thread; the barriers fence the cells' writes and their reuse
                    block_sync()
                    cell = rank
                    while cell < (c1 - c0) * wp.static(k):
                        slot = cell // wp.static(k)
                        comp = cell - slot * wp.static(k)
                        store_component(out_grads, hi - 1 - c0 - slot, comp, partial_take(parts, slot, comp))
                        cell += size
                    block_sync()
                c0 = c1
            hi = lo

    return raster_bwd
