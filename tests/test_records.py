"""docs/records/: dated measurements as data, and docs/records.md rendered from them."""

import importlib.metadata
import json
import platform

import pytest

from transformer.lab import records


def test_records_md_is_current():
    """docs/records.md is what `python -m transformer.lab.records` renders today."""
    assert records.PAGE.read_text(encoding="utf-8") == records.render(), \
        "docs/records.md is stale: run python -m transformer.lab.records"


def test_every_kind_has_records_in_the_schema():
    for kind in records.KINDS:
        rows = records.read(records.FOLDER / f"{kind}.jsonl")  # raises on a bad line
        assert rows, kind


def test_check_fails_on_a_stale_page(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "records"
    rec = records.record({"cpu": "x", "cores": 2}, "python train.py", [0], {"val_loss": 1.5},
                         "n", date="2026-01-02")
    records.append(folder / "suite.jsonl", rec)
    monkeypatch.setattr(records, "FOLDER", folder)
    monkeypatch.setattr(records, "PAGE", tmp_path / "records.md")
    # main() also rewrites docs/accelerators.md's table: a copy here, never the project's page
    (tmp_path / "accelerators.md").write_text(records.ACCELERATORS.read_text())
    monkeypatch.setattr(records, "ACCELERATORS", tmp_path / "accelerators.md")
    assert records.main(["--check"]) == 1  # no page yet
    assert records.main([]) == 0
    assert records.main(["--check"]) == 0
    records.append(folder / "suite.jsonl", rec)  # a planted new record: the page is stale
    assert records.main(["--check"]) == 1
    assert "stale" in capsys.readouterr().err


def test_append_writes_one_line_in_the_schema_and_refuses_others(tmp_path):
    path = tmp_path / "bench.jsonl"
    rec = records.record({"cpu": "x", "cores": 2}, "python -m transformer bench", [0],
                         {"tokens_per_s": 100.0})
    records.append(path, rec)
    records.append(path, rec)
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0]) == rec
    assert list(rec) == list(records.KEYS) and rec["date"][:4].isdigit()
    # the versions that made the figure: the quick start's text is this Python's library
    assert rec["machine"]["python"] == platform.python_version()
    assert rec["machine"]["jax"] == importlib.metadata.version("jax")
    for bad in ({**rec, "result": {"nested": {"a": 1}}}, {**rec, "date": "today"},
                {k: v for k, v in rec.items() if k != "seeds"}):
        with pytest.raises(ValueError):
            records.append(path, bad)
    assert len(path.read_text().splitlines()) == 2
