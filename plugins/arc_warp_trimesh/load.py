"""Loading a mesh file with trimesh into arrays laid out for arc_warp.mesh."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import trimesh


@dataclass
class MeshData:
    """One triangle mesh as numpy arrays (float32 / int32), ready for the mesh ops.

    positions [V, 3] object space; tri [F, 3] int32 (counter-clockwise as in the file);
    uvs [V, 2] in [0, 1] with v up (nvdiffrast's texture convention: row 0 of ``texture``
    is v = 0) or None; normals [V, 3] unit vertex normals; texture [H, W, C] float32 in
    [0, 1] with row 0 at v = 0 (flipped from the image file's top-down rows), or None.
    Vertices are split where the file's uv seams need it (trimesh does this on load).
    """

    positions: np.ndarray
    tri: np.ndarray
    normals: np.ndarray
    uvs: np.ndarray | None = None
    texture: np.ndarray | None = None

    def clip_positions(self, mvp: np.ndarray) -> np.ndarray:
        """[V, 4] float32 clip-space positions under a 4x4 model-view-projection matrix."""
        homo = np.concatenate([self.positions, np.ones((len(self.positions), 1), np.float32)], 1)
        return (homo @ np.asarray(mvp, np.float32).T).astype(np.float32)


def load_mesh(path, require_uvs: bool = False) -> MeshData:
    """Loads an OBJ / GLB / GLTF / PLY file (a scene is flattened into one mesh).

    Raises ValueError for empty meshes, non-triangle faces (polygons that trimesh could not
    triangulate), or, with ``require_uvs``, a mesh without texture coordinates; FileNotFoundError
    for missing files."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"load_mesh: no such file: {path}")
    loaded = trimesh.load(str(path), process=False, maintain_order=True)
    if isinstance(loaded, trimesh.Scene):
        geoms = [g for g in loaded.dump(concatenate=False) if isinstance(g, trimesh.Trimesh)]
        if not geoms:
            raise ValueError(f"load_mesh: {path} contains no triangle meshes")
        loaded = geoms[0] if len(geoms) == 1 else trimesh.util.concatenate(geoms)
    if not isinstance(loaded, trimesh.Trimesh):
        raise ValueError(f"load_mesh: {path} holds a {type(loaded).__name__}, not a triangle mesh")
    return mesh_from_trimesh(loaded, require_uvs=require_uvs, name=str(path))


def mesh_from_trimesh(mesh: trimesh.Trimesh, require_uvs: bool = False, name: str = "mesh") -> MeshData:
    """:class:`MeshData` of an in-memory ``trimesh.Trimesh`` (see :func:`load_mesh`)."""
    faces = np.asarray(mesh.faces)
    if len(mesh.vertices) == 0 or len(faces) == 0:
        raise ValueError(f"{name}: empty mesh ({len(mesh.vertices)} vertices, {len(faces)} faces)")
    if faces.ndim != 2 or faces.shape[1] != 3:
        raise ValueError(f"{name}: expected triangle faces [F, 3], got faces of shape {faces.shape}")
    positions = np.asarray(mesh.vertices, np.float32)
    if not np.isfinite(positions).all():
        raise ValueError(f"{name}: vertex positions contain NaN/Inf")
    uvs, texture = None, None
    visual = mesh.visual
    if isinstance(visual, trimesh.visual.TextureVisuals) and visual.uv is not None and len(visual.uv) == len(positions):
        uvs = np.asarray(visual.uv, np.float32)
        image = getattr(visual.material, "image", None) or getattr(visual.material, "baseColorTexture", None)
        if image is not None:
            rgb = np.asarray(image.convert("RGBA" if image.mode in ("RGBA", "LA", "P") else "RGB"), np.float32) / 255.0
            texture = np.ascontiguousarray(rgb[::-1])  # file rows run top-down; v = 0 is the bottom
    if require_uvs and uvs is None:
        raise ValueError(f"{name}: the mesh has no texture coordinates (uvs), which were required")
    return MeshData(positions=positions, tri=faces.astype(np.int32),
                    normals=np.asarray(mesh.vertex_normals, np.float32), uvs=uvs, texture=texture)
