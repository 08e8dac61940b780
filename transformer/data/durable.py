"""Writes of the user's data that survive a power loss, not only a killed process.

A rename is atomic for every process on the machine, so a SIGKILL mid-write leaves the old
file or the new one. After a power loss it may leave neither: the kernel writes data and
directory entries back in its own order, so the new name can reach the disk before the file's
contents (an empty or short file under the new name). fsync of the file before the rename,
and of its folder after, puts them on disk in that order (ext4, XFS: the rename is then
durable too). Used for manifests, prepared folders (prepare.py) and a sweep's state.

    write_atomic(path, text)     # a small file: temporary beside it, fsync, rename, fsync folder
    sync_tree(folder)            # every file directly in folder, then folder itself
    sync(path)                   # one file or folder
"""

from __future__ import annotations

import os
from pathlib import Path


def sync(path) -> None:
    """fsync of one file or folder (a folder is opened read-only, as Linux allows)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_tree(folder) -> None:
    """Every file directly in `folder`, then `folder` (its entries) itself."""
    for path in Path(folder).iterdir():
        if path.is_file():
            sync(path)
    sync(folder)


def write_atomic(path, text: str) -> None:
    """Writes `text` to `path` so that a reader, a killed process or a power loss sees the old
    file or the new one, never half of it. The temporary name carries the process id: several
    processes may write beside each other (a sweep's members)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    sync(path.parent)
