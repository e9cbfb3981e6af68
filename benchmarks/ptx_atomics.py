"""Global float atomics per backward kernel in the PTX that NVRTC emits, without a GPU.

Compiles the accumulating backward kernels (splat raster and SH, the mesh ops, the
scatter kernel) for one architecture with Warp's NVRTC (``wp.compile_aot_module``) and
counts, per kernel, the global float atomic instructions: ``v4`` (float4),
``v2`` (float2) and ``f32`` (scalar) ``atom``/``red``. Each count is over the whole PTX, so
a call site the compiler duplicates counts twice, and the four alignment arms of a vector
atomic call site each count. Run it on two checkouts to compare them::

    PYTHONPATH=. python benchmarks/ptx_atomics.py --arch 90
    PYTHONPATH=../main python benchmarks/ptx_atomics.py --arch 90

With ``--sass`` (needs ``ptxas`` and ``cuobjdump``/``nvdisasm`` on PATH) it also counts
the SASS ``RED``/``ATOM`` instructions by width (``F32``, ``F32x2``, ``F32x4``).
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import warp as wp


def kernels():
    """(name, kernel) of every backward that accumulates through the ARC module."""
    from arc_warp._src.arc.scatter_ops import _scatter_kernel
    from arc_warp._src.mesh.antialias_kernels import make_aa_bwd
    from arc_warp._src.mesh.interp_kernels import make_interp_bwd
    from arc_warp._src.mesh.raster_kernels import make_raster_bwd as make_mesh_raster_bwd
    from arc_warp._src.mesh.texture_kernels import LINEAR, MIP_LINEAR, make_tex_bwd
    from arc_warp._src.splat.raster_kernels import make_raster_bwd
    from arc_warp._src.splat.sh_kernels import make_sh_bwd

    out = []
    for mode in ("atomic", "arc"):
        out += [
            (f"splat raster_bwd {mode} (10 floats)", make_raster_bwd(mode, False)),
            (f"splat raster_bwd {mode} absgrad (12 floats)", make_raster_bwd(mode, True)),
            (f"splat sh_bwd {mode} deg 3 (vec3)", make_sh_bwd(16, 16, False, mode, False)),
            (f"mesh interp_bwd {mode} k=4", make_interp_bwd(mode, 4, 1, False)),
            (f"mesh interp_bwd {mode} k=3", make_interp_bwd(mode, 3, 1, False)),
            (f"mesh tex_bwd {mode} linear k=4", make_tex_bwd(mode, LINEAR, 4, 1)),
            (f"mesh tex_bwd {mode} mip-linear k=3", make_tex_bwd(mode, MIP_LINEAR, 3, 1)),
            (f"mesh raster_bwd {mode} (vec4)", make_mesh_raster_bwd(mode)),
            (f"mesh aa_bwd {mode} (vec4)", make_aa_bwd(mode)),
            (f"scatter_add {mode} vec3", _scatter_kernel(wp.vec3, mode)),
            (f"scatter_add {mode} vec4", _scatter_kernel(wp.vec4, mode)),
        ]
    return out


def ptx_counts(ptx: str) -> dict:
    ptx = ptx.replace("\x00", "")
    return {
        "v4": len(re.findall(r"\b(?:atom|red)\.global\.[\w.]*?v4\.f32", ptx)),
        "v2": len(re.findall(r"\b(?:atom|red)\.global\.[\w.]*?v2\.f32", ptx)),
        "f32": len(re.findall(r"\b(?:atom|red)\.global\.(?:[a-z]+\.)*?add\.f32", ptx)),
    }


def sass_counts(ptx_path: pathlib.Path, arch: int, tmp: pathlib.Path) -> dict:
    text = ptx_path.read_text().replace("\x00", "")
    # a ptxas older than NVRTC rejects the newer .version line; these kernels need no new features
    have = subprocess.run(["ptxas", "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release (\d+)\.(\d+)", have)
    if m:
        text = re.sub(r"^\.version \d+\.\d+", f".version {int(m[1]) - 4}.{m[2]}", text, flags=re.M)
    src, cubin = tmp / "k.ptx", tmp / "k.cubin"
    src.write_text(text)
    subprocess.run(["ptxas", f"-arch=sm_{arch}", "-o", str(cubin), str(src)], check=True)
    sass = subprocess.run(["cuobjdump", "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    return dict(collections.Counter(re.findall(r"\b((?:RED|ATOM)G?\.E\.ADD\.F32(?:x[24])?)", sass)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--sass", action="store_true", help="also count SASS RED/ATOM by width")
    args = ap.parse_args()
    wp.config.log_level = wp.LOG_ERROR
    wp.init()
    import arc_warp

    print(f"arc_warp from {pathlib.Path(arc_warp.__file__).parent}, sm_{args.arch}", file=sys.stderr)
    if args.sass and not (shutil.which("ptxas") and shutil.which("cuobjdump")):
        raise SystemExit("--sass needs ptxas and cuobjdump (and nvdisasm) on PATH")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        print(f"| kernel | v4 | v2 | f32 |{' SASS |' if args.sass else ''}")
        print(f"|---|---:|---:|---:|{'---|' if args.sass else ''}")
        for i, (name, kernel) in enumerate(kernels()):
            (path,) = wp.compile_aot_module(kernel.module, arch=args.arch, use_ptx=True, module_dir=tmp / str(i))
            c = ptx_counts(path.read_text())
            row = f"| {name} | {c['v4']} | {c['v2']} | {c['f32']} |"
            if args.sass:
                s = sass_counts(path, args.arch, tmp / str(i))
                row += " " + ", ".join(f"{k} {v}" for k, v in sorted(s.items())) + " |"
            print(row, flush=True)


if __name__ == "__main__":
    main()
