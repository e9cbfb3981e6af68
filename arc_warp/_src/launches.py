"""Prepared kernel launches: each launch site of an object recorded once and run again.

A renderer or a mesh op launches the same kernels with mostly the same arguments on every
call. ``wp.launch`` checks and packs every argument each time (about 25 us of host time
for a dozen arguments); a recorded ``wp.Launch`` (``record_cmd=True``) runs again in a
few, and :meth:`Launches.launch` repacks only the arguments whose pointer, shape,
strides or value changed. This is the one place where the pointers of a call's arrays
are compared with the previous call's.
"""

from __future__ import annotations

import warp as wp

_REPACK = object()  # the signature of an argument that is always repacked (structs, vectors)


def signature(arg):
    """What must be unchanged for a packed launch argument to be reused."""
    if isinstance(arg, wp.array):
        return (arg.ptr, arg.shape, arg.strides)
    if arg is None or isinstance(arg, (bool, int, float)):
        return arg
    return _REPACK


class Launches:
    """The prepared launches of one object, by launch site.

    Args:
        device: the Warp device every launch runs on (on its current stream).
        record: False launches through ``wp.launch`` every time: an object used for one
            call (a render without a workspace) would pay for recording and gain nothing.
    """

    def __init__(self, device, record: bool = True):
        self.device = wp.get_device(device)
        self.record = record
        self._sites: dict = {}  # key -> [wp.Launch, dim, argument signatures]

    def launch(self, kernel, dim, args: list, block_dim: int | None = None, key=None) -> None:
        """``wp.launch(kernel, dim, inputs=args, block_dim=block_dim)`` on the device's
        current stream, off any tape. ``key`` names the launch site where one kernel is
        launched at several places of a call (per camera, say); a site is recorded per
        kernel, so a site whose kernel variant changes (another setting) gets its own."""
        if dim == 0:
            return  # Warp records no command for an empty launch
        if not self.record:
            wp.launch(kernel, dim=dim, inputs=args, device=self.device, block_dim=block_dim, record_tape=False)
            return
        key = (kernel, key)
        site = self._sites.get(key)
        if site is None:
            cmd = wp.launch(kernel, dim=dim, inputs=args, device=self.device, block_dim=block_dim,
                            record_cmd=True, record_tape=False)
            cmd.fwd_args = None  # kept by Warp only for APIC capture; it would pin the first call's arrays
            self._sites[key] = [cmd, dim, [signature(a) for a in args]]
        else:
            cmd, old_dim, signatures = site
            if dim != old_dim:
                cmd.set_dim(dim)
                site[1] = dim
            for i, arg in enumerate(args):
                sig = signature(arg)
                if sig is _REPACK or sig != signatures[i]:
                    cmd.set_param_at_index(i, arg)
                    signatures[i] = sig
        cmd.launch()
