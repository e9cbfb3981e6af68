"""Mesh ops forward/backward benchmark against nvdiffrast (needs a CUDA GPU).

Workloads (issue 14), each through the torch drop-in so that nvdiffrast.torch runs on
the very same tensors:

* ``tex_mag`` / ``tex_min``: texture, 2048^2 output, 1024^2 RGBA texture,
  linear-mipmap-linear, magnified 4x (4 pixels per texel) / minified 4.5x;
* ``interp``: interpolate, a 1M-triangle screen-filling grid at 2048^2, 8 attributes;
* ``raster``: rasterize, the same 1M triangles at 2048^2 (backward into positions);
* ``chain``: a 100k-triangle sphere at 1024^2: rasterize, interpolate with
  derivatives, texture (2048^2, mipmapped), antialias, forward and backward.

Timed with CUDA events after warm-up, medians, each variant's calls back to back in
three rounds whose variant order rotates; backward modes atomic / warp / arc (and
``floor``: the backward without gradient accumulation), nvdiffrast 0.4 when ``import
nvdiffrast.torch`` works. Each call is timed twice: as a user's call on an idle device
(its host work included), and as device time (queued behind a spin kernel, timed from
the spin's end: the host work is hidden, as in a loop that queues ahead;
``bench_train_step.behind_spin``). Agreement with nvdiffrast: max |image difference|
and gradient cosine similarity; for ``raster`` and ``chain`` also the cosine with the
upstream gradient zero where our rasterize clamps u, v (``clamp_mask``: nvdiffrast's
backward ignores that clamp, ours differentiates it). ``--smoke`` runs tiny sizes on the
CPU (host timing) to check the script itself.

Usage::

    python benchmarks/bench_mesh.py [--only tex_mag chain] [--reps 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import torch

import arc_warp.mesh as core
import arc_warp_torch.mesh as ours
from bench_train_step import behind_spin, event_ms

MODES = ("atomic", "warp", "arc", "floor")

try:
    import nvdiffrast.torch as nvdr
except ImportError:  # peers are optional
    nvdr = None


def timed_all(fns: dict, reps: int, hidden: bool = False, rounds: int = 3) -> dict:
    """Median milliseconds of each ``fns[key]()`` over ``reps`` calls, made in ``rounds``
    rounds: in each round every variant runs one untimed call and then its share of the
    timed calls back to back (as a user's loop calls one mode), the variants' order
    rotated from round to round (drift falls on all alike). CUDA events around the call
    on the current stream, the device idle before it; ``hidden`` (CUDA only): the call is
    queued behind a spin kernel and timed from the spin's end
    (``bench_train_step.behind_spin``), i.e. its device time with its host work done
    while the device was busy (as in a loop that queues ahead). On the CPU the host
    clock."""
    keys = list(fns)
    cuda = DEVICE.type == "cuda"
    rounds = max(1, min(rounds, reps))
    times = {k: [] for k in keys}
    for rnd in range(rounds):
        for k in keys[rnd % len(keys):] + keys[:rnd % len(keys)]:
            fns[k]()
            for _ in range(reps // rounds + (rnd < reps % rounds)):
                if hidden:
                    times[k].append(behind_spin(fns[k])[0])
                elif cuda:
                    torch.cuda.synchronize()
                    times[k].append(event_ms(fns[k])[0])
                else:
                    t0 = time.perf_counter()
                    fns[k]()
                    times[k].append((time.perf_counter() - t0) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.reshape(-1).double(), b.reshape(-1).double()
    return float(a @ b / (a.norm() * b.norm() + 1e-30))


def clamp_mask(rast: torch.Tensor, spread: bool = False):
    """(mask, covered) [B, H, W] bool of our ``rast``: ``mask`` is where rasterize's clamp of
    (u, v) to the triangle acts (``raster_kernels.clamped_uv``: snapped coverage put the
    pixel centre outside the exact triangle), so its backward differs from nvdiffrast's.
    The clamp leaves (u, v) on the triangle's border: u = 0 or v = 0 where it clamps one at
    0, u + v = 1 to float32 rounding (a few 1e-7) where it rescales them; a border 1e-6 wide
    takes both, and the rare unclamped centres that close to an edge (the same derivative
    in both libraries: leaving them out changes nothing). ``spread``: also the pixels'
    4-neighbours, whose upstream gradient antialias passes to a pixel's colour."""
    u, v = rast[..., 0].double(), rast[..., 1].double()
    covered = rast[..., 3] > 0
    mask = covered & ((u <= 1e-6) | (v <= 1e-6) | (u + v >= 1 - 1e-6))
    if spread:
        p = torch.nn.functional.pad(mask, (1, 1, 1, 1))
        mask = mask | p[:, :-2, 1:-1] | p[:, 2:, 1:-1] | p[:, 1:-1, :-2] | p[:, 1:-1, 2:]
    return mask, covered


def grid_mesh(n_tri: int, device):
    """A screen-filling, gently perspective grid of about ``n_tri`` triangles: pos [1, V, 4], tri [F, 3]."""
    n = max(2, int(math.sqrt(n_tri / 2)))
    xs = torch.linspace(-1.05, 1.05, n + 1, device=device)
    y, x = torch.meshgrid(xs, xs, indexing="ij")
    w = 1.0 + 0.2 * (x + 1.05)
    pos = torch.stack([x * w, y * w, 0.3 * w * torch.sin(3 * x) * torch.cos(2 * y), w], -1).reshape(1, -1, 4)
    idx = torch.arange((n + 1) * (n + 1), device=device, dtype=torch.int32).reshape(n + 1, n + 1)
    a, b, c, d = idx[:-1, :-1], idx[:-1, 1:], idx[1:, 1:], idx[1:, :-1]
    tri = torch.cat([torch.stack([a, b, c], -1).reshape(-1, 3), torch.stack([a, c, d], -1).reshape(-1, 3)])
    return pos.contiguous(), tri.contiguous()


def sphere(n_tri: int, device):
    rings = max(3, int(math.sqrt(n_tri / 4)))
    v, uv, f = core.uv_sphere(rings, 2 * rings)
    v = torch.from_numpy(v).to(device)
    w = 2.6 + v[:, 2:3]
    pos = torch.cat([v[:, :2] * 2.2, 0.5 * v[:, 2:3], w], 1)[None].contiguous()
    return pos, torch.from_numpy(f).to(device), torch.from_numpy(uv).to(device)


def run_pair(name, make, inputs, reps, results, mask=None):
    """Times forward and backward of ``make(lib, reduce)`` (returns the output) for each mode
    and nvdiffrast, interleaved, as a user's call (host included, the device idle before
    it) and as device time (host hidden); checks agreement. ``inputs``: tensors whose
    gradients are compared. ``mask``: None, or returns ``(mask, covered)`` [B, H, W] bool
    (``clamp_mask``): the gradients are also compared with the upstream gradient zeroed at
    ``mask`` (``grad_cosine_unclamped``)."""
    row, fwds, bwds = {}, {}, {}
    g = None
    ref = {}
    libs = [("ours", m) for m in MODES] + ([("nvdiffrast", None)] if nvdr is not None else [])
    for lib, mode in libs:
        key = lib if mode is None else f"{lib}_{mode}"
        fwds[key] = fwd = lambda module=(ours if lib == "ours" else nvdr), mode=mode: make(module, mode)  # noqa: E731
        out = fwd()
        if g is None:
            g = torch.randn_like(out)
            upstream = {"grad_cosine": g}
            if mask is not None:
                with torch.no_grad():
                    m, covered = mask()
                upstream["grad_cosine_unclamped"] = g * ~m[..., None]
                masked = float(m.sum() / covered.sum().clamp(min=1))
                print(f"{name:9s} unclamped cosine: upstream gradient zero at {masked:.2%} of the covered pixels")
        grads = {k: torch.autograd.grad(out, inputs, gk, retain_graph=True, allow_unused=True)
                 for k, gk in upstream.items()}
        bwds[key] = lambda out=out: torch.autograd.grad(  # noqa: E731
            out, inputs, g, retain_graph=True, allow_unused=True)
        row[key] = {}
        if mode == "arc":
            ref = {"out": out.detach(), "grads": grads}
            if mask is not None:
                row[key]["unclamped_masked_fraction"] = masked
        if lib == "nvdiffrast" and ref:
            row[key]["max_abs_image_diff"] = float((out.detach() - ref["out"]).abs().max())
            for k in grads:
                row[key][k] = [cosine(a, b) for a, b in zip(ref["grads"][k], grads[k])
                               if a is not None and b is not None]
    with torch.no_grad():
        t_fwd = timed_all(fwds, reps)
        t_fwd_dev = timed_all(fwds, reps, hidden=True) if DEVICE.type == "cuda" else {}
    t_bwd = timed_all(bwds, reps)
    t_bwd_dev = timed_all(bwds, reps, hidden=True) if DEVICE.type == "cuda" else {}
    for key in row:
        row[key].update(forward_ms=t_fwd[key], backward_ms=t_bwd[key], forward_device_ms=t_fwd_dev.get(key),
                        backward_device_ms=t_bwd_dev.get(key))
        dev = (f"  device fwd {t_fwd_dev[key]:8.3f} ms  bwd {t_bwd_dev[key]:8.3f} ms" if t_fwd_dev else "")
        cos = "  ".join(f"{k.removeprefix('grad_')} {row[key][k]}" for k in upstream if k in row[key])
        print(f"{name:9s} {key:18s} fwd {t_fwd[key]:8.3f} ms  bwd {t_bwd[key]:8.3f} ms{dev}  {cos}", flush=True)
    results[name] = row


def bench_texture(name, minify, size, tex_size, reps, results):
    scale = (minify if minify else 0.25) * size / tex_size  # uv span of the image, in texture widths
    y, x = torch.meshgrid(torch.arange(size, device=DEVICE), torch.arange(size, device=DEVICE), indexing="ij")
    angle = 0.3  # rotated, so neighbouring pixels do not share texel rows exactly
    u = ((x + 0.5) * math.cos(angle) - (y + 0.5) * math.sin(angle)) / size * scale
    v = ((x + 0.5) * math.sin(angle) + (y + 0.5) * math.cos(angle)) / size * scale
    uv = torch.stack([u, v], -1)[None].float().contiguous().requires_grad_(True)
    d = scale / size
    uv_da = torch.tensor([d * math.cos(angle), -d * math.sin(angle), d * math.sin(angle), d * math.cos(angle)],
                         device=DEVICE).expand(1, size, size, 4).contiguous().requires_grad_(True)
    tex = torch.rand(1, tex_size, tex_size, 4, device=DEVICE).requires_grad_(True)
    make = lambda lib, mode: lib.texture(tex, uv, uv_da, filter_mode="linear-mipmap-linear",  # noqa: E731
                                         **({"reduce": mode} if mode else {}))
    run_pair(name, make, (tex, uv, uv_da), reps, results)


def bench_interp_raster(size, n_tri, reps, results, which):
    pos, tri = grid_mesh(n_tri, DEVICE)
    pos.requires_grad_(True)
    ctx = ours.RasterizeCudaContext()
    nctx = nvdr.RasterizeCudaContext() if nvdr is not None and DEVICE.type == "cuda" else None
    if "raster" in which:
        def make_r(lib, mode):
            kw = {"reduce": mode} if mode else {}
            rast, _ = lib.rasterize(ctx if lib is ours else nctx, pos, tri, (size, size), grad_db=False, **kw)
            return rast
        run_pair("raster", make_r, (pos,), reps, results, mask=lambda: clamp_mask(make_r(ours, None)))
    if "interp" in which:
        with torch.no_grad():
            rast, _ = ours.rasterize(ctx, pos, tri, (size, size))
        rast.requires_grad_(True)
        attr = torch.rand(1, pos.shape[1], 8, device=DEVICE).requires_grad_(True)
        make_i = lambda lib, mode: lib.interpolate(attr, rast, tri, **({"reduce": mode} if mode else {}))[0]  # noqa
        run_pair("interp", make_i, (attr, rast), reps, results)


def chain(lib, ctx, topo, pos, tri, uv, tex, size: int, mode: str | None):
    """The fit demo's four ops through ``lib`` (ours or nvdiffrast.torch): rasterize at
    ``size``², interpolate ``uv`` with derivatives, mipmapped ``tex``, antialias; ``mode``
    None: the library's default reduction (nvdiffrast has no ``reduce=``)."""
    kw = {"reduce": mode} if mode else {}
    rast, db = lib.rasterize(ctx, pos, tri, (size, size), **kw)
    texc, texd = lib.interpolate(uv[None], rast, tri, rast_db=db, diff_attrs="all", **kw)
    color = lib.texture(tex, texc, texd, filter_mode="linear-mipmap-linear", **kw)
    return lib.antialias(color, rast, pos, tri, topology_hash=topo, **kw)


def bench_chain(size, n_tri, tex_size, reps, results):
    pos, tri, uv = sphere(n_tri, DEVICE)
    pos.requires_grad_(True)
    tex = torch.rand(1, tex_size, tex_size, 3, device=DEVICE).requires_grad_(True)
    topo = {"ours": ours.antialias_construct_topology_hash(tri)}
    if nvdr is not None:
        topo["nvdiffrast"] = nvdr.antialias_construct_topology_hash(tri)
    ctxs = {"ours": ours.RasterizeCudaContext(),
            "nvdiffrast": nvdr.RasterizeCudaContext() if nvdr is not None and DEVICE.type == "cuda" else None}

    def make(lib, mode):
        key = "ours" if lib is ours else "nvdiffrast"
        return chain(lib, ctxs[key], topo[key], pos, tri, uv, tex, size, mode)

    # spread: antialias passes the gradient of a pixel's 4-neighbours to its colour where a
    # silhouette edge runs between them. On this sphere none of the clamp's pixels is at one
    # (checked on the CPU: the pixel-only mask leaves them no colour gradient either); the
    # spread makes that hold for any scene, at 4-5x the masked pixels.
    run_pair("chain", make, (pos, tex), reps, results,
             mask=lambda: clamp_mask(ours.rasterize(ctxs["ours"], pos, tri, (size, size))[0], spread=True))


def main(argv=None):
    global DEVICE
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", default=["tex_mag", "tex_min", "interp", "raster", "chain"])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU: checks the script, times nothing")
    args = ap.parse_args(argv)
    if args.smoke:
        DEVICE = torch.device("cpu")
        out, tex, tris, chain_out, chain_tex, reps = 64, 32, 2000, 48, 64, 1
    else:
        if not torch.cuda.is_available():
            sys.exit("bench_mesh.py needs a CUDA GPU (or --smoke)")
        DEVICE = torch.device("cuda")
        out, tex, tris, chain_out, chain_tex, reps = 2048, 1024, 1_000_000, 1024, 2048, args.reps
    print(f"device {DEVICE}, nvdiffrast {'found' if nvdr is not None else 'not importable: peers skipped'}")
    results = {}
    if "tex_mag" in args.only:
        bench_texture("tex_mag", 0, out, tex, reps, results)
    if "tex_min" in args.only:
        bench_texture("tex_min", 4.5, out, tex, reps, results)
    which = [w for w in ("interp", "raster") if w in args.only]
    if which:
        bench_interp_raster(out, tris, reps, results, which)
    if "chain" in args.only:
        bench_chain(chain_out, 100_000 if not args.smoke else 500, chain_tex, reps, results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


DEVICE = torch.device("cpu")

if __name__ == "__main__":
    main()
