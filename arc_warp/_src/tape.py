"""The ``wp.Tape`` of an enclosing ``with tape:`` block, for ops that record hand-written backwards."""

import warp as wp


def active_tape() -> wp.Tape | None:
    """The tape of an enclosing ``with tape:`` block, or None. Warp 1.19 has no public
    getter, so this is the one place in arc_warp that reads its runtime."""
    return wp._src.context.runtime.tape
