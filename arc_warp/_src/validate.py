"""Array checks shared by the public functions of every layer: one message for each mistake."""

import warp as wp


def _type_name(dtype) -> str:
    return getattr(dtype, "__name__", repr(dtype))


def check_array(value, name: str, dtype, ndim, shape=None, device=None, last=None) -> wp.array:
    """Raises TypeError/ValueError unless ``value`` is a contiguous wp.array as described.

    ``dtype`` is a Warp type (``float`` means ``wp.float32``); ``ndim`` an int or a tuple of
    accepted ranks; ``shape``, when given, the exact shape; ``last``, when given, the size
    of the last axis; ``device``, when given, the device every input must share.
    """
    dtype = wp.float32 if dtype is float else dtype
    ranks = ndim if isinstance(ndim, tuple) else (ndim,) if isinstance(ndim, int) else tuple(ndim)
    if not isinstance(value, wp.array):
        raise TypeError(f"{name} must be a wp.array(dtype={_type_name(dtype)}), got {type(value).__name__}")
    if value.dtype is not dtype and not wp.types.types_equal(value.dtype, dtype):
        raise TypeError(f"{name} must have dtype {_type_name(dtype)}, got {_type_name(value.dtype)}")
    if (value.ndim not in ranks or (shape is not None and tuple(value.shape) != tuple(shape))
            or (last is not None and value.shape[-1] != last)):
        if shape is not None:
            want = str(tuple(shape))
        else:
            want = " or ".join(f"{r}-D" for r in ranks) + (f" with last axis {last}" if last is not None else "")
        raise ValueError(f"{name} must have shape {want}, got {tuple(value.shape)}")
    if not value.is_contiguous:
        raise ValueError(f"{name} must be contiguous; pass a contiguous copy (arr.contiguous())")
    if device is not None and value.device != device:
        raise ValueError(f"{name} is on {value.device}, expected {device} (all inputs on one device)")
    return value


def check_resolution(resolution) -> tuple[int, int]:
    """(height, width) of an image as ints in [1, 32768]; raises TypeError/ValueError for
    anything else (the mesh ops and the torch bridge, which sizes its outputs with it)."""
    try:
        h, w = (int(r) for r in resolution)
    except (TypeError, ValueError):
        raise TypeError(f"resolution: expected (height, width) integers, got {resolution!r}") from None
    if h < 1 or w < 1 or h > 32768 or w > 32768:
        raise ValueError(f"resolution: expected 1 <= height, width <= 32768, got {(h, w)}")
    return h, w
