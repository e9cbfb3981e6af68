"""Static cost of the mesh texture and interpolate kernels on sm_90, without a GPU.

Builds each kernel's CUDA source with Warp's NVRTC (``wp.compile_aot_module``), then
counts in its PTX: instructions, global loads (scalar and vector), local-memory
accesses and 64-bit multiplies; with ``ptxas`` on the PATH also registers and spill
bytes (``ptxas -v``; a PTX newer than that ptxas is relabelled to its version, which
works while the code uses no newer instruction).

Usage::

    python benchmarks/ptx_mesh.py [--only texture interp] [--channels 4] [--attrs 8] [--keep DIR]
"""

from __future__ import annotations

import argparse
import pathlib
import re
import shutil
import subprocess
import tempfile

import warp as wp

from arc_warp._src.mesh.common import chunking
from arc_warp._src.mesh.interp_kernels import make_interp_bwd, make_interp_fwd
from arc_warp._src.mesh.texture_kernels import FILTER_MODES, MIP_LINEAR, make_mip_fold, make_tex_bwd, make_tex_fwd

BWD_MODES = ("atomic", "arc", "floor")


def texture_kernels(channels: int) -> dict:
    """name -> kernel: forward per filter mode, backward (linear-mipmap-linear) per reduce mode, fold."""
    k, chunks = chunking(channels)
    out = {f"tex fwd {name}": make_tex_fwd(mode, k, chunks) for name, mode in FILTER_MODES.items()}
    out.update({f"tex bwd mip-linear {mode}": make_tex_bwd(mode, MIP_LINEAR, k, chunks) for mode in BWD_MODES})
    out["tex mip_fold"] = make_mip_fold(k, chunks)
    return out


def interp_kernels(attrs: int) -> dict:
    """name -> kernel: forward and backward per reduce mode without pixel derivatives, and
    both with them (``diff_attrs``, any list: one kernel)."""
    k, chunks = chunking(attrs)
    out = {"interp fwd": make_interp_fwd(k, chunks, False), "interp fwd +da": make_interp_fwd(k, chunks, True)}
    out.update({f"interp bwd {mode}": make_interp_bwd(mode, k, chunks, False) for mode in BWD_MODES})
    out["interp bwd arc +da"] = make_interp_bwd("arc", k, chunks, True)
    return out


def ptx_counts(ptx: str) -> dict:
    body = [ln.strip() for ln in ptx.splitlines()]
    instr = [ln for ln in body if re.match(r"^(@!?%p\d+\s+)?[a-z]+[a-z0-9_.]*\b", ln) and not ln.startswith(".")]
    loads = [ln for ln in instr if re.search(r"\bld\.global", ln)]
    return {
        "instr": len(instr),
        "ld.global": len(loads),
        "ld.v": sum(bool(re.search(r"ld\.global(\.nc)?\.v[24]", ln)) for ln in loads),
        "local": sum(".local" in ln for ln in instr),
        "mul64": sum(bool(re.search(r"\b(mul|mad)\.(lo|wide)\.[su]64|\bmul\.wide\.", ln)) for ln in instr),
        "atom": sum(bool(re.match(r"(@!?%p\d+\s+)?(atom|red)\.global", ln)) for ln in instr),
    }


def ptxas_info(path: pathlib.Path) -> dict:
    """Registers and spill bytes from ``ptxas -v`` (empty without ptxas)."""
    ptxas = shutil.which("ptxas")
    if ptxas is None:
        return {}
    text = path.read_bytes().replace(b"\0", b"").decode()
    version = subprocess.run([ptxas, "--version"], capture_output=True, text=True).stdout
    release = re.search(r"release (\d+)\.(\d+)", version)
    if release:  # ptxas of CUDA 12.x/13.x reads PTX ISA up to (major - 4).minor
        text = re.sub(r"^\.version \S+", f".version {int(release[1]) - 4}.{release[2]}", text, flags=re.M)
    with tempfile.TemporaryDirectory() as tmp:
        src = pathlib.Path(tmp) / "k.ptx"
        src.write_text(text)
        log = subprocess.run([ptxas, "-v", "-arch=sm_90", str(src), "-o", str(src.with_suffix(".cubin"))],
                             capture_output=True, text=True).stderr
    regs = re.search(r"Used (\d+) registers", log)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    stack = re.search(r"(\d+) bytes stack frame", log)
    smem = re.search(r"(\d+) bytes smem", log)
    if regs is None:
        return {"ptxas": log.strip().splitlines()[-1] if log.strip() else "failed"}
    return {"regs": int(regs[1]), "stack": int(stack[1]), "spill_st": int(spill[1]), "spill_ld": int(spill[2]),
            "smem": int(smem[1]) if smem else 0}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", default=["texture", "interp"], choices=["texture", "interp"])
    ap.add_argument("--channels", type=int, default=4, help="texture channels")
    ap.add_argument("--attrs", type=int, default=8, help="interpolated attributes")
    ap.add_argument("--keep", default=None, help="directory that keeps the generated .cu and .ptx files")
    args = ap.parse_args(argv)
    wp.config.log_level = wp.LOG_WARNING
    wp.init()
    root = pathlib.Path(args.keep or tempfile.mkdtemp())
    cols = ("instr", "ld.global", "ld.v", "local", "mul64", "atom", "regs", "stack", "spill_st", "spill_ld")
    print(f"texture C = {args.channels}, interpolate A = {args.attrs}, sm_90 (NVRTC of Warp {wp.__version__})")
    print(f"{'kernel':30s} " + " ".join(f"{c:>9s}" for c in cols))
    todo = {**(texture_kernels(args.channels) if "texture" in args.only else {}),
            **(interp_kernels(args.attrs) if "interp" in args.only else {})}
    for name, kernel in todo.items():
        (path,) = wp.compile_aot_module(kernel.module, arch=90, use_ptx=True,
                                        module_dir=root / name.replace(" ", "_"))
        row = {**ptx_counts(path.read_bytes().replace(b"\0", b"").decode()), **ptxas_info(path)}
        print(f"{name:30s} " + " ".join(f"{row.get(c, ''):>9}" for c in cols), flush=True)
    if not args.keep:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
