"""A render's checks as the host reads them: intersection totals, bad inputs, overflow."""

from __future__ import annotations

import numpy as np
import warp as wp

from arc_warp._src.splat.validate_kernels import BAD_SLOTS, OVERFLOW_SLOT

# what a set slot means, where it is more than non-finite values of the input it names
_PROBLEMS = {
    "quats (zero norm)": "quats has quaternions of zero norm (all four components 0), which cannot be normalised "
                         "into a rotation; use (1, 0, 0, 0) for an unrotated Gaussian",
    "cameras": "a camera's viewmat/K (DeviceCameras) is non-finite, has a focal length <= 0 or a viewmat whose last "
               "row is not (0, 0, 0, 1); check the camera matrices",
    "camera distortion": "a camera's distortion coefficients (DeviceCameras.distortion) are non-finite or make the "
                         "lens mapping non-monotonic inside the image (the distorted radius stops increasing before "
                         "the image corner); check the coefficients and their order (Camera(..., distortion=...) "
                         "names the values)",
    "surface_depths (NaN)": "surface_depths has NaN values; give +inf where a pixel has no surface",
}


class RenderStatus:
    """The checks of one forward of C cameras: per camera a row of flags (``validate_kernels``):
    the tile-intersection total, the input checks and whether the total overflowed the sort's
    ``capacity``, copied to a host buffer of the renderer in stream order; :meth:`read` waits
    for that copy (immediate on the CPU) once. ``capacity``: the tile intersections per camera
    the render's sorts held. ``flags``: (C, FLAG_SLOTS) int32 on the device, the render's rows
    until the renderer's next forward rewrites them, which a fused optimizer step reads to
    skip its update (``SparseGaussianAdam.step(skip=...)``)."""

    def __init__(self, flags: wp.array, host: np.ndarray, event, capacity: int):
        self.flags, self.capacity = flags, capacity
        # the renderer's host copy (valid until its next forward), the event after it, the values read
        self._host, self._event, self._values = host, event, None

    @property
    def is_read(self) -> bool:
        """Whether the host has the values (:meth:`read` ran)."""
        return self._values is not None

    def read(self) -> np.ndarray:
        """(C, FLAG_SLOTS) int32 flags on the host, waiting for the device if needed."""
        if self._values is None:
            if self._event is not None:
                wp.synchronize_event(self._event)
            self._values = self._host.copy()
            self._host = self._event = None
        return self._values

    @property
    def totals(self) -> list[int]:
        """Each camera's tile intersections (saturated at 2^31 - 1)."""
        return self.read()[:, 0].tolist()

    @property
    def overflowed(self) -> list[int]:
        """Indices of the cameras whose total exceeded ``capacity``: their images left out
        the farthest Gaussians of some tiles."""
        return [c for c, flag in enumerate(self.read()[:, OVERFLOW_SLOT].tolist()) if flag]

    def check_inputs(self, context: str = "render_gaussians", note: str = "") -> None:
        """ValueError naming each input check that one or more cameras set (the slots
        between the total and the overflow flag), ``note`` appended."""
        bad = self.read()[:, 1:OVERFLOW_SLOT].any(axis=0)
        if not bad.any():
            return
        seen = [name for name, flag in zip(BAD_SLOTS, bad) if flag]
        plain = [name for name in seen if name not in _PROBLEMS]
        problems = [f"non-finite (NaN/Inf) values in {', '.join(plain)}"] if plain else []
        raise ValueError(f"{context}: " + "; ".join(problems + [_PROBLEMS[n] for n in seen if n in _PROBLEMS]) + note)

    def check(self, context: str = "render_gaussians") -> None:
        """:meth:`check_inputs`, and RuntimeError if a camera overflowed the sort."""
        self.check_inputs(context)
        over = self.overflowed
        if over:
            raise RuntimeError(
                f"{context}: camera(s) {over} had {max(self.totals[c] for c in over)} tile intersections, more than "
                f"the {self.capacity} the sort held, so the farthest Gaussians of some tiles were left out of their "
                "images; the renderer sorts more from its next forward on (GaussianRenderer.capacity)")
