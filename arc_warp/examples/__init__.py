"""Runnable examples of the core (Warp + numpy only).

``arc_adjoint_*``: ordinary differentiable Warp kernels whose ``wp.Tape`` backward runs
once with Warp's generated adjoint and once with :func:`arc_warp.arc_adjoint` in each
mode; ``python -m arc_warp.examples.arc_adjoint_p2g`` (``_cloth``, ``_splat``) prints
how far each mode's gradients are from Warp's.
"""
