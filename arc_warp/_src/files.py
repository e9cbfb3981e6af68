"""Atomic file replacement: write under a temporary name, then rename into place.

A reader (or a process started after a kill) sees either the previous complete file or
the new complete one, never a partial file: the data is written to a unique temporary
``.<name>.<8 hex digits>.tmp`` in the target's folder (same file system, so the rename is
atomic), flushed to disk, and moved over the target with ``os.replace``. A writer killed
before the rename leaves only such a temporary behind; `temporary_target` recognises it.
"""

import contextlib
import os
import re
import secrets

_TEMPORARY = re.compile(r"^\.(?P<target>.+)\.[0-9a-f]{8}\.tmp$")


def temporary_target(name: str):
    """The file name a temporary of `write_atomically` was written for, or None when `name`
    (a base name) is not such a temporary."""
    match = _TEMPORARY.match(name)
    return match.group("target") if match else None


def _fsync_folder(folder: str) -> None:
    # Makes the rename itself durable; some platforms and file systems cannot open a
    # folder for this, which only weakens durability after a power loss, not atomicity.
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def write_atomically(path):
    """Context manager yielding a temporary path to write `path`'s new content to; when the
    block succeeds the temporary is flushed to disk and renamed over `path`, and when it
    raises the temporary is removed and `path` is left untouched.

    The temporary is created with the usual permissions (0o666 less the umask), so the
    renamed file has the permissions a plain ``open(path, "w")`` would have given it."""
    path = os.fspath(path)
    folder, name = os.path.split(os.path.abspath(path))
    while True:
        tmp = os.path.join(folder, f".{name}.{secrets.token_hex(4)}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            break
        except FileExistsError:
            continue
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    _fsync_folder(folder)
