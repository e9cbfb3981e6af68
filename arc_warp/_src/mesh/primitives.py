"""Procedural meshes for tests and demos (numpy only): a UV sphere and a cube."""

from __future__ import annotations

import numpy as np


def uv_sphere(rings: int = 16, segments: int = 32, radius: float = 1.0):
    """A closed unit-radius sphere with a texture seam.

    Returns ``(positions [V, 3] float32, uvs [V, 2] float32, tri [F, 3] int32)``: rings of
    ``segments + 1`` vertices (the seam column is duplicated in position only for the
    uvs, so the position mesh is closed: the seam vertices share indices through
    ``tri``) from pole to pole, u along longitude, v from the south pole (0) to the
    north pole (1). Triangles wind counter-clockwise seen from outside.
    """
    if rings < 2 or segments < 3:
        raise ValueError(f"uv_sphere: expected rings >= 2 and segments >= 3, got {rings}, {segments}")
    theta = np.linspace(0.0, np.pi, rings + 1)  # from the south pole (-y) up
    phi = np.linspace(0.0, 2.0 * np.pi, segments + 1)
    t, p = np.meshgrid(theta, phi, indexing="ij")
    pos = np.stack([np.sin(t) * np.cos(p), -np.cos(t), -np.sin(t) * np.sin(p)], -1) * radius
    uv = np.stack([p / (2.0 * np.pi), t / np.pi], -1)
    # vertex (r, s): the seam column s = segments and the poles reuse one index each
    index = np.arange((rings + 1) * (segments + 1)).reshape(rings + 1, segments + 1)
    index[:, segments] = index[:, 0]
    index[0, :] = index[0, 0]
    index[rings, :] = index[rings, 0]
    r, s = np.meshgrid(np.arange(rings), np.arange(segments), indexing="ij")
    a, b, c, d = index[r, s], index[r, s + 1], index[r + 1, s + 1], index[r + 1, s]
    tri = np.concatenate([np.stack([a, b, c], -1).reshape(-1, 3), np.stack([a, c, d], -1).reshape(-1, 3)])
    tri = tri[(tri[:, 0] != tri[:, 1]) & (tri[:, 1] != tri[:, 2]) & (tri[:, 2] != tri[:, 0])]
    used, remap = np.unique(tri, return_inverse=True)
    return (pos.reshape(-1, 3)[used].astype(np.float32), uv.reshape(-1, 2)[used].astype(np.float32),
            remap.reshape(-1, 3).astype(np.int32))


def cube(size: float = 1.0):
    """A closed cube centred at the origin with per-face uvs.

    Returns ``(positions [8, 3], uvs [24, 2], tri [12, 3], uv_tri [12, 3])``: positions are
    shared between faces (a closed mesh for antialiasing); ``uv_tri`` indexes ``uvs``
    (each face maps the whole [0, 1]^2), as nvdiffrast's cube/earth samples separate
    position and uv indices.
    """
    h = 0.5 * size
    pos = np.array([[x, y, z] for x in (-h, h) for y in (-h, h) for z in (-h, h)], np.float32)
    quads = [(0, 1, 3, 2), (4, 6, 7, 5), (0, 4, 5, 1), (2, 3, 7, 6), (0, 2, 6, 4), (1, 5, 7, 3)]
    tri = np.array([[q[0], q[1], q[2]] for q in quads] + [[q[0], q[2], q[3]] for q in quads], np.int32)
    uvs = np.tile(np.array([[0, 0], [1, 0], [1, 1], [0, 1]], np.float32), (6, 1))
    uv_tri = np.array([[4 * k, 4 * k + 1, 4 * k + 2] for k in range(6)] + [[4 * k, 4 * k + 2, 4 * k + 3]
                                                                           for k in range(6)], np.int32)
    return pos, uvs, tri, uv_tri
