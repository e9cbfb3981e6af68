"""Runnable examples of arc_warp_torch (``python -m arc_warp_torch.examples.<name>``)."""
