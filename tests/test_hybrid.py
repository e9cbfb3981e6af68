"""Hybrid compositing: Gaussians over an opaque surface per pixel (a mesh's colour and depth).

The renderer's composite is compared with the dense float64 reference (reference_splat's
`composite` with a surface): images, Gaussian and surface-colour gradients, in every
reduce mode and with emulated warps. A surface at +inf everywhere must give today's
render bit for bit. `surface_from_mesh` is checked against analytic depths, and the whole
chain mesh ops -> surface_from_mesh -> composite -> loss by finite differences on the
mesh vertices.
"""

import contextlib

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the float64 reference needs torch")
wp = pytest.importorskip("warp")

import arc_warp  # noqa: E402
import arc_warp.mesh as dr  # noqa: E402
from arc_warp.splat import surface_from_mesh  # noqa: E402

from conftest import random_scene  # noqa: E402
from reference_splat import fragile_fields, margins, render_reference, surface_margin  # noqa: E402
from test_splat_reference import (  # noqa: E402
    OUTPUTS, PARAMS, assert_forward_close, assert_grads_close, cotangents, ref_camera, torch_params,
    warp_inputs,
)

BACKGROUND = (0.2, 0.5, 0.8)
# Surface depths closer than this (relative) to a Gaussian they could hide are redrawn:
# the renderer's float32 camera depths sit ~1e-7 relative from float64's, so 1e-5 keeps
# every occlusion decision float64's with a 100x margin.
SURFACE_MARGIN = 1e-5


def random_surface(rng, height, width, depth_range=(1.5, 5.0), empty=0.3):
    """(H, W, 3) float32 colours in [0, 1] and (H, W) float32 depths uniform in
    ``depth_range`` (the scenes' Gaussian depths), +inf at a fraction ``empty`` of pixels."""
    colors = rng.uniform(0.0, 1.0, size=(height, width, 3)).astype(np.float32)
    depths = rng.uniform(*depth_range, size=(height, width)).astype(np.float32)
    depths[rng.uniform(size=(height, width)) < empty] = np.inf
    return colors, depths


def reference(scene, params, surface, background=BACKGROUND, colors=None):
    """The float64 reference render over ``surface`` ((colours, depths) numpy, or None);
    ``colors`` replaces the surface colours (a tensor that may require grad)."""
    sc, sd = (None, None) if surface is None else surface
    if surface is not None and colors is None:
        colors = torch.tensor(sc, dtype=torch.float64)
    return render_reference(params["means"], params["quats"], params["scales"], params["opacities"],
                            params["colors"], ref_camera(scene), scene.sh_degree, background,
                            surface_colors=colors, surface_depths=None if sd is None else torch.tensor(sd))


def robust_hybrid(rng, tries=40, scene=None, **kwargs):
    """A random scene and surface whose float64 composite is not within float32 noise of
    any discrete decision (test_splat_reference.robust_scene's, plus every occlusion);
    ``scene`` given: only the surface is drawn."""
    given = scene
    for _ in range(tries):
        scene = random_scene(rng, **kwargs) if given is None else given
        surface = random_surface(rng, scene.height, scene.width)
        with torch.no_grad():
            p = torch_params(scene)
            ref = reference(scene, p, surface)
            if (not fragile_fields(margins(ref, p["opacities"], ref_camera(scene)))
                    and surface_margin(ref, surface[1]) > SURFACE_MARGIN):
                return scene, surface
    raise RuntimeError(f"no robust scene and surface in {tries} tries for {kwargs}")


def camera_of(scene):
    return arc_warp.Camera(scene.fx, scene.fy, scene.cx, scene.cy, scene.width, scene.height,
                           world_to_camera=scene.world_to_camera, near=scene.near, far=scene.far)


def surface_arrays(surface, device, requires_grad=False):
    sc, sd = surface
    return (wp.array(sc, dtype=wp.vec3, device=device, requires_grad=requires_grad),
            wp.array(sd, dtype=wp.float32, device=device))


def render_hybrid(scene, device, surface, reduce="arc", inputs=None, arrays=None, background=BACKGROUND):
    """arc_warp's render of ``scene`` over ``surface`` (None: without one); ``arrays`` the
    surface's Warp arrays if already made."""
    settings = arc_warp.RenderSettings(sh_degree=scene.sh_degree, background=background, reduce=reduce)
    inputs = warp_inputs(scene, device) if inputs is None else inputs
    if surface is not None and arrays is None:
        arrays = surface_arrays(surface, device)
    sc, sd = (None, None) if surface is None else arrays
    return arc_warp.render_gaussians(inputs["means"], inputs["quats"], inputs["scales"], inputs["opacities"],
                                     inputs["colors"], camera_of(scene), settings, surface_colors=sc,
                                     surface_depths=sd)


def cotangent_arrays(cot, device):
    return (wp.array(cot["color"], dtype=wp.vec3, device=device),
            wp.array(cot["alpha"], dtype=wp.float32, device=device),
            wp.array(cot["depth"], dtype=wp.float32, device=device),
            wp.array(cot["expected_depth"], dtype=wp.float32, device=device))


def reference_grads(scene, surface, cot) -> dict:
    """float64 gradients of sum_k <cot[k], image k> w.r.t. the Gaussians and the surface colours."""
    p = torch_params(scene, requires_grad=True)
    colors = torch.tensor(surface[0], dtype=torch.float64, requires_grad=True)
    ref = reference(scene, p, surface, colors=colors)
    loss = sum((getattr(ref, k) * torch.tensor(cot[k], dtype=torch.float64)).sum() for k in OUTPUTS)
    loss.backward()
    grads = {k: p[k].grad.numpy() for k in PARAMS}
    grads["surface"] = colors.grad.numpy()
    return grads


def assert_surface_grad_close(got, want):
    # T_final * dL/dcolour: T's float32 roundoff (the forward's product of up to ~50
    # factors, ~1e-6 relative; observed <= 2e-7 norm-wise) is all that separates it from
    # float64, plus the add into a prefilled buffer (~1e-7 of its values)
    g = np.asarray(got, np.float64).reshape(want.shape)
    err = np.linalg.norm(g - want) / np.linalg.norm(want)
    assert err <= 1e-5, f"surface colours: norm-wise relative error {err:.3e}"


# --- renderer versus the float64 reference ----------------------------------------------


@pytest.mark.parametrize("sh_degree,opaque", [(None, False), (1, True)], ids=["rgb", "sh1_opaque"])
def test_forward_matches_reference(rng, device, cpu_blocks, sh_degree, opaque):
    kw = dict(n=50, width=27, height=21, sh_degree=sh_degree)
    if opaque:  # dense enough that pixels also end at the transmittance floor
        kw.update(n=120, opacity_range=(0.6, 0.99), size_px_range=(1.5, 8.0))
    scene, surface = robust_hybrid(rng, **kw)
    with torch.no_grad():
        ref = reference(scene, torch_params(scene), surface)
        plain = reference(scene, torch_params(scene), None)
    # the surface hides Gaussians at some pixels and shows through others
    assert (plain.valid & ~ref.valid).any() and ref.valid.any()
    assert np.isinf(surface[1]).any() and np.isfinite(surface[1]).any()
    if opaque:
        assert bool(ref.terminated.any()), "opaque scene should exercise early termination"
    out = render_hybrid(scene, device, surface)
    got = {k: getattr(out, k).numpy() for k in OUTPUTS}
    got["means2d"], got["radii"] = out.means2d.numpy(), out.radii.numpy()
    assert_forward_close(got, ref)


@pytest.mark.parametrize("reduce", ["atomic", "warp", "arc", "deterministic"])
def test_gradients_match_reference(rng, device, reduce, cpu_blocks):
    if cpu_blocks:  # fibers emulate 256-lane blocks: a couple of tiles
        kw = dict(n=40, width=19, height=13, sh_degree=1, opacity_range=(0.3, 0.99), size_px_range=(1.0, 6.0))
    else:
        kw = dict(n=60, width=33, height=24, sh_degree=2, opacity_range=(0.3, 0.99), size_px_range=(1.0, 8.0))
    scene, surface = robust_hybrid(rng, **kw)
    cot = cotangents(rng, scene)
    want = reference_grads(scene, surface, cot)
    out = render_hybrid(scene, device, surface, reduce)
    before = rng.normal(size=(scene.height, scene.width, 3)).astype(np.float32)
    grad_surface = wp.array(before, dtype=wp.vec3, device=device)  # added into, as a tape's .grad
    g = arc_warp.render_gaussians_backward(out, *cotangent_arrays(cot, device), grad_surface_colors=grad_surface)
    assert_grads_close({k: getattr(g, k).numpy() for k in PARAMS}, want)
    added = grad_surface.numpy() - before
    assert_surface_grad_close(added, want["surface"])
    # where the depth is +inf the surface does not show, so it gets nothing
    np.testing.assert_array_equal(grad_surface.numpy()[np.isinf(surface[1])], before[np.isinf(surface[1])])


def test_tape_path_over_a_camera_batch(rng, device):
    # two cameras (one pose, two surfaces) with their surfaces as one (C, H, W) array pair:
    # gradients reach each camera's view of the colours' .grad
    scene, surface = robust_hybrid(rng, n=40, width=24, height=18, sh_degree=1)
    _, surface2 = robust_hybrid(rng, scene=scene)
    cots = [cotangents(rng, scene), cotangents(rng, scene)]
    wants = [reference_grads(scene, f, c) for f, c in zip((surface, surface2), cots)]
    inputs = warp_inputs(scene, device, requires_grad=True)
    colors = wp.array(np.stack([surface[0], surface2[0]]), dtype=wp.vec3, device=device, requires_grad=True)
    depths = wp.array(np.stack([surface[1], surface2[1]]), dtype=wp.float32, device=device)
    settings = arc_warp.RenderSettings(sh_degree=1, background=BACKGROUND)
    tape = wp.Tape()
    with tape:
        outs = arc_warp.render_gaussians(inputs["means"], inputs["quats"], inputs["scales"], inputs["opacities"],
                                         inputs["colors"], [camera_of(scene), camera_of(scene)], settings,
                                         surface_colors=colors, surface_depths=depths)
    grads = {}
    for out, cot in zip(outs, cots):
        for k, img in zip(OUTPUTS, cotangent_arrays(cot, device)):
            grads[getattr(out, k)] = img
    tape.backward(grads=grads)
    want_params = {k: wants[0][k] + wants[1][k] for k in PARAMS}
    assert_grads_close({k: inputs[k].grad.numpy() for k in PARAMS}, want_params)
    for c in range(2):
        assert_surface_grad_close(colors.grad.numpy()[c], wants[c]["surface"])


def test_surface_alone_without_gaussians(device):
    # no Gaussians: the surface where its depth is finite, the background elsewhere
    h, w = 9, 13
    rng = np.random.default_rng(5)
    sc, sd = random_surface(rng, h, w)
    empty = {k: wp.zeros(0, dtype=t, device=device) for k, t in
             (("means", wp.vec3), ("quats", wp.vec4), ("scales", wp.vec3), ("opacities", wp.float32),
              ("colors", wp.vec3))}
    colors = wp.array(sc, dtype=wp.vec3, device=device, requires_grad=True)
    depths = wp.array(sd, dtype=wp.float32, device=device)
    cam = arc_warp.Camera.from_fov(50.0, w, h)
    tape = wp.Tape()
    with tape:
        out = arc_warp.render_gaussians(*empty.values(), cam, arc_warp.RenderSettings(background=BACKGROUND),
                                        surface_colors=colors, surface_depths=depths)
    want = np.where(np.isfinite(sd)[..., None], sc, np.float32(BACKGROUND))
    np.testing.assert_array_equal(out.color.numpy(), want)
    cot = rng.normal(size=(h, w, 3)).astype(np.float32)
    tape.backward(grads={out.color: wp.array(cot, dtype=wp.vec3, device=device)})
    np.testing.assert_array_equal(colors.grad.numpy(), np.where(np.isfinite(sd)[..., None], cot, 0.0))


@pytest.mark.parametrize("reduce", ["arc", "deterministic"])
def test_surface_at_infinity_is_todays_render(rng, device, cpu_blocks, reduce):
    # bit for bit: images, and gradients wherever the backward is deterministic (the CPU
    # runs its atomics in order; a GPU's arc sums in whichever order the atomics land)
    kw = dict(n=40, width=19, height=13, sh_degree=1, opacity_range=(0.3, 0.99), size_px_range=(1.0, 6.0))
    scene = random_scene(rng, **kw)
    surface = (rng.uniform(size=(scene.height, scene.width, 3)).astype(np.float32),
               np.full((scene.height, scene.width), np.inf, np.float32))
    cot = cotangents(rng, scene)
    plain = render_hybrid(scene, device, None, reduce)
    hybrid = render_hybrid(scene, device, surface, reduce)
    for k in OUTPUTS:
        np.testing.assert_array_equal(getattr(hybrid, k).numpy(), getattr(plain, k).numpy(), err_msg=k)
    g_plain = arc_warp.render_gaussians_backward(plain, *cotangent_arrays(cot, device))
    grad_surface = wp.zeros((scene.height, scene.width), dtype=wp.vec3, device=device)
    g_hybrid = arc_warp.render_gaussians_backward(hybrid, *cotangent_arrays(cot, device),
                                                  grad_surface_colors=grad_surface)
    for k in PARAMS:
        got, want = getattr(g_hybrid, k).numpy(), getattr(g_plain, k).numpy()
        if device == "cpu" or reduce == "deterministic":
            np.testing.assert_array_equal(got, want, err_msg=k)
        else:  # float32 sums in another order
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6 * np.abs(want).max(), err_msg=k)
    assert not grad_surface.numpy().any()


# --- bad input ----------------------------------------------------------------------------


def _tiny(device, h=6, w=8):
    rng = np.random.default_rng(3)
    scene = random_scene(rng, n=5, width=w, height=h)
    return scene, warp_inputs(scene, device)


def _render(scene, inputs, **surface):
    return arc_warp.render_gaussians(inputs["means"], inputs["quats"], inputs["scales"], inputs["opacities"],
                                     inputs["colors"], camera_of(scene), **surface)


def test_bad_surfaces_raise_before_launching():
    scene, inputs = _tiny("cpu")
    h, w = scene.height, scene.width
    colors = wp.zeros((h, w), dtype=wp.vec3)
    depths = wp.full((h, w), np.inf, dtype=wp.float32)
    with pytest.raises(ValueError, match="go together"):
        _render(scene, inputs, surface_colors=colors)
    with pytest.raises(ValueError, match=r"surface_depths must have shape \(6, 8\), got \(6, 9\)"):
        _render(scene, inputs, surface_colors=colors, surface_depths=wp.zeros((h, w + 1), dtype=wp.float32))
    with pytest.raises(TypeError, match="surface_colors must have dtype vec3"):
        _render(scene, inputs, surface_colors=wp.zeros((h, w, 3), dtype=wp.float32), surface_depths=depths)
    cams = [camera_of(scene)] * 2
    with pytest.raises(ValueError, match="one image per camera"):
        arc_warp.render_gaussians(*inputs.values(), cams, surface_colors=[colors], surface_depths=[depths])
    with pytest.raises(TypeError, match="list of 2 cameras"):
        arc_warp.render_gaussians(*inputs.values(), cams, surface_colors=colors, surface_depths=depths)
    out = _render(scene, inputs)
    with pytest.raises(ValueError, match="had no surface"):
        arc_warp.render_gaussians_backward(out, None, grad_surface_colors=colors)


@pytest.mark.parametrize("n", [5, 0], ids=["gaussians", "none"])
def test_nan_depths_and_bad_colours_are_found_on_the_device(n):
    scene, inputs = _tiny("cpu")
    if n == 0:
        inputs = {k: v[:0] for k, v in inputs.items()}
    h, w = scene.height, scene.width
    depths = np.full((h, w), np.inf, np.float32)
    depths[2, 3] = -np.inf  # a surface in front of everything: fine
    ok = dict(surface_colors=wp.zeros((h, w), dtype=wp.vec3), surface_depths=wp.array(depths))
    _render(scene, inputs, **ok)
    depths[1, 1] = np.nan
    with pytest.raises(ValueError, match="surface_depths has NaN"):
        _render(scene, inputs, surface_colors=ok["surface_colors"], surface_depths=wp.array(depths))
    colors = np.zeros((h, w, 3), np.float32)
    colors[4, 5, 1] = np.inf
    with pytest.raises(ValueError, match=r"non-finite \(NaN/Inf\) values in surface_colors"):
        _render(scene, inputs, surface_colors=wp.array(colors, dtype=wp.vec3), surface_depths=ok["surface_depths"])


@pytest.mark.gpu
@pytest.mark.skipif(not wp.is_cuda_available(), reason="needs a CUDA device")
def test_surface_on_another_device_raises():
    scene, inputs = _tiny("cuda")
    h, w = scene.height, scene.width
    with pytest.raises(ValueError, match="surface_colors is on cpu, expected cuda"):
        _render(scene, inputs, surface_colors=wp.zeros((h, w), dtype=wp.vec3, device="cpu"),
                surface_depths=wp.zeros((h, w), dtype=wp.float32, device="cuda"))


def test_surface_from_mesh_rejects_bad_input():
    color = wp.zeros((1, 4, 5, 3), dtype=wp.float32)
    rast = wp.zeros((1, 4, 5, 4), dtype=wp.float32)
    pos = wp.zeros((3, 4), dtype=wp.float32)
    tri = wp.zeros((1, 3), dtype=wp.int32)
    with pytest.raises(TypeError, match="flip_y"):
        surface_from_mesh(color, rast, pos, tri)  # the row order is not guessed
    with pytest.raises(TypeError, match="flip_y must be a bool"):
        surface_from_mesh(color, rast, pos, tri, flip_y=1)
    with pytest.raises(ValueError, match=r"rast must have shape \(1, 4, 5, 4\)"):
        surface_from_mesh(color, wp.zeros((1, 5, 4, 4), dtype=wp.float32), pos, tri, flip_y=True)
    with pytest.raises(ValueError, match="minibatch of 1 or 1"):
        surface_from_mesh(color, rast, wp.zeros((2, 3, 4), dtype=wp.float32), tri, flip_y=True)
    with pytest.raises(ValueError, match="color must have shape 4-D with last axis 3"):
        surface_from_mesh(wp.zeros((1, 4, 5, 4), dtype=wp.float32), rast, pos, tri, flip_y=True)


# --- meshes: surface_from_mesh and the chain through the mesh ops ---------------------------


def clip_matrix(cam: arc_warp.Camera, y_up: bool, near=0.1, far=100.0) -> np.ndarray:
    """(4, 4) world -> ``arc_warp.mesh`` clip space of ``cam``: NDC x = 2u/W - 1 and NDC y =
    1 - 2v/H (``y_up``, OpenGL-style: the mesh image's row 0 is the picture's bottom) or
    2v/H - 1 (row 0 at the top), for pixel (u, v); w = camera z."""
    sy = -1.0 if y_up else 1.0
    proj = np.array([
        [2.0 * cam.fx / cam.width, 0.0, 2.0 * cam.cx / cam.width - 1.0, 0.0],
        [0.0, sy * 2.0 * cam.fy / cam.height, sy * (2.0 * cam.cy / cam.height - 1.0), 0.0],
        [0.0, 0.0, (far + near) / (far - near), -2.0 * far * near / (far - near)],
        [0.0, 0.0, 1.0, 0.0],
    ])
    return proj @ cam.world_to_camera


def to_clip(points_world: np.ndarray, mat: np.ndarray) -> np.ndarray:
    """(V, 3) world points -> (1, V, 4) float32 clip-space positions."""
    homo = np.concatenate([points_world, np.ones((len(points_world), 1))], axis=1)
    return (homo @ mat.T).astype(np.float32)[None]


def mesh_surface(clip, tri, vertex_colors, resolution, flip_y):
    """rasterize -> interpolate (vertex colours) -> antialias -> surface_from_mesh; also
    the rasteriser's output and the interpolated colours before antialiasing."""
    rast, _ = dr.rasterize(clip, tri, resolution, grad_db=False)
    flat, _ = dr.interpolate(vertex_colors, rast, tri)
    color = dr.antialias(flat, rast, clip, tri)
    colors, depths = surface_from_mesh(color, rast, clip, tri, flip_y=flip_y)
    return colors, depths, rast, flat, color


def test_surface_from_mesh_gives_camera_depth_in_image_rows():
    # A tilted planar quad over the image's top third: its depth per pixel is the distance
    # along camera z to the plane on the pixel centre's ray, and its pixels must land in
    # the top rows whichever the projection's y direction (flip_y says which).
    h, w = 24, 32
    cam = arc_warp.Camera.look_at((0.3, -0.2, -4.0), (0.0, 0.0, 0.0), (0.0, -1.0, 0.0), 50.0, w, h)
    xy = np.array([[-3.0, -3.0], [3.0, -3.0], [3.0, -0.4], [-3.0, -0.4]])
    plane = np.array([0.3, -0.2, 3.0])  # z = 0.3 x - 0.2 y + 3 in camera space
    cam_pts = np.concatenate([xy, (xy @ plane[:2] + plane[2])[:, None]], axis=1)
    view = cam.world_to_camera
    world = (cam_pts - view[:3, 3]) @ np.linalg.inv(view[:3, :3]).T
    tri = wp.array(np.array([[0, 1, 2], [0, 2, 3]], np.int32), dtype=wp.int32)
    vcol = wp.array(np.eye(4, 3, dtype=np.float32) + 0.1, dtype=wp.float32)
    results = []
    for y_up in (True, False):
        clip = wp.array(to_clip(world, clip_matrix(cam, y_up)), dtype=wp.float32)
        colors, depths, rast, *_ = mesh_surface(clip, tri, vcol, (h, w), flip_y=y_up)
        results.append((colors.numpy()[0], depths.numpy()[0], rast.numpy()[0]))
    (c_up, d_up, rast_up), (c_down, d_down, _) = results
    covered = np.isfinite(d_up)
    np.testing.assert_array_equal(covered, np.isfinite(d_down))
    np.testing.assert_allclose(d_up[covered], d_down[covered], rtol=1e-6)
    np.testing.assert_allclose(c_up, c_down, atol=1e-6)
    assert covered[: h // 4].all() and not covered[h // 2:].any(), "the quad's pixels are the top rows"
    assert (d_up[~covered] == np.inf).all()
    # z = 0.3 x - 0.2 y + 3 on the ray (x, y) = z (rx, ry) of the pixel centre
    v, u = np.meshgrid(np.arange(h) + 0.5, np.arange(w) + 0.5, indexing="ij")
    rx, ry = (u - cam.cx) / cam.fx, (v - cam.cy) / cam.fy
    z = plane[2] / (1.0 - plane[0] * rx - plane[1] * ry)
    # float32 clip positions and barycentrics: ~1e-6 relative; a centre that only the
    # snapped triangle covers gets barycentrics clamped onto the edge (nvdiffrast's), the
    # edge point's depth, a fraction of a pixel away
    bary = rast_up[::-1, :, :2]  # the y-up image's rows run bottom-up
    inside = covered & (bary[..., 0] > 0) & (bary[..., 1] > 0) & (bary.sum(-1) < 1)
    assert inside.sum() > 0.9 * covered.sum()
    np.testing.assert_allclose(d_up[inside], z[inside], rtol=1e-5)
    np.testing.assert_allclose(d_up[covered], z[covered], rtol=1e-3)


def _sphere_scene(rng, width=32, height=24, n=70):
    """Gaussians in front of (camera depth 1.5-2.4) and behind (3.6-5) a vertex-coloured
    sphere whose visible surface lies at depths 2.6-3.05: no occlusion decision is near a
    tie, and small vertex moves change no pixel's Gaussians."""
    scene = random_scene(rng, n=n, width=width, height=height, depth_range=(1.5, 5.0), opacity_range=(0.2, 0.8),
                         size_px_range=(1.0, 5.0))
    view = scene.world_to_camera
    z = (scene.means @ view[:3, :3].T + view[:3, 3])[:, 2]
    keep = (z < 2.4) | (z > 3.6)
    for name in PARAMS:
        setattr(scene, name, getattr(scene, name)[keep])
    pts, _, tri = dr.uv_sphere(rings=6, segments=10)
    cam_pts = 0.45 * pts.astype(np.float64) + np.array([0.15, -0.1, 3.05])
    world = (cam_pts - view[:3, 3]) @ np.linalg.inv(view[:3, :3]).T
    vcol = rng.uniform(0.0, 1.0, size=(len(pts), 3)).astype(np.float32)
    return scene, world, tri, vcol


def _hybrid_loss(scene, inputs, clip, tri, vcol, cot, flip_y=True, tape=None):
    """(loss, rast ids, antialias-blended pixel mask, render) of the chain; recorded on
    ``tape`` if given."""
    settings = arc_warp.RenderSettings(background=BACKGROUND)
    with tape if tape is not None else contextlib.nullcontext():
        colors, depths, rast, flat, color = mesh_surface(clip, tri, vcol, (scene.height, scene.width), flip_y)
        out = arc_warp.render_gaussians(inputs["means"], inputs["quats"], inputs["scales"], inputs["opacities"],
                                        inputs["colors"], camera_of(scene), settings, surface_colors=colors[0],
                                        surface_depths=depths[0])
    loss = float((out.color.numpy().astype(np.float64) * cot).sum())
    blended = np.any(color.numpy() != flat.numpy(), axis=-1)
    return loss, rast.numpy()[..., 3].copy(), blended, out, depths


def test_finite_differences_through_mesh_ops(rng):
    # mesh ops -> surface_from_mesh -> composite -> loss: the tape's gradients w.r.t. the
    # clip-space vertices against central differences
    scene, world, tri_np, vcol_np = _sphere_scene(rng)
    cam = camera_of(scene)
    base = to_clip(world, clip_matrix(cam, y_up=True))
    tri = wp.array(tri_np, dtype=wp.int32)
    vcol = wp.array(vcol_np, dtype=wp.float32, requires_grad=True)
    inputs = warp_inputs(scene, "cpu", requires_grad=True)
    cot = rng.normal(size=(scene.height, scene.width, 3))
    clip = wp.array(base, dtype=wp.float32, requires_grad=True)
    tape = wp.Tape()
    _, ids, _, out, depths = _hybrid_loss(scene, inputs, clip, tri, vcol, cot, tape=tape)
    # the scene exercises both: Gaussians hidden behind the sphere and in front of it
    z = (scene.means @ cam.world_to_camera[:3, :3].T + cam.world_to_camera[:3, 3])[:, 2]
    assert (z < 2.4).any() and (z > 3.6).any()
    d = depths.numpy()[0]
    assert np.isfinite(d).sum() > 60 and ((d[np.isfinite(d)] > 2.55) & (d[np.isfinite(d)] < 3.1)).all()
    tape.backward(grads={out.color: wp.array(cot.astype(np.float32), dtype=wp.vec3)})
    grad = clip.grad.numpy()[0]
    assert np.abs(vcol.grad.numpy()).max() > 0 and np.abs(inputs["opacities"].grad.numpy()).max() > 0

    def loss_at(pos):
        return _hybrid_loss(scene, warp_inputs(scene, "cpu"), wp.array(pos, dtype=wp.float32), tri,
                            wp.array(vcol_np, dtype=wp.float32), cot)[:3]

    # the vertex coordinates with the largest gradients (silhouette vertices among them)
    order = np.argsort(-np.abs(grad[:, :2]).ravel())
    checked = 0
    for flat_index in order[:16]:
        v, k = divmod(int(flat_index), 2)
        fds = []
        for h in (1e-3, 5e-4):  # clip units: 0.004 and 0.002 px at these depths
            plus, minus = base.copy(), base.copy()
            plus[0, v, k] += h
            minus[0, v, k] -= h
            (lp, ids_p, aa_p), (lm, ids_m, aa_m) = loss_at(plus), loss_at(minus)
            step = float(np.float32(base[0, v, k] + h)) - float(np.float32(base[0, v, k] - h))
            fds.append((lp - lm) / step)
            # a pixel centre crossing an edge, or a pixel pair's antialiasing changing, is a
            # jump inside [-h, h]: no derivative to compare there
            events = not (np.array_equal(ids_p, ids_m) and np.array_equal(aa_p, aa_m))
            if events:
                break
        # a kink inside [-h, h] that the masks miss (an edge turning into a silhouette, a
        # blend changing its partner pixel) makes the two steps disagree; a smooth loss
        # keeps them within O(h^2) plus the float32 noise (the loss moves by ~1e-7 between
        # the renders of nearby vertices: ~1e-4 on the quotients)
        if events or abs(fds[0] - fds[1]) > 1e-3 * (1.0 + abs(fds[1])):
            continue
        # observed within ~2e-4 relative; 1e-3 relative plus the quotient's noise
        assert abs(fds[1] - grad[v, k]) <= 1e-3 * abs(grad[v, k]) + 5e-4, (v, k, fds, grad[v, k])
        checked += 1
    assert checked >= 10
