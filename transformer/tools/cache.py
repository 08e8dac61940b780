"""`python -m transformer cache`: the data cache, listed or cleared.

    python -m transformer cache            where it is, and each prepared set in it
    python -m transformer cache --clear    delete every set in it (safe: prepared again on use;
                                           a set a live process is writing is left alone)

A corpus named directly (`data.corpus=stdlib`, a file, a folder) is prepared on first use into
this cache and read from it afterwards (transformer/data/cache.py, docs/data.md). Deleting a set
loses nothing: a checkpoint keeps its tokenizer, and the next run that needs the set prepares
the same tokens again.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil

from absl import flags

from transformer import cli
from transformer.data import cache

_CLEAR = flags.DEFINE_bool("clear", False, "Delete every prepared set in the cache.")


def sets() -> list[dict]:
    """The cache's prepared sets (complete or not): folder, bytes on disk, and from the
    manifest what they hold."""
    folder = cache.root() / "prepared"
    out = []
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        if not path.is_dir():
            continue
        size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        try:
            manifest = json.loads((path / "manifest.json").read_text())
        except (OSError, ValueError):
            manifest = None  # a prepare that was cut short (.name.partial-*), or damaged
        out.append({"path": path, "bytes": size, "manifest": manifest})
    return out


def _being_written(path) -> bool:
    """A temporary folder (.NAME.partial-PID-*) whose process still runs on this host."""
    m = re.match(r"\..*\.partial-(\d+)-", path.name)
    if not m:
        return False
    try:
        os.kill(int(m.group(1)), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def describe(entry: dict) -> str:
    m, mb = entry["manifest"], entry["bytes"] / 1e6
    if m is None:
        what = ("being prepared now" if _being_written(entry["path"])
                else "incomplete: never read; --clear deletes it")
        return f"  {entry['path'].name}  {mb:,.1f} MB  ({what})"
    tokens = sum(s["tokens"] for s in m["splits"].values())
    made = datetime.datetime.fromtimestamp(entry["path"].stat().st_mtime).strftime("%Y-%m-%d %H:%M")
    return (f"  {entry['path'].name}  {mb:,.1f} MB  {tokens:,} tokens, "
            f"{m['tokenizer']['kind']} vocabulary {m['tokenizer']['vocab_size']:,}, "
            f"from {' '.join(m.get('inputs') or ['?'])}, made {made}")


def _sets(n: int) -> str:
    return f"{n} prepared set{'' if n == 1 else 's'}"


def main(argv) -> None:
    if len(argv) > 1:
        cli.fail(f"unexpected arguments {argv[1:]}: flags look like --name=value")
    root, found = cache.root(), sets()
    total = sum(e["bytes"] for e in found) / 1e6
    if _CLEAR.value:
        gone = [e for e in found if not _being_written(e["path"])]
        for entry in gone:
            shutil.rmtree(entry["path"], ignore_errors=True)
        freed = sum(e["bytes"] for e in gone) / 1e6
        print(f"{root / 'prepared'}: deleted {_sets(len(gone))} ({freed:,.1f} MB)"
              + (f"; {len(found) - len(gone)} being prepared now left alone"
                 if len(gone) < len(found) else ""))
        return
    print(f"data cache: {root / 'prepared'} ({_sets(len(found))}, {total:,.1f} MB; "
          "TRANSFORMER_CACHE moves it; --clear deletes them)")
    for entry in found:
        print(describe(entry))


if __name__ == "__main__":
    cli.run(main)
