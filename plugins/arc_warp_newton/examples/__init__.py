"""Runnable examples of arc_warp_newton (``python -m arc_warp_newton.examples.<name>``)."""
