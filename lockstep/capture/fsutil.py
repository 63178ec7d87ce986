"""Atomic publication of a directory: write under a hidden temporary name, fsync, rename.

A reader sees either the previous complete directory or the new complete one, never a part:
the files are fsynced before the directory is renamed into place, and the parent is fsynced
after, so a crash at any point leaves the previous one intact (and at worst a hidden
``.NAME.partial-ID`` directory that the next publication of NAME removes).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import glob
import os
import shutil

PARTIAL = ".partial-"
_RENAME_EXCHANGE = 2


def partial_path(path: str, save_id: str) -> str:
    parent, name = os.path.split(os.path.abspath(path))
    return os.path.join(parent, f".{name}{PARTIAL}{save_id}")


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` through ``path.tmp``: fsynced, then renamed."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)


def _exchange(a: str, b: str) -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    at_fdcwd = -100
    if libc.renameat2(at_fdcwd, a.encode(), at_fdcwd, b.encode(), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), a)


def publish_dir(partial: str, path: str, *, overwrite: bool) -> None:
    """Rename the complete directory ``partial`` to ``path`` (fsyncing around it).

    With ``overwrite``, an existing ``path`` is swapped out atomically (``renameat2`` with
    ``RENAME_EXCHANGE``) and then deleted; without it, an existing non-empty ``path`` is an error.
    """
    fsync_dir(partial)
    parent = os.path.dirname(os.path.abspath(path))
    try:
        os.rename(partial, path)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not overwrite:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                raise FileExistsError(errno.EEXIST, f"a checkpoint already exists at {path} (pass overwrite=True to replace it)", path) from exc
            raise
        _exchange(partial, path)
        fsync_dir(parent)
        shutil.rmtree(partial, ignore_errors=True)
    fsync_dir(parent)


def publish_into(partial: str, path: str, *, markers: tuple[str, ...]) -> None:
    """Move the files of the complete directory ``partial`` into the existing directory ``path``.

    For a directory another program owns and writes files of its own to. Not one atomic step:
    the ``markers`` (the files that say "complete") of an earlier publication are removed first,
    the other files moved in and made durable, then the markers, in order, each made durable
    before the next; a reader that looks for the markers never sees them beside missing data.
    """
    for name in markers:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(path, name))
    fsync_dir(path)
    for name in sorted(set(os.listdir(partial)) - set(markers)):
        os.rename(os.path.join(partial, name), os.path.join(path, name))
    for name in markers:
        fsync_dir(path)
        os.rename(os.path.join(partial, name), os.path.join(path, name))
    fsync_dir(path)
    os.rmdir(partial)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def remove_stale_partials(path: str) -> list[str]:
    """Delete leftovers of interrupted publications of ``path``; returns what was removed."""
    parent, name = os.path.split(os.path.abspath(path))
    removed = []
    for stale in glob.glob(os.path.join(glob.escape(parent), f".{glob.escape(name)}{PARTIAL}*")):
        shutil.rmtree(stale, ignore_errors=True)
        removed.append(stale)
    return removed
