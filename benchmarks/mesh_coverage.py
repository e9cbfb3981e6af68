"""Mesh coverage against nvdiffrast's CUDA rasterizer: which triangle each pixel gets, and u, v, z/w bit for bit.

``arc_warp.mesh.rasterize`` follows nvdiffrast 0.4's CUDA rasterizer (frustum clipping,
1/16-pixel snapping, its fill rule and fixed-point depth test, viewport tiles above 2048
pixels). This renders scenes that stress those rules through both libraries on the same
tensors and records, per scene, the pixels whose triangle ids differ and the fraction of
covered pixels whose u, v, z/w and ``rast_db`` are bitwise equal (with the largest
difference where not):

- ``grid 1M``, ``grid 200k``: screen-filling grids (the mesh benchmark's), every edge shared;
- ``soup clipped z``, ``soup w<0``: random triangles crossing the near/far planes and the
  w = 0 plane (clipped into fans of sub-triangles);
- ``small tris``, ``small odd size``: many tiny triangles, also at 37x53;
- ``wide`` (2100x4100), ``soup wide``: more than one viewport tile;
- ``duplicates``: every triangle twice (the depth test's ties).

A correctness check rather than a timing: run it after touching the mesh rasterizer. It
needs nvdiffrast (and so CUDA); without it (``--smoke``: tiny sizes on the CPU) only our
coverage is counted.
"""

from __future__ import annotations

from benchmarks import peers, results
from benchmarks.mesh import grid_mesh


def add_arguments(parser) -> None:
    pass


def soup(n: int, z_span: float, w_low: float, seed: int, device):
    """``n`` random triangles: clip-space xy in [-1.5, 1.5] w, z in [-z_span, z_span] w,
    w in [w_low, 2]: pos [1, 3n, 4], tri [n, 3]."""
    import torch

    g = torch.Generator().manual_seed(seed)
    w = w_low + (2.0 - w_low) * torch.rand(3 * n, 1, generator=g)
    xy = (3.0 * torch.rand(3 * n, 2, generator=g) - 1.5) * w
    z = (2.0 * torch.rand(3 * n, 1, generator=g) - 1.0) * z_span * w
    pos = torch.cat([xy, z, w], 1)[None].to(device).contiguous()
    return pos, torch.arange(3 * n, dtype=torch.int32, device=device).reshape(n, 3)


def small_tris(n: int, seed: int, device):
    """``n`` triangles of a few pixels' size at random depths: pos [1, 3n, 4], tri [n, 3]."""
    import torch

    g = torch.Generator().manual_seed(seed)
    centre = 2.0 * torch.rand(n, 1, 2, generator=g) - 1.0
    corners = centre + 0.02 * (torch.rand(n, 3, 2, generator=g) - 0.5)
    z = torch.rand(n, 1, 1, generator=g).expand(n, 3, 1)
    pos = torch.cat([corners, z, torch.ones(n, 3, 1)], 2).reshape(1, 3 * n, 4).to(device).contiguous()
    return pos, torch.arange(3 * n, dtype=torch.int32, device=device).reshape(n, 3)


def scenes(device, smoke: bool):
    """(name, pos, tri, (height, width)) of every scene."""
    import torch

    s = 8 if smoke else 1
    grid_big, grid_small = grid_mesh(1_000_000 // s ** 2, device), grid_mesh(200_000 // s ** 2, device)
    wide_h, wide_w = (2100, 4100) if not smoke else (40, 70)
    pos_d, tri_d = small_tris(150_000 // s ** 2, 5, device)
    return [
        ("grid 1M", *grid_big, (2048 // s, 2048 // s)),
        ("grid 200k", *grid_small, (1000 // s, 1200 // s)),
        ("soup clipped z", *soup(3000 // s, 1.5, 0.3, 1, device), (384 // s, 512 // s)),
        ("soup w<0", *soup(2000 // s, 0.8, -1.0, 2, device), (256 // s, 320 // s)),
        ("small tris", *small_tris(200_000 // s ** 2, 3, device), (1024 // s, 1024 // s)),
        ("small odd size", *small_tris(20_000 // s ** 2, 4, device), (37, 53)),
        ("wide", *small_tris(100_000 // s ** 2, 6, device), (wide_h, wide_w)),
        ("soup wide", *soup(400, 0.5, 0.5, 7, device), (2500 // s, 2600 // s)),
        ("duplicates", pos_d, torch.cat([tri_d, tri_d]), (512 // s, 512 // s)),
    ]


def compare(name, pos, tri, size, nvdr) -> dict:
    """One scene's row: our coverage, and with ``nvdr`` its agreement with nvdiffrast."""
    import torch

    import arc_warp_torch.mesh as ours

    rast, db = ours.rasterize(ours.RasterizeCudaContext(), pos, tri, size, grad_db=True)
    row = {"scene": name, "size": f"{size[1]}x{size[0]}", "triangles": int(tri.shape[0]),
           "covered": float((rast[..., 3] > 0).float().mean())}
    if nvdr is None:
        return row
    ref, ref_db = nvdr.rasterize(nvdr.RasterizeCudaContext(), pos, tri, size, grad_db=True)
    same = (ref[..., 3] > 0) & (rast[..., 3] == ref[..., 3])
    row["id_mismatches"] = int((rast[..., 3] != ref[..., 3]).sum())
    for label, a, b in (("u", rast[..., 0], ref[..., 0]), ("v", rast[..., 1], ref[..., 1]),
                        ("z", rast[..., 2], ref[..., 2]), ("db", db, ref_db)):
        a, b = a[same], b[same]
        equal = (a.view(torch.int32) == b.view(torch.int32)).float()
        row[f"{label}_bitwise"] = float(equal.mean()) if a.numel() else 1.0
        row[f"{label}_max_diff"] = float((a - b).abs().max()) if a.numel() else 0.0
    return row


def run(args) -> dict:
    import torch

    nvdr, note = peers.optional("nvdiffrast.torch")
    cuda = not args.smoke and torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if not cuda and nvdr is not None and not args.smoke:
        raise SystemExit("mesh_coverage compares with nvdiffrast's CUDA rasterizer: it needs a CUDA device")
    rows = []
    for name, pos, tri, size in scenes(device, args.smoke):
        rows.append(compare(name, pos, tri, size, nvdr))
        print(f"# {name}: {rows[-1]}", flush=True)
    return {"device": torch.cuda.get_device_name() if cuda else "cpu", "notes": [note], "rows": rows}


def table(result: dict) -> str:
    num = results.num
    out = [[r["scene"], r["size"], str(r["triangles"]), num(r["covered"]), num(r.get("id_mismatches"))]
           + [f"{r[f'{k}_bitwise']:.4f} ({r[f'{k}_max_diff']:.1e})" if f"{k}_bitwise" in r else "-"
              for k in ("u", "v", "z", "db")] for r in result["rows"]]
    return results.markdown(["scene", "size", "triangles", "covered", "id mismatches", "u bitwise (max diff)",
                             "v bitwise (max diff)", "z/w bitwise (max diff)", "rast_db bitwise (max diff)"], out)
