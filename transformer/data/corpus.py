"""Where training text comes from, and what a run read of it. Nothing is downloaded.

- `stdlib`: the `.py` sources of this Python's standard library, read in sorted path order:
  real text that every machine running this project already has.
- a path: a text file, or every file under a folder (sorted; binary files skipped).

Reading and tokenizing them is cache.py's (a corpus named directly) and prepare.py's.
Synthetic tasks (copy, random) need no text; they live in `batches.py`.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import sysconfig
from collections.abc import Iterator
from pathlib import Path


class CorpusError(ValueError):
    """A corpus that is missing, empty or not text."""


def stdlib_files() -> Iterator[Path]:
    """The standard library's .py files in sorted order of their paths under its root, found
    lazily: a run that reads its first few MB lists only the folders it reads (listing and
    sorting all ~1,800 of them first took 0.7-1.2 s on a 2-core AMD EPYC; now 0.01-0.04 s)."""
    yield from _sorted_py_files(Path(sysconfig.get_paths()["stdlib"]))


def _sorted_py_files(folder: Path) -> Iterator[Path]:
    # Folder "x" sorts as "x/": the order of the relative paths as strings ("x.py" < "x/a.py"
    # < "x_y.py"). Installed packages are not the standard library; links to folders are
    # not followed.
    entries = []
    for entry in os.scandir(folder):
        if entry.is_dir(follow_symlinks=False):
            if entry.name not in ("site-packages", "dist-packages"):
                entries.append((entry.name + "/", Path(entry.path)))
        elif entry.name.endswith(".py") and entry.is_file():
            entries.append((entry.name, Path(entry.path)))
    for key, path in sorted(entries):
        if key.endswith("/"):
            yield from _sorted_py_files(path)
        else:
            yield path


@dataclasses.dataclass(frozen=True)
class Read:
    """How much text came from how many files, and what was left out."""
    bytes: int
    files: int
    skipped: int          # binary (a NUL byte, not UTF-8) or unreadable files
    unused: int | None    # files never read because max_bytes was reached (None: not counted)
    max_bytes: int
    full: bool            # max_bytes was reached: the text was cut there
    bad_records: int = 0  # JSON Lines records and Parquet rows without a text, left out

    def describe(self) -> str:
        amount = f"{self.bytes / 1e6:.2f} MB" if self.bytes >= 100_000 else \
            f"{self.bytes / 1e3:.1f} KB"
        parts = [f"{amount} of text from {self.files:,} "
                 f"file{'s' if self.files != 1 else ''}"]
        if self.full:
            rest = ("" if self.unused == 0 else "; the rest of the standard library unused"
                    if self.unused is None else f"; {self.unused:,} more files unused")
            parts.append(f"data.max_bytes={self.max_bytes:,} reached{rest}")
        if self.skipped:
            parts.append(f"{self.skipped:,} binary or unreadable files skipped")
        if self.bad_records:
            parts.append(f"{self.bad_records:,} records without a text left out")
        return ", ".join(parts)


def describe(corpus: str, read: Read | None = None) -> str:
    """The corpus for the run's data: line, with how much was read when `read` is given. The
    standard library is this Python's: another version's is another text (the quick start's
    val_bpb was 1.66 on 3.13.0's, 1.68 on 3.11.7's), so the line names the version."""
    name = (f"Python {platform.python_version()} standard library sources" if corpus == "stdlib"
            else os.fspath(corpus))
    return f"{name} ({read.describe()})" if read else name
