"""arc_warp_trimesh: OBJ / PLY / GLB loading into arrays for the mesh ops, and its errors."""

import numpy as np
import pytest

trimesh = pytest.importorskip("trimesh", reason="the mesh extra (trimesh) is not installed")
PIL = pytest.importorskip("PIL.Image", reason="textures need pillow")

import arc_warp.mesh as mesh  # noqa: E402
from arc_warp_trimesh import load_mesh, mesh_from_trimesh  # noqa: E402


def textured_box():
    box = trimesh.creation.box()
    uv = (box.vertices[:, :2] + 0.5).astype(np.float64)
    img = PIL.fromarray(np.tile(np.arange(8, dtype=np.uint8)[:, None, None] * 30, (1, 4, 3)))  # 8 rows
    box.visual = trimesh.visual.TextureVisuals(uv=uv, image=img)
    return box


@pytest.mark.parametrize("ext", ["obj", "glb", "ply"])
def test_round_trip(tmp_path, ext):
    box = textured_box()
    path = tmp_path / f"box.{ext}"
    box.export(path)
    data = load_mesh(path, require_uvs=ext != "ply")
    assert data.tri.dtype == np.int32 and data.tri.shape[1] == 3 and len(data.tri) == 12
    assert data.positions.dtype == np.float32 and data.normals.shape == data.positions.shape
    np.testing.assert_allclose(np.abs(data.positions).max(), 0.5, atol=1e-6)
    if ext != "ply":
        assert data.uvs.shape == (len(data.positions), 2)
        assert data.texture.shape == (8, 4, 3)
        assert data.texture[0, 0, 0] > data.texture[-1, 0, 0]  # flipped: row 0 is the image's bottom row
    # ready for the ops
    pos = data.clip_positions(np.diag([1.0, 1.0, 0.1, 1.0]) @ np.eye(4))
    pos[:, 3] = 2.0
    import warp as wp
    rast, _ = mesh.rasterize(wp.array(pos[None], dtype=wp.float32, device="cpu"),
                             wp.array(data.tri, dtype=wp.int32, device="cpu"), (8, 8))
    assert (rast.numpy()[..., 3] > 0).any()


def test_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_mesh(tmp_path / "missing.obj")
    plain = trimesh.creation.icosphere(1)
    with pytest.raises(ValueError, match="uvs"):
        mesh_from_trimesh(plain, require_uvs=True)
    with pytest.raises(ValueError, match="empty"):
        mesh_from_trimesh(trimesh.Trimesh(np.zeros((0, 3)), np.zeros((0, 3), int)))
    path = tmp_path / "empty.obj"
    path.write_text("# nothing\n")
    with pytest.raises(ValueError):
        load_mesh(path)
