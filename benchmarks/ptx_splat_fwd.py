"""Static cost of the splat forward's kernels on sm_90, without a GPU (``--bwd``: the raster backward's too).

Builds each kernel with Warp's NVRTC (``wp.compile_aot_module``) and prints the counts of
``ptx_mesh.py`` (PTX instructions, global loads, local memory, ``ptxas -v`` registers
and spills, static shared memory) plus what the rasteriser's inner loop spends: shared
loads (``ld.shared``), exponentials (``ex2``) and warp votes (``vote``). ``--bwd`` adds
the raster backward in each reduce mode (without absgrad).

Usage::

    python benchmarks/ptx_splat_fwd.py [--bwd] [--keep DIR]
"""

from __future__ import annotations

import argparse
import pathlib
import re
import shutil
import tempfile

import warp as wp

from arc_warp._src.splat import bin_kernels
from arc_warp._src.splat.project_kernels import make_project_fwd
from arc_warp._src.splat.raster_kernels import make_raster_bwd, make_raster_fwd
from arc_warp._src.splat.sh_kernels import make_sh_fwd
from ptx_mesh import ptx_counts, ptxas_info


def kernels(bwd: bool = False) -> dict:
    """name -> kernel of the forward, in pipeline order (SH at degree 3, 16 coefficient
    rows; the rasteriser also with a surface), then with ``bwd`` the raster backward per
    reduce mode (and ``arc`` with a surface)."""
    out = {
        "project_fwd": make_project_fwd(False),
        "sh_fwd deg3": make_sh_fwd(16, 16),
        "bin_kernels (whole module)": bin_kernels.write_keys,
        "raster_fwd": make_raster_fwd(False),
        "raster_fwd surface": make_raster_fwd(True),
    }
    if bwd:
        for mode in ("arc", "atomic", "deterministic"):
            out[f"raster_bwd {mode}"] = make_raster_bwd(mode, False)
        out["raster_bwd arc surface"] = make_raster_bwd("arc", False, surface=True)
    return out


def inner_counts(ptx: str) -> dict:
    """Shared loads, exponentials and warp votes of the kernel's PTX (its ``.entry`` alone)."""
    entries = re.split(r"^\.(?:visible\s+)?\.entry\s+", ptx, flags=re.M)
    body = entries[-1] if len(entries) > 1 else ptx
    return {
        "ld.shared": len(re.findall(r"\bld\.shared", body)),
        "ex2": len(re.findall(r"\bex2\.", body)),
        "vote": len(re.findall(r"\bvote\.", body)),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bwd", action="store_true", help="also the raster backward (arc, atomic, deterministic)")
    ap.add_argument("--keep", default=None, help="directory that keeps the generated .cu and .ptx files")
    args = ap.parse_args(argv)
    wp.config.log_level = wp.LOG_WARNING
    wp.init()
    root = pathlib.Path(args.keep or tempfile.mkdtemp())
    cols = ("instr", "ld.global", "ld.v", "local", "ld.shared", "ex2", "vote", "regs", "stack", "spill_st", "spill_ld", "smem")
    print(f"sm_90 (NVRTC of Warp {wp.__version__})")
    print(f"{'kernel':30s} " + " ".join(f"{c:>9s}" for c in cols))
    for name, kernel in kernels(args.bwd).items():
        (path,) = wp.compile_aot_module(kernel.module, arch=90, use_ptx=True,
                                        module_dir=root / re.sub(r"\W+", "_", name))
        ptx = path.read_bytes().replace(b"\0", b"").decode()
        row = {**ptx_counts(ptx), **inner_counts(ptx), **ptxas_info(path)}
        print(f"{name:30s} " + " ".join(f"{row.get(c, ''):>9}" for c in cols), flush=True)
    if not args.keep:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
