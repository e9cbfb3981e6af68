"""The array checks every layer shares (one message for each mistake): ``check_array`` for a
Warp array's type, dtype, rank, shape, contiguity and device, ``check_resolution`` for an
image size."""

from ._src.validate import check_array, check_resolution

__all__ = ["check_array", "check_resolution"]
