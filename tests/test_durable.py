"""Writes of the user's data survive a power loss (transformer/data/durable.py): the file is on
disk before the rename that names it, and the rename is on disk after (its folder fsynced).
prepare's folder is checked in test_prepare.py; a sweep's state here."""

import os

from transformer.data import durable
from transformer.scaling import sweep


def record(monkeypatch):
    events, fsync, replace = [], os.fsync, os.replace

    def recording_fsync(fd):
        events.append(("fsync", os.path.realpath(os.readlink(f"/proc/self/fd/{fd}"))))
        fsync(fd)

    def recording_replace(a, b):
        events.append(("replace", os.path.realpath(a), os.path.realpath(b)))
        replace(a, b)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "replace", recording_replace)
    return events


def test_write_atomic_syncs_the_file_before_the_rename_and_its_folder_after(tmp_path,
                                                                            monkeypatch):
    for write in (durable.write_atomic, sweep.write_atomic):  # a sweep's state: sweep.json ...
        events = record(monkeypatch)
        path = tmp_path / "sweep.json"
        write(path, '{"a": 1}\n')
        assert path.read_text() == '{"a": 1}\n'
        [(at, tmp)] = [(i, e[1]) for i, e in enumerate(events) if e[0] == "replace"]
        assert ("fsync", tmp) in events[:at]
        assert ("fsync", os.path.realpath(tmp_path)) in events[at:]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.json"]
        monkeypatch.undo()
