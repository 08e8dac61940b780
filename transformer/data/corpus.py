"""Where training text comes from. Nothing is downloaded.

- `stdlib`: the `.py` sources of this Python's standard library, read in sorted path order:
  real text that every machine running this project already has.
- a path: a text file, or every UTF-8 text file under a folder (sorted; binary files skipped).

Synthetic tasks (copy, random) need no text; they live in `batches.py`.
"""

from __future__ import annotations

import dataclasses
import os
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


class Text(str):
    """The corpus text, with `read`: what reading it found (`Read`)."""
    read: Read


@dataclasses.dataclass(frozen=True)
class Read:
    """How much text came from how many files, and what was left out."""
    bytes: int
    files: int
    skipped: int          # binary (a NUL byte, not UTF-8) or unreadable files
    unused: int | None    # files never read because max_bytes was reached (None: not counted)
    max_bytes: int
    full: bool            # max_bytes was reached: the text was cut there

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
        return ", ".join(parts)


def read_corpus(corpus: str, max_bytes: int) -> Text:
    """The text of `corpus` ('stdlib' or a path), at most max_bytes of UTF-8; its `read`
    says how much came from how many files and what was skipped or left unused."""
    if corpus == "stdlib":
        files, name = stdlib_files(), "the Python standard library"
    else:
        path = Path(corpus).expanduser()
        if not path.exists():
            raise CorpusError(f"data.corpus={corpus!r}: no such file or folder "
                              "(give a text file, a folder of text files, or stdlib/copy/random)")
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        name = str(path)
    parts, size, skipped, unused, full = [], 0, 0, 0, False
    for index, file in enumerate(files):
        if size >= max_bytes:
            full = True
            unused = len(files) - index if isinstance(files, list) else None
            break
        try:
            with open(file, "rb") as f:  # only what fits (and a byte to tell it was cut):
                data = f.read(max_bytes - size + 1)  # a 50 GB file is not read whole
        except OSError:
            skipped += 1
            continue
        raw = data[: max_bytes - size]
        full = full or len(raw) < len(data)
        text = None if b"\0" in raw else _decode_prefix(raw)
        if text is None:
            skipped += 1
            continue
        parts.append(text)
        size += len(text.encode("utf-8"))
    text = Text("".join(parts))
    if not text.strip():
        what = "holds no UTF-8 text" if skipped else "is empty"
        raise CorpusError(f"data.corpus={corpus!r}: {name} {what}")
    text.read = Read(size, len(parts), skipped, unused, max_bytes, full)
    return text


def _decode_prefix(raw: bytes):
    """Decodes raw, allowing only its last character to be cut short (by max_bytes)."""
    for cut in range(0, min(4, len(raw) + 1)):
        try:
            return raw[: len(raw) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return None


def describe(corpus: str, read: Read | None = None) -> str:
    """The corpus for the run's data: line, with how much was read when `read` is given."""
    name = "Python standard library sources" if corpus == "stdlib" else os.fspath(corpus)
    return f"{name} ({read.describe()})" if read else name
