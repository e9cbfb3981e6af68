"""Files written whole or not at all: ``write_atomically`` (a temporary in the target's
folder, renamed over it) and ``temporary_target`` (what a leftover temporary was for)."""

from ._src.files import temporary_target, write_atomically

__all__ = ["temporary_target", "write_atomically"]
