"""Meshes from files for arc_warp.mesh (the ``mesh`` extra, trimesh): OBJ / GLB / PLY with
uvs, normals and textures as numpy arrays ready for rasterize / interpolate / texture."""

from .load import MeshData, load_mesh, mesh_from_trimesh

__all__ = ["MeshData", "load_mesh", "mesh_from_trimesh"]
