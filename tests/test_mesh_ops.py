"""The mesh op objects (arc_warp.mesh.Rasterizer, Interpolator, TextureSampler,
MipBuilder, Antialiaser) under the functional ops: a workspace makes one per op, size and
options; calls of one size allocate no Warp memory and record no launch after the
first, on new memory each call, and give what calls without a workspace give; triangle
indices out of range raise (issue 37 case 7), read when the notes of arc_warp.mesh say."""

import numpy as np
import pytest
import warp as wp

import arc_warp.mesh as mesh
from arc_warp import Workspace
from arc_warp._src.launches import BINDINGS, Launches, Plan
from mesh_scenes import wa

wp.config.log_level = wp.LOG_WARNING


def sphere(rng, batch=2):
    v, uv, f = mesh.uv_sphere(5, 8)
    pos = []
    for _ in range(batch):
        s = v * 0.6 + rng.uniform(-0.2, 0.2, 3)
        w = 2.0 + s[:, 2]
        pos.append(np.concatenate([s[:, :2] * w[:, None] * 0.8, s[:, 2:3] * 0.3, w[:, None]], 1))
    return np.stack(pos).astype(np.float32), uv.astype(np.float32), f.astype(np.int32)


def arrays(rng, size) -> dict:
    """Inputs, cotangent, outputs and zeroed gradients of a chain at ``size``: new arrays
    (new memory, new values)."""
    h, w = size
    pos, uv, f = sphere(rng)
    b = pos.shape[0]
    tex = rng.uniform(0, 1, (1, 16, 16, 3)).astype(np.float32)
    new = {name: wp.empty(shape, dtype=wp.float32) for name, shape in (
        ("rast", (b, h, w, 4)), ("db", (b, h, w, 4)), ("out", (b, h, w, 2)), ("out_da", (b, h, w, 4)),
        ("mip", mesh.mip_shape(tex.shape)), ("color", (b, h, w, 3)), ("img", (b, h, w, 3)))}
    zeros = {f"g_{name}": wp.zeros(shape, dtype=wp.float32) for name, shape in (
        ("color", (b, h, w, 3)), ("pos", pos.shape), ("tex", tex.shape), ("uv", (b, h, w, 2)), ("da", (b, h, w, 4)),
        ("attr", (1, *uv.shape)), ("rast", (b, h, w, 4)), ("db", (b, h, w, 4)))}
    tri = wa(f, wp.int32)
    return dict(pos=wa(pos), uv=wa(uv[None]), tri=tri, tex=wa(tex), topo=mesh.antialias_construct_topology_hash(tri),
                g=wa(rng.standard_normal((b, h, w, 3)).astype(np.float32)), **new, **zeros)


def chain(a: dict, ws=None) -> list:
    """Forward and backward of rasterize -> interpolate (with derivatives) -> mipmapped
    texture -> antialias into the given arrays; every result as numpy."""
    mode = "linear-mipmap-linear"
    rast, db = mesh.rasterize(a["pos"], a["tri"], a["rast"].shape[1:3], workspace=ws, out=(a["rast"], a["db"]))
    out, out_da = mesh.interpolate(a["uv"], rast, a["tri"], db, "all", workspace=ws, out=(a["out"], a["out_da"]))
    mip = mesh.build_mip(a["tex"], out=a["mip"], workspace=ws)
    color = mesh.texture(a["tex"], out, out_da, mip=mip, filter_mode=mode, workspace=ws, out=a["color"])
    img = mesh.antialias(color, rast, a["pos"], a["tri"], a["topo"], workspace=ws, out=a["img"])
    mesh.antialias_backward(color, rast, a["pos"], a["tri"], a["g"], a["topo"], grad_color=a["g_color"],
                            grad_pos=a["g_pos"], workspace=ws)
    mesh.texture_backward(a["tex"], out, a["g_color"], out_da, mip=mip, filter_mode=mode, grad_tex=a["g_tex"],
                          grad_uv=a["g_uv"], grad_uv_da=a["g_da"], workspace=ws)
    mesh.interpolate_backward(a["uv"], rast, a["tri"], a["g_uv"], db, a["g_da"], "all", grad_attr=a["g_attr"],
                              grad_rast=a["g_rast"], grad_rast_db=a["g_db"], workspace=ws)
    mesh.rasterize_backward(a["pos"], a["tri"], rast, a["g_rast"], a["g_db"], grad_pos=a["g_pos"], workspace=ws)
    return [a[k].numpy() for k in ("rast", "db", "out", "out_da", "mip", "color", "img", "g_color", "g_tex", "g_uv",
                                   "g_da", "g_attr", "g_rast", "g_db", "g_pos")]


@pytest.fixture
def counted(monkeypatch):
    """Lists of the CPU's Warp allocations and of the launches recorded or made by
    ``wp.launch`` (a prepared launch runs without it)."""
    allocator = wp.get_device("cpu").default_allocator
    allocate, launch = allocator.allocate, wp.launch
    seen = {"allocations": [], "launches": []}
    monkeypatch.setattr(allocator, "allocate", lambda size: seen["allocations"].append(size) or allocate(size))
    monkeypatch.setattr(wp, "launch", lambda kernel, *a, **k: seen["launches"].append(kernel.key) or launch(kernel, *a,
                                                                                                          **k))
    return seen


def test_repeated_calls_allocate_nothing_and_reuse_launches(rng, counted):
    """Chains of one size on new arrays: after the first, a chain allocates no Warp memory
    and records no launch (the prepared ones are repacked where pointers moved); each
    gives what the same calls without a workspace give. Another size makes other
    objects; the first size's are there when it comes back."""
    ws = Workspace("cpu")
    held = []  # every chain's arrays stay alive: each call is on new memory (no plan of an earlier one applies)
    # per size a Rasterizer, Interpolator, TextureSampler and Antialiaser; one MipBuilder (one texture size)
    for size, objects in [((20, 24), 5), ((16, 16), 9), ((20, 24), 9)]:
        for i in range(2):
            seed = int(rng.integers(1 << 30))
            a = arrays(np.random.default_rng(seed), size)
            counted["allocations"].clear()
            counted["launches"].clear()
            got = chain(a, ws)
            if i or size == (20, 24) and objects == 9:
                assert counted["allocations"] == [] and counted["launches"] == [], counted
            else:
                assert counted["launches"], "a new object records its launches"
            assert len(ws.objects()) == objects
            want = chain(arrays(np.random.default_rng(seed), size))
            assert (want[0][..., 3] > 0).any() and np.abs(want[-1]).max() > 0
            for k, (x, y) in enumerate(zip(got, want)):
                np.testing.assert_array_equal(x, y, err_msg=f"size {size} call {i} result {k}")
            held.append(a)


def test_objects_own_their_sizes(rng):
    """An object is made for its sizes: other sizes raise (make another), and the
    functional ops' workspace lookup keys by them."""
    pos, _, f = sphere(rng)
    op = mesh.Rasterizer((8, 8), 2, len(f), device="cpu")
    rast, _ = op.forward(wa(pos), wa(f, wp.int32))
    assert rast.shape == (2, 8, 8, 4)
    with pytest.raises(ValueError, match=f"Rasterizer: made for 2 images of {len(f)} triangles, got 1 of {len(f)}"):
        op.forward(wa(pos[:1]), wa(f, wp.int32))
    with pytest.raises(ValueError, match=r"out\[0\] \(rast\) must have shape \(2, 8, 8, 4\)"):
        op.forward(wa(pos), wa(f, wp.int32), out=(wp.empty((2, 8, 9, 4)), wp.empty((2, 8, 8, 4))))
    with pytest.raises(ValueError, match="Interpolator: made for 2 attributes, attr has 3"):
        mesh.Interpolator(2, 8, 8, 2, device="cpu").forward(wa(np.zeros((5, 3), np.float32)), rast, wa(f, wp.int32))
    with pytest.raises(ValueError, match="filter_mode 'auto' depends on the call"):
        mesh.TextureSampler(2, 8, 8, (1, 4, 4, 3), "auto", device="cpu")
    ws = Workspace("cpu")
    for reduce in ("arc", "atomic", "arc"):
        mesh.rasterize(wa(pos), wa(f, wp.int32), (8, 8), reduce=reduce, workspace=ws)
    assert len(ws.objects()) == 2
    with pytest.raises(TypeError, match="workspace: expected an arc_warp.Workspace"):
        mesh.rasterize(wa(pos), wa(f, wp.int32), (8, 8), workspace="cpu")


def test_bad_input_after_reuse_still_raises(rng):
    ws = Workspace("cpu")
    pos, _, f = sphere(rng)
    out = (wp.empty((2, 8, 8, 4), dtype=wp.float32), wp.empty((2, 8, 8, 4), dtype=wp.float32))
    for _ in range(3):
        mesh.rasterize(wa(pos), wa(f, wp.int32), (8, 8), workspace=ws, out=out)
    with pytest.raises(TypeError, match="tri must have dtype int32"):
        mesh.rasterize(wa(pos), wa(f.astype(np.float32)), (8, 8), workspace=ws, out=out)
    with pytest.raises(ValueError, match=r"out\[0\] \(rast\) must have shape"):
        mesh.rasterize(wa(pos), wa(f, wp.int32), (8, 8), workspace=ws, out=(out[0][:1], out[1]))


@pytest.mark.parametrize("keyed", [7, 33])
def test_mesh_backwards_use_the_keyed_threshold(rng, monkeypatch, keyed):
    """The mesh backwards read the workspace's keyed threshold (not the splat renderer's);
    at 33 (never reduce) `arc` is compiled as `atomic`, with atomic's results."""
    from arc_warp._src.mesh import antialias_ops, interp_ops, raster_ops, texture_ops

    compiled = []
    for module, name in ((texture_ops, "make_tex_bwd"), (interp_ops, "make_interp_bwd"),
                         (raster_ops, "make_raster_bwd"), (antialias_ops, "make_aa_bwd")):
        make = getattr(module, name)
        monkeypatch.setattr(module, name, lambda mode, *a, _make=make: compiled.append(mode) or _make(mode, *a))
    ws = Workspace("cpu")
    ws.threshold, ws.keyed_threshold = 31, keyed  # 31: no other argument of these launches
    seed = int(rng.integers(1 << 30))
    launches = []
    launch = Launches.launch
    monkeypatch.setattr(Launches, "launch", lambda self, kernel, dim, args, *a, **k:
                        launches.append(args) or launch(self, kernel, dim, args, *a, **k))
    got = chain(arrays(np.random.default_rng(seed), (12, 16)), ws)
    assert compiled and set(compiled) == {"arc" if keyed < 33 else "atomic"}
    assert any(keyed in args for args in launches), "the keyed T is a kernel argument"
    assert not any(31 in args for args in launches), "the splat renderer's T reached a mesh kernel"
    want = chain(arrays(np.random.default_rng(seed), (12, 16)), Workspace("cpu", threshold=keyed))
    for k, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6, err_msg=f"result {k}")


def bad_scene(rng):
    """A sphere [1, V, 4] (64 triangles) and its tri with two more: indices past V, below 0."""
    pos, uv, f = sphere(rng, batch=1)
    v = pos.shape[1]
    return pos, uv, f, np.concatenate([f, [[0, 1, v + 3], [-1, 2, 3]]]).astype(np.int32)


def test_out_of_range_triangles_raise(rng):
    """Issue 37 case 7: rasterize, interpolate and antialias raise ValueError naming the
    first triangle with an index outside [0, V) of pos (of attr for interpolate), found
    on the device; the kernels leave such triangles out, as before; the backwards take
    the forward's inputs and do not check."""
    pos, uv, f, bad = bad_scene(rng)
    v, size = pos.shape[1], (24, 24)
    rast, db = mesh.rasterize(wa(pos), wa(f, wp.int32), size)
    with pytest.raises(ValueError, match=rf"rasterize: triangle 64 of tri has a vertex index outside \[0, {v}\) "
                                         rf"\(pos has {v} vertices\)"):
        mesh.rasterize(wa(pos), wa(bad, wp.int32), size)
    first = np.nonzero((f >= 10).any(1))[0][0]
    with pytest.raises(ValueError, match=rf"interpolate: triangle {first} of tri .* outside \[0, 10\) \(attr has 10"):
        mesh.interpolate(wa(uv[:10]), rast, wa(f, wp.int32))
    with pytest.raises(ValueError, match="antialias: triangle 64 of tri"):
        mesh.antialias(wa(np.zeros((1, *size, 3), np.float32)), rast, wa(pos), wa(bad, wp.int32))
    # the kernels: such triangles are not drawn (rasterize), interpolate to 0
    rast_bad, _ = mesh.Rasterizer(size, 1, len(bad), device="cpu").forward(wa(pos), wa(bad, wp.int32), check=False)
    np.testing.assert_array_equal(rast_bad.numpy(), rast.numpy())
    out, _ = mesh.Interpolator(1, *size, 2, device="cpu").forward(wa(uv[:10]), rast, wa(f, wp.int32), check=False)
    ids = rast.numpy()[0, ..., 3].astype(int) - 1
    uses = np.isin(ids, np.nonzero((f >= 10).any(1))[0])
    assert uses.any() and (~uses & (ids >= 0)).any()
    assert not out.numpy()[0][uses].any() and out.numpy()[0][~uses & (ids >= 0)].any()
    mesh.rasterize_backward(wa(pos), wa(bad, wp.int32), rast, wa(np.ones((1, *size, 4), np.float32)))


def test_a_check_left_on_the_device_raises_later(rng):
    """With ``check=False`` (the default on CUDA) the forward returns without reading
    its check; the object's next forward raises for it, naming the previous call, before
    queuing anything, or ``check()`` does; each check is read once."""
    pos, _, f, bad = bad_scene(rng)
    op = mesh.Rasterizer((16, 16), 1, len(bad), device="cpu")
    good = bad.copy()
    good[-2:] = f[:2]
    op.forward(wa(pos), wa(bad, wp.int32), check=False)
    with pytest.raises(ValueError, match=r"triangle 64 of tri .* \(found in the previous call on this object"):
        op.forward(wa(pos), wa(good, wp.int32))
    op.forward(wa(pos), wa(good, wp.int32), check=False)
    op.check()  # the good call's: nothing to say
    op.forward(wa(pos), wa(bad, wp.int32), check=False)
    with pytest.raises(ValueError, match="triangle 64 of tri"):
        op.check()
    op.check()  # read once
    with pytest.raises(ValueError, match="triangle 64 of tri"):
        op.forward(wa(pos), wa(bad, wp.int32))  # None on the CPU: read before returning


def test_alternating_buffers_replay_their_plans(rng, monkeypatch):
    """Outputs that alternate between two buffers (a loop whose previous results are
    still held): each buffer's second call records a plan, and from then on the calls
    replay them, packing no argument and recording no launch, with the same results."""
    pos, _, f = sphere(rng)
    op = mesh.Rasterizer((8, 8), 2, len(f), device="cpu")
    outs = [(wp.empty((2, 8, 8, 4)), wp.empty((2, 8, 8, 4))) for _ in range(2)]
    p, t = wa(pos), wa(f, wp.int32)
    want = mesh.rasterize(p, t, (8, 8))[0].numpy()
    for out in outs * 2:
        op.forward(p, t, out=out)
    packed, launched = [], []
    for cmd, *_ in op._launches._sites.values():
        monkeypatch.setattr(cmd, "set_param_at_index", lambda i, value, _set=cmd.set_param_at_index:
                            packed.append(i) or _set(i, value))
    launch = wp.launch
    monkeypatch.setattr(wp, "launch", lambda *a, **k: launched.append(a) or launch(*a, **k))
    for out in outs * 2:
        out[0].zero_()
        np.testing.assert_array_equal(op.forward(p, t, out=out)[0].numpy(), want)
    assert packed == [] and launched == []
    assert sum(isinstance(b, Plan) for b in op._bindings.values()) == 2


def test_plans_replay_on_the_memory_they_were_bound_to(rng):
    """An op object's bindings replay a call's recorded launches only on the memory it was
    recorded on. Chains on one set of arrays alternate with chains where one array, each
    in turn, is at other memory (an input with other values, or an output), so that each
    memory's first call launches, its second records and the later ones replay, right
    after a call on other memory: each gives what a fresh chain without a workspace
    gives (every output starts as 7s, so a read or write of the other memory shows), also after new
    values are written into the inputs' memory; and the bindings stay bounded."""
    ws = Workspace("cpu")
    size = (12, 16)
    inputs = ("pos", "uv", "tri", "tex", "g")

    def arrays_of(seed) -> dict:  # arrays() with the triangles permuted and the uvs moved
        r = np.random.default_rng(seed)
        a = arrays(r, size)
        a["tri"] = wa(a["tri"].numpy()[r.permutation(a["tri"].shape[0])], wp.int32)
        a["uv"] = wa(a["uv"].numpy() + r.normal(0, 0.1, a["uv"].shape).astype(np.float32))
        return dict(a, topo=mesh.antialias_construct_topology_hash(a["tri"]))

    def fresh(a) -> list:  # the chain of a's input values on new arrays, without a workspace
        return chain({**arrays(np.random.default_rng(0), size), "topo": a["topo"],
                      **{k: wa(a[k].numpy(), a[k].dtype) for k in inputs}})

    def check(a, want, what):
        for x in (d[k] for d in (base, other) for k in d if k not in (*inputs, "topo")):
            x.fill_(7.0)  # every output and gradient of both sets: a read or write of the other memory shows
        for name, x in a.items():
            if name.startswith("g_"):
                x.zero_()  # the backwards add into the gradients
        for k, (x, y) in enumerate(zip(chain(a, ws), want)):
            np.testing.assert_array_equal(x, y, err_msg=f"{what}: result {k}")

    base, other = arrays_of(1), arrays_of(2)
    want = fresh(base)
    for swapped in [("pos",), ("uv",), ("tex",), ("g",), ("tri", "topo")] + [
            (k,) for k in base if k not in (*inputs, "topo")]:
        a = {**base, **{k: other[k] for k in swapped}}
        want_a = fresh(a) if swapped[0] in inputs else want
        for call in range(3):
            check(base, want, f"base after {swapped}")
            check(a, want_a, f"{swapped} at other memory, call {call}")
    for k in ("pos", "uv", "tex", "g"):  # new values in the same memory
        wp.copy(base[k], arrays_of(3)[k])
    want = fresh(base)
    for call in range(2):
        check(base, want, f"new values, call {call}")
    assert all(any(isinstance(b, Plan) for b in op._bindings.values()) for op in ws.objects())

    pos, _, f = sphere(rng)
    op = mesh.Rasterizer((4, 4), 2, len(f), device="cpu")
    outs = [(wp.empty((2, 4, 4, 4)), wp.empty((2, 4, 4, 4))) for _ in range(BINDINGS + 8)]  # held: new memory
    for out in outs:
        op.forward(wa(pos), wa(f, wp.int32), out=out)
    assert len(op._bindings) == BINDINGS
