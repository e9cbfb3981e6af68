"""Standard 3DGS PLY I/O: exact round trips, layout, and clear errors for bad files."""

import numpy as np
import pytest

from arc_warp.ply import GaussianPly, PlyFormatError, read_ply, write_ply


def _random_ply(rng, n=7, degree=2) -> GaussianPly:
    k = (degree + 1) ** 2
    f = np.float32
    return GaussianPly(
        means=rng.normal(size=(n, 3)).astype(f), normals=rng.normal(size=(n, 3)).astype(f),
        sh_dc=rng.normal(size=(n, 3)).astype(f), sh_rest=rng.normal(size=(n, k - 1, 3)).astype(f),
        opacity_logits=rng.normal(size=n).astype(f), log_scales=rng.normal(size=(n, 3)).astype(f),
        quats=rng.normal(size=(n, 4)).astype(f))


FIELDS = ("means", "normals", "sh_dc", "sh_rest", "opacity_logits", "log_scales", "quats")


@pytest.mark.parametrize("degree", [0, 1, 3])
def test_round_trip_is_bitwise_exact(tmp_path, rng, degree):
    g = _random_ply(rng, degree=degree)
    # Values that text formats or float64 detours would alter.
    g.means[0] = [np.float32(1e-38), np.float32(-0.0), np.nextafter(np.float32(1), np.float32(2))]
    first, second = tmp_path / "a.ply", tmp_path / "b.ply"
    write_ply(first, g)
    h = read_ply(first)
    for name in FIELDS:
        assert getattr(h, name).tobytes() == getattr(g, name).tobytes(), name
    assert h.sh_degree == degree
    write_ply(second, h)
    assert first.read_bytes() == second.read_bytes()


def test_layout_matches_the_3dgs_convention(tmp_path, rng):
    g = _random_ply(rng, n=3, degree=1)
    path = tmp_path / "g.ply"
    write_ply(path, g)
    data = path.read_bytes()
    header, body = data.split(b"end_header\n", 1)
    names = [line.split()[2].decode() for line in header.splitlines() if line.startswith(b"property")]
    rest = [f"f_rest_{i}" for i in range(9)]
    assert names == (["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"] + rest
                     + ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"])
    assert b"format binary_little_endian 1.0" in header
    table = np.frombuffer(body, dtype="<f4").reshape(3, len(names))
    # f_rest is channel-major: red coefficients 1..3 first, then green, then blue.
    np.testing.assert_array_equal(table[:, 9:12], g.sh_rest[:, :, 0])
    np.testing.assert_array_equal(table[:, 15:18], g.sh_rest[:, :, 2])
    np.testing.assert_array_equal(table[:, names.index("opacity")], g.opacity_logits)
    np.testing.assert_array_equal(table[:, -4:], g.quats)


def test_reads_files_with_extra_properties_and_elements(tmp_path, rng):
    """Other tools add properties (e.g. colours as uchar) and elements; they are skipped."""
    g = _random_ply(rng, n=4, degree=0)
    names = ["x", "y", "z", "f_dc_0", "f_dc_1", "f_dc_2", "opacity",
             "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]
    dtype = np.dtype([("pre", "<f8")])
    vert = np.dtype([(n, "<f4") for n in names] + [("red", "u1")])
    rows = np.zeros(4, vert)
    cols = np.concatenate([g.means, g.sh_dc, g.opacity_logits[:, None], g.log_scales, g.quats], 1)
    for i, n in enumerate(names):
        rows[n] = cols[:, i]
    rows["red"] = 200
    header = ("ply\nformat binary_little_endian 1.0\ncomment made by a test\n"
              "element extra 2\nproperty double pre\nelement vertex 4\n"
              + "".join(f"property float {n}\n" for n in names) + "property uchar red\nend_header\n")
    path = tmp_path / "other.ply"
    path.write_bytes(header.encode() + np.zeros(2, dtype).tobytes() + rows.tobytes())
    h = read_ply(path)
    np.testing.assert_array_equal(h.means, g.means)
    np.testing.assert_array_equal(h.quats, g.quats)
    np.testing.assert_array_equal(h.normals, 0.0)
    assert h.sh_degree == 0


def test_activated_values(rng):
    g = _random_ply(rng, degree=0)
    a = g.activated()
    np.testing.assert_allclose(a["scales"], np.exp(g.log_scales), rtol=1e-6)
    np.testing.assert_allclose(a["opacities"], 1 / (1 + np.exp(-g.opacity_logits.astype(float))),
                               rtol=1e-6)  # float32 rounding of the logistic
    np.testing.assert_allclose(np.linalg.norm(a["quats"], axis=1), 1.0, rtol=1e-6)
    back = GaussianPly.from_activated(a["means"], g.quats, a["scales"], a["opacities"], a["sh"])
    # log(exp(x)) and logit(sigmoid(x)) in float64 from float32 inputs: a few float32 ulps.
    np.testing.assert_allclose(back.log_scales, g.log_scales, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(back.opacity_logits, g.opacity_logits, rtol=1e-4, atol=1e-4)


def _good_bytes(tmp_path, rng) -> bytes:
    path = tmp_path / "good.ply"
    write_ply(path, _random_ply(rng, n=5, degree=1))
    return path.read_bytes()


@pytest.mark.parametrize("mutate, message", [
    (lambda b: b"PNG" + b[3:], "not a PLY file"),
    (lambda b: b.replace(b"binary_little_endian", b"ascii"), "only 'binary_little_endian'"),
    (lambda b: b.replace(b"binary_little_endian", b"binary_big_endian"), "binary_big_endian"),
    (lambda b: b[:-7], "truncated"),
    (lambda b: b.split(b"end_header")[0], "no .end_header. line"),
    (lambda b: b.replace(b"end_header\n", b"end_heade\n"), "cannot parse header line"),
    (lambda b: b.replace(b"property float opacity", b"property float opacitx"), "opacity"),
    (lambda b: b.replace(b"property float f_rest_8\n", b""), "f_rest"),
    (lambda b: b.replace(b"element vertex", b"element face"), "no 'vertex' element"),
    (lambda b: b.replace(b"property float x", b"property list uchar int x"), "list property"),
])
def test_bad_files_raise_clear_errors(tmp_path, rng, mutate, message):
    path = tmp_path / "bad.ply"
    path.write_bytes(mutate(_good_bytes(tmp_path, rng)))
    with pytest.raises(PlyFormatError, match=message) as info:
        read_ply(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_missing_file_names_the_file(tmp_path):
    with pytest.raises(PlyFormatError, match="nope.ply: cannot open"):
        read_ply(tmp_path / "nope.ply")


def test_record_validation(rng):
    g = _random_ply(rng, n=4)
    with pytest.raises(ValueError, match="quats"):
        GaussianPly(g.means, g.normals, g.sh_dc, g.sh_rest, g.opacity_logits, g.log_scales,
                    g.quats[:3])
    with pytest.raises(ValueError, match="sh_rest"):
        GaussianPly(g.means, g.normals, g.sh_dc, g.sh_rest[:, :5], g.opacity_logits,
                    g.log_scales, g.quats)
    with pytest.raises(TypeError, match="GaussianPly"):
        write_ply("unused.ply", {"means": g.means})


def test_write_stopped_midway_leaves_the_previous_file(tmp_path, rng, monkeypatch):
    """A kill or an error (disk full) while writing must not cost the file already there
    (issue 37: a kill during export left a 0-byte PLY where a good one had been)."""
    import builtins

    import arc_warp._src.ply as ply_module

    path = tmp_path / "g.ply"
    write_ply(path, _random_ply(rng, n=50))
    before = path.read_bytes()

    class DiesMidway:
        def __init__(self, f):
            self._f = f

        def write(self, data):
            self._f.write(data[:len(data) // 2])
            self._f.flush()
            raise OSError(28, "No space left on device")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._f.close()

    monkeypatch.setattr(ply_module, "open", lambda *a, **k: DiesMidway(builtins.open(*a, **k)),
                        raising=False)
    with pytest.raises(OSError, match="No space left"):
        write_ply(path, _random_ply(rng, n=80))
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.ply"]  # no temporary left


def test_write_is_a_rename_with_the_usual_permissions(tmp_path, rng):
    import os
    import stat

    path = tmp_path / "g.ply"
    path.write_bytes(b"old")
    inode = path.stat().st_ino
    write_ply(path, _random_ply(rng))
    assert path.stat().st_ino != inode  # replaced by a rename, not rewritten in place
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.ply"]
