"""Prepared kernel launches: each launch site of an object recorded once and run again.

A renderer or a mesh op launches the same kernels with mostly the same arguments on every
call. ``wp.launch`` checks and packs every argument each time (about 25 us of host time
for a dozen arguments); a recorded ``wp.Launch`` (``record_cmd=True``) runs again in a
few, and :meth:`Launches.launch` repacks only the arguments whose pointer, shape,
strides or value changed, and keeps, per argument, the packing before the last one, so
an argument that alternates between two buffers (a loop's outputs, while the previous
step's are still held) is not repacked either. This is the one place where the pointers
of a call's arrays are compared with the previous calls'. An argument given as a
:class:`View` (an array's memory as another dtype and shape, as the mesh ops read
nvdiffrast's float32 layouts) is made into a Warp array only when it is packed, so a
call on the memory of one of the two calls before makes none.
"""

from __future__ import annotations

from typing import NamedTuple

import warp as wp

_REPACK = object()  # the signature of an argument that is always repacked (structs, vectors)


class View(NamedTuple):
    """A launch argument: contiguous ``array``'s memory as a ``shape`` array of ``dtype``."""

    array: wp.array
    dtype: type
    shape: tuple

    def make(self) -> wp.array:
        """The Warp view (non-owning: the caller keeps ``array`` alive through the launch)."""
        return wp.array(ptr=self.array.ptr, dtype=self.dtype, shape=self.shape, device=self.array.device)


def made(arg):
    """A launch argument as ``wp.launch`` takes it (a :class:`View` made)."""
    return arg.make() if type(arg) is View else arg


def signature(arg):
    """What must be unchanged for a packed launch argument to be reused."""
    if type(arg) is View:
        return (arg.array.ptr, arg.dtype, arg.shape)
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
        self._sites: dict = {}  # key -> [wp.Launch, dim, argument signatures, previous (signature, ctype)s]

    def launch(self, kernel, dim, args: list, block_dim: int | None = None, key=None) -> None:
        """``wp.launch(kernel, dim, inputs=args, block_dim=block_dim)`` on the device's
        current stream, off any tape. ``key`` (default: the kernel) names the launch site
        where one kernel is launched at several places of a call (per camera, say)."""
        if dim == 0:
            return  # Warp records no command for an empty launch
        if not self.record:
            wp.launch(kernel, dim=dim, inputs=[made(a) for a in args], device=self.device, block_dim=block_dim,
                      record_tape=False)
            return
        key = kernel if key is None else key
        site = self._sites.get(key)
        if site is None:
            cmd = wp.launch(kernel, dim=dim, inputs=[made(a) for a in args], device=self.device, block_dim=block_dim,
                            record_cmd=True, record_tape=False)
            cmd.fwd_args = None  # kept by Warp only for APIC capture; it would pin the first call's arrays
            self._sites[key] = [cmd, dim, [signature(a) for a in args], [None] * len(args)]
        else:
            cmd, old_dim, signatures, previous = site
            if dim != old_dim:
                cmd.set_dim(dim)
                site[1] = dim
            for i, arg in enumerate(args):
                sig = signature(arg)
                if sig is _REPACK or sig != signatures[i]:
                    if type(sig) is not tuple:  # a value, or always repacked
                        cmd.set_param_at_index(i, made(arg))
                    else:  # an array: the packing before the last one, or a new one
                        last, before = (signatures[i], cmd.params[i + 1]), previous[i]
                        if before is not None and before[0] == sig:
                            cmd.set_param_at_index_from_ctype(i, before[1])
                        else:
                            cmd.set_param_at_index(i, made(arg))
                        previous[i] = last
                    signatures[i] = sig
        cmd.launch()
