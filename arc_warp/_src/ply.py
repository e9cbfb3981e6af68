"""Standard 3DGS PLY files (the INRIA layout), numpy only.

One ``vertex`` element, binary little-endian, float32 properties in this order::

    x y z  nx ny nz  f_dc_0..2  f_rest_0..(3*(K-1)-1)  opacity  scale_0..2  rot_0..3

``opacity`` is a logit, ``scale_*`` are natural logs of std-devs, ``rot_*`` is a wxyz
quaternion (not necessarily normalised). ``f_rest`` is channel-major: the first K-1
values are the red coefficients 1..K-1, then green, then blue.
"""

import os
from dataclasses import dataclass

import numpy as np

from .files import write_atomically

_SCALAR_TYPES = {
    "char": "i1", "int8": "i1", "uchar": "u1", "uint8": "u1",
    "short": "<i2", "int16": "<i2", "ushort": "<u2", "uint16": "<u2",
    "int": "<i4", "int32": "<i4", "uint": "<u4", "uint32": "<u4",
    "float": "<f4", "float32": "<f4", "double": "<f8", "float64": "<f8",
}
_MAX_HEADER_BYTES = 1 << 20


class PlyFormatError(ValueError):
    """A file is not a readable standard 3DGS PLY; the message names the file and the problem."""


@dataclass
class GaussianPly:
    """Gaussians as stored in a 3DGS PLY (all float32 numpy arrays, raw/unactivated values).

    means (N,3) world units; normals (N,3) (unused by 3DGS, usually zeros);
    sh_dc (N,3) degree-0 SH coefficients; sh_rest (N,K-1,3) higher SH coefficients with
    K = (degree+1)^2, coefficient-major and channel-last (gsplat's ``shN`` layout);
    opacity_logits (N,); log_scales (N,3) natural log of std-devs; quats (N,4) wxyz.
    """

    means: np.ndarray
    normals: np.ndarray
    sh_dc: np.ndarray
    sh_rest: np.ndarray
    opacity_logits: np.ndarray
    log_scales: np.ndarray
    quats: np.ndarray

    def __post_init__(self):
        n = np.shape(self.means)[0] if np.ndim(self.means) == 2 else -1
        expected = {"means": (n, 3), "normals": (n, 3), "sh_dc": (n, 3),
                    "opacity_logits": (n,), "log_scales": (n, 3), "quats": (n, 4)}
        for name, shape in expected.items():
            arr = np.ascontiguousarray(getattr(self, name), dtype=np.float32)
            if n < 0 or arr.shape != shape:
                raise ValueError(f"GaussianPly.{name}: expected shape {shape} with N rows "
                                 f"taken from means (N,3), got {np.shape(getattr(self, name))}")
            setattr(self, name, arr)
        rest = np.ascontiguousarray(self.sh_rest, dtype=np.float32)
        k = rest.shape[1] + 1 if rest.ndim == 3 else 0
        if rest.ndim != 3 or rest.shape[0] != n or rest.shape[2] != 3 or _sh_degree(k) is None:
            raise ValueError("GaussianPly.sh_rest: expected shape (N, (d+1)^2-1, 3) for an SH "
                             f"degree d in 0..4 with N={n}, got {rest.shape}")
        self.sh_rest = rest

    @property
    def num_gaussians(self) -> int:
        """N, the number of Gaussians."""
        return self.means.shape[0]

    @property
    def sh_degree(self) -> int:
        """SH degree d, where sh_rest holds (d+1)^2-1 coefficients per channel."""
        return _sh_degree(self.sh_rest.shape[1] + 1)

    @property
    def sh(self) -> np.ndarray:
        """(N, K, 3) float32: sh_dc followed by sh_rest."""
        return np.concatenate([self.sh_dc[:, None, :], self.sh_rest], axis=1)

    @classmethod
    def from_activated(cls, means, quats, scales, opacities, sh):
        """Build from renderer-ready values: scales (N,3) linear std-devs > 0, opacities (N,) in
        (0,1), sh (N,K,3) SH coefficients (K=(d+1)^2); normals are zeros."""
        means = np.asarray(means, dtype=np.float32)
        sh = np.asarray(sh, dtype=np.float32)
        scales = np.asarray(scales, dtype=np.float64)
        opacities = np.asarray(opacities, dtype=np.float64)
        if np.any(scales <= 0) or np.any((opacities <= 0) | (opacities >= 1)):
            raise ValueError("from_activated: expected scales > 0 and opacities in (0, 1)")
        if sh.ndim != 3 or sh.shape[1] < 1:
            raise ValueError(f"from_activated: expected sh of shape (N, K, 3), got {sh.shape}")
        return cls(means, np.zeros_like(means), sh[:, 0, :], sh[:, 1:, :],
                   np.log(opacities / (1.0 - opacities)), np.log(scales), quats)

    def activated(self) -> dict:
        """Renderer-ready float32 arrays: means (N,3), quats (N,4) normalised wxyz, scales
        (N,3) = exp(log_scales), opacities (N,) = sigmoid(logits), sh (N,K,3)."""
        logits = self.opacity_logits.astype(np.float64)
        norm = np.linalg.norm(self.quats, axis=1, keepdims=True)
        return {
            "means": self.means.copy(),
            "quats": (self.quats / np.where(norm > 0, norm, 1.0)).astype(np.float32),
            "scales": np.exp(self.log_scales).astype(np.float32),
            "opacities": (0.5 * (1.0 + np.tanh(0.5 * logits))).astype(np.float32),
            "sh": self.sh,
        }


def _sh_degree(k: int):
    for d in range(5):
        if (d + 1) ** 2 == k:
            return d
    return None


def _property_names(num_rest: int) -> list:
    return (["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"]
            + [f"f_rest_{i}" for i in range(num_rest)]
            + ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"])


def write_ply(path, gaussians: GaussianPly) -> None:
    """Write `gaussians` to `path` as a binary little-endian standard 3DGS PLY.

    Atomic: the file is written under a temporary name in the same folder and renamed over
    `path` (see files.write_atomically), so `path` always holds a complete PLY, the old
    one until the new one is complete, even if the process is killed while writing."""
    if not isinstance(gaussians, GaussianPly):
        raise TypeError(f"write_ply: expected a GaussianPly, got {type(gaussians).__name__}")
    g = gaussians
    n = g.num_gaussians
    rest = g.sh_rest.transpose(0, 2, 1).reshape(n, -1)  # channel-major f_rest
    table = np.concatenate([g.means, g.normals, g.sh_dc, rest, g.opacity_logits[:, None],
                            g.log_scales, g.quats], axis=1).astype("<f4")
    names = _property_names(rest.shape[1])
    header = ["ply", "format binary_little_endian 1.0", f"element vertex {n}"]
    header += [f"property float {name}" for name in names] + ["end_header"]
    with write_atomically(path) as tmp, open(tmp, "wb") as f:
        f.write(("\n".join(header) + "\n").encode("ascii"))
        f.write(np.ascontiguousarray(table).tobytes())


def _parse_header(path, f):
    """-> elements [(name, count, [(prop, dtype)])]; leaves `f` at the first data byte."""
    def fail(problem):
        raise PlyFormatError(f"{os.fspath(path)!s}: {problem}")

    if f.readline(16).rstrip(b"\r\n") != b"ply":
        fail("not a PLY file (the first line is not 'ply')")
    elements, fmt = [], None
    while True:
        raw = f.readline(4096)
        if not raw or f.tell() > _MAX_HEADER_BYTES:
            fail("the header has no 'end_header' line")
        words = raw.decode("ascii", errors="replace").split()
        if not words or words[0] in ("comment", "obj_info"):
            continue
        if words[0] == "end_header":
            break
        if words[0] == "format":
            fmt = words[1:2]
            if fmt != ["binary_little_endian"]:
                fail(f"format '{' '.join(words[1:])}' is not supported; "
                     "only 'binary_little_endian' PLY files can be read")
        elif words[0] == "element" and len(words) == 3 and words[2].isdigit():
            elements.append((words[1], int(words[2]), []))
        elif words[0] == "property" and elements:
            if words[1] == "list":
                fail(f"element '{elements[-1][0]}' has a list property; "
                     "only scalar properties are supported")
            if len(words) != 3 or words[1] not in _SCALAR_TYPES:
                fail(f"cannot parse header line {raw.strip()!r}")
            elements[-1][2].append((words[2], _SCALAR_TYPES[words[1]]))
        else:
            fail(f"cannot parse header line {raw.strip()!r}")
    if fmt is None:
        fail("the header has no 'format' line")
    return elements


def read_ply(path) -> GaussianPly:
    """Read a standard 3DGS PLY (binary little-endian). Extra vertex properties are ignored;
    other elements are skipped. Raises PlyFormatError naming the file and the problem."""
    try:
        with open(path, "rb") as f:
            elements = _parse_header(path, f)
            data = f.read()
    except OSError as exc:
        raise PlyFormatError(f"{os.fspath(path)!s}: cannot open ({exc.strerror})") from exc

    def fail(problem):
        raise PlyFormatError(f"{os.fspath(path)!s}: {problem}")

    vertex = None
    for name, count, props in elements:
        dtype = np.dtype(props)
        if name == "vertex":
            vertex = (count, dtype)
            break
        data = data[count * dtype.itemsize:]  # skip an element stored before the vertices
    if vertex is None:
        fail("no 'vertex' element in the header")
    count, dtype = vertex
    if len(data) < count * dtype.itemsize:
        fail(f"truncated: {count} vertices need {count * dtype.itemsize} bytes of data, "
             f"the file has {len(data)}")
    table = np.frombuffer(data, dtype=dtype, count=count)

    have = set(dtype.names)
    num_rest = sum(1 for p in have if p.startswith("f_rest_"))
    optional = {"nx", "ny", "nz"}
    missing = [p for p in _property_names(num_rest) if p not in have and p not in optional]
    if missing:
        fail(f"missing 3DGS vertex properties: {', '.join(missing)}")
    k = num_rest // 3 + 1
    if num_rest % 3 or _sh_degree(k) is None:
        fail(f"{num_rest} f_rest properties is not 3*((d+1)^2-1) for an SH degree d in 0..4")

    def cols(names):
        return np.stack([table[p].astype(np.float32) for p in names], axis=1) if names \
            else np.zeros((count, 0), np.float32)

    normals = cols(["nx", "ny", "nz"]) if optional <= have \
        else np.zeros((count, 3), np.float32)
    rest = cols([f"f_rest_{i}" for i in range(num_rest)]).reshape(count, 3, k - 1)
    return GaussianPly(
        means=cols(["x", "y", "z"]), normals=normals,
        sh_dc=cols(["f_dc_0", "f_dc_1", "f_dc_2"]),
        sh_rest=rest.transpose(0, 2, 1),
        opacity_logits=table["opacity"].astype(np.float32),
        log_scales=cols(["scale_0", "scale_1", "scale_2"]),
        quats=cols(["rot_0", "rot_1", "rot_2", "rot_3"]))
