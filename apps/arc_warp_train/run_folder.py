"""The output folder of a training run: the files a run writes, the rule that keeps one
run from destroying another's results, and the lock that keeps two runs out of one folder.

A run writes RESULTS and test_views/view_NNN.png, each atomically (a temporary in the
same folder renamed into place, see `arc_warp._src.files.write_atomically`), so after a
kill every one of them is a complete file, the old or the new version.

A folder that holds any of these files holds another run's results. A run refuses it
unless it is told what to do with them:

- ``--resume DIR/checkpoint.pt`` with ``-o DIR`` continues that run in place (its
  results are replaced as the run goes on);
- ``--overwrite`` deletes them first: RESULTS, the view_NNN.png images in test_views/
  (and test_views/ itself when that leaves it empty), and leftover temporaries of these
  files. Nothing else in the folder is touched.

The lock is ``LOCK_NAME`` in the folder, locked with flock(2) while the run lasts and
holding the owner's PID, host and start time for messages. The kernel drops an flock
when its owner exits or is killed, so a lock file left by a dead run (whose PID may
since have been reused by an unrelated process) is simply free: liveness is never
guessed from the PID. Where flock is missing (Windows, some network file systems) a run
warns that nothing keeps a second run out. Temporaries left by a killed run are deleted
when the next run takes the lock (no run of ours can be writing them then).
"""

import datetime
import errno
import json
import os
import socket
import sys

from arc_warp._src.files import temporary_target
from arc_warp.cli import prepare_output_dir

RESULTS = ("checkpoint.pt", "point_cloud.ply", "metrics.json", "psnr.png")
"""Files a run writes at the top of its output folder."""

VIEWS_DIR = "test_views"
"""Sub-folder of the labelled test-view images view_NNN.png."""

LOCK_NAME = ".arc-warp-train.lock"

_LEGACY_TEMPORARIES = ("checkpoint.pt.tmp",)  # written by versions before atomic writes


def view_image_name(index: int) -> str:
    return f"view_{index:03d}.png"


def _is_view_image(name: str) -> bool:
    return name.startswith("view_") and name.endswith(".png") and name[5:-4].isdigit()


def _views(folder) -> list:
    views = os.path.join(folder, VIEWS_DIR)
    return sorted(os.listdir(views)) if os.path.isdir(views) else []


def run_results(folder) -> list:
    """Paths, relative to `folder`, of the files a run writes that are present."""
    found = [name for name in RESULTS if os.path.isfile(os.path.join(folder, name))]
    return found + [os.path.join(VIEWS_DIR, name) for name in _views(folder)
                    if _is_view_image(name)]


def leftover_temporaries(folder) -> list:
    """Paths, relative to `folder`, of temporaries of the files a run writes (left by a
    killed run)."""
    top = [name for name in os.listdir(folder)
           if temporary_target(name) in RESULTS or name in _LEGACY_TEMPORARIES]
    return top + [os.path.join(VIEWS_DIR, name) for name in _views(folder)
                  if _is_view_image(temporary_target(name) or "")]


def _same_folder(a, b) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _check_results(folder, resume, overwrite, option) -> None:
    """ValueError unless a run told `resume` / `overwrite` may write into `folder`."""
    checkpoint = os.path.join(folder, "checkpoint.pt")
    in_place = resume is not None and os.path.isfile(resume) and os.path.isfile(checkpoint) \
        and os.path.samefile(resume, checkpoint)
    if overwrite and in_place:
        raise ValueError(f"--overwrite would delete {checkpoint}, which --resume reads; drop "
                         "--overwrite (resuming in place replaces the results as it goes)")
    found = run_results(folder)
    if not found or overwrite:
        return
    if resume is not None and _same_folder(os.path.dirname(resume) or ".", folder):
        return
    shown = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
    if resume is not None:
        source = os.path.dirname(resume) or "."
        raise ValueError(f"{option} {folder} holds another run's results ({shown}); --resume "
                         f"{resume} continues the run in {source}: pass {option} {source}, an "
                         "empty folder, or --overwrite to delete those results first")
    hint = f"--resume {checkpoint} to continue that run, " if os.path.isfile(checkpoint) else ""
    raise ValueError(f"{option} {folder} holds an earlier run's results ({shown}); pass {hint}"
                     "--overwrite to delete them first, or another folder")


def _try_flock(fd):
    """True when `fd` is now locked, False when another process holds the lock, None when
    this platform or file system has no flock."""
    try:
        import fcntl
    except ImportError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            return None
        raise
    return True


def _describe_holder(fd) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        owner = json.loads(os.read(fd, 4096).decode() or "{}")
        return f"PID {owner['pid']} on {owner['host']}, started {owner['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "owner not yet recorded"


class FolderLock:
    """The exclusive lock of one run on its output folder (see the module docstring);
    `release()` (or leaving a ``with`` block) removes the lock file and unlocks it."""

    def __init__(self, path: str, fd: int):
        self.path, self._fd = path, fd

    @classmethod
    def acquire(cls, folder, option: str = "-o") -> "FolderLock":
        """Lock `folder` (which must exist); ValueError naming the holder when another live
        process holds it."""
        path = os.path.join(folder, LOCK_NAME)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            locked = _try_flock(fd)
            if locked is False:
                holder = _describe_holder(fd)
                os.close(fd)
                raise ValueError(f"{option} {folder} is in use by another arc-warp run "
                                 f"({holder}); wait for it to end, or pick another folder")
            if locked is None:
                print(f"warning: {option} {folder}: this file system cannot lock files, so "
                      "nothing stops a second run from writing into the folder at the same "
                      "time; make sure none does", file=sys.stderr)
                break
            # The owner removes the file before unlocking it: if it did so between our open
            # and our flock, we hold a lock on a file nobody else will see. Start again.
            try:
                current = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:
                current = False
            if current:
                break
            os.close(fd)
        owner = {"pid": os.getpid(), "host": socket.gethostname(),
                 "started": datetime.datetime.now().isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(owner).encode())
        return cls(path, fd)

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.remove(self.path)  # still locked: no other process holds this file
        except OSError:  # gone already, or (without flock) not removable while open
            pass
        os.close(self._fd)
        self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def check_output_folder(folder, resume=None, overwrite: bool = False,
                        option: str = "-o") -> None:
    """Fail early (ValueError, one line naming `option` and what to do) when a run could not
    claim `folder` now: unwritable, in use by another run, or holding another run's results
    that neither `resume` nor `overwrite` accounts for. Changes nothing in the folder but
    creating it."""
    prepare_output_dir(folder, option)
    FolderLock.acquire(folder, option).release()
    _check_results(folder, resume, overwrite, option)


def claim_output_folder(folder, resume=None, overwrite: bool = False,
                        option: str = "-o") -> FolderLock:
    """Take `folder` for a run: create it, lock it, check it as `check_output_folder` does,
    delete leftover temporaries, and with `overwrite` delete the results of the earlier
    run (only the files a run writes). Returns the lock; release it when the run ends."""
    prepare_output_dir(folder, option)
    lock = FolderLock.acquire(folder, option)
    try:
        _check_results(folder, resume, overwrite, option)
        doomed = leftover_temporaries(folder) + (run_results(folder) if overwrite else [])
        for name in doomed:
            os.remove(os.path.join(folder, name))
        views = os.path.join(folder, VIEWS_DIR)
        if overwrite and os.path.isdir(views) and not os.listdir(views):
            os.rmdir(views)
    except BaseException:
        lock.release()
        raise
    return lock
