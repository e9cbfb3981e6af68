"""Standard 3DGS PLY import/export (numpy only): see :mod:`arc_warp._src.ply`."""

from ._src.ply import GaussianPly, PlyFormatError, read_ply, write_ply

__all__ = ["GaussianPly", "PlyFormatError", "read_ply", "write_ply"]
