"""transformer/lab/speedrun_rows.py: a row's seeds read back from its runs, Welch's test,
the twin rows that share their runs, and one-line refusals. (The table's figures against
the records: tests/test_docs.py.)"""

import json
import math

import pytest

from transformer.lab import speedrun_rows as sr


def _fake_run(workdir, steps, val_bpb, train_s=60.0, finished=True):
    workdir.mkdir(parents=True)
    lines = [{"step": 150, "val_loss": 4.0, "val_bpb": 2.0},
             {"step": steps, "val_loss": 3.4, "val_bpb": val_bpb}]
    (workdir / "metrics.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n")
    log = f"step {steps}: val_loss 3.4\n"
    if finished:
        log += f"trained steps 0..{steps} in {train_s}s (evaluation 2.9s of it)\n"
    (workdir / "train.log").write_text(log)


def test_a_finished_run_reads_as_nats_per_byte_and_an_unfinished_one_as_none(tmp_path):
    _fake_run(tmp_path / "a", 880, 1.6777, 64.4)
    got = sr.finished(tmp_path / "a")
    assert got == {"val_loss": pytest.approx(1.6777 * math.log(2)), "steps": 880,
                   "train_s": 64.4}
    _fake_run(tmp_path / "b", 880, 1.6777, finished=False)  # killed before its last line
    assert sr.finished(tmp_path / "b") is None
    _fake_run(tmp_path / "c", 880, 1.6777)  # the evaluation at the last step is missing
    (tmp_path / "c" / "metrics.jsonl").write_text('{"step": 150, "val_bpb": 2.0}\n')
    assert sr.finished(tmp_path / "c") is None


def test_welch_is_one_sided_with_unequal_variances():
    a, b = [1.16, 1.17, 1.165], [1.20, 1.25, 1.30]
    ma, mb = sum(a) / 3, sum(b) / 3
    va = sum((x - ma) ** 2 for x in a) / 2
    vb = sum((x - mb) ** 2 for x in b) / 2
    t = (ma - mb) / math.sqrt(va / 3 + vb / 3)
    dof = (va / 3 + vb / 3) ** 2 / ((va / 3) ** 2 / 2 + (vb / 3) ** 2 / 2)
    from scipy import stats
    assert sr.welch_less(a, b) == pytest.approx(stats.t.cdf(t, dof), rel=1e-9)
    # Pooled variances (Student's test) give another figure here: the test above tells them apart.
    pooled = stats.ttest_ind(a, b, alternative="less").pvalue
    assert abs(pooled - sr.welch_less(a, b)) > 1e-3
    assert sr.welch_less(b, a) == pytest.approx(1 - sr.welch_less(a, b))  # one-sided
    assert sr.welch_less([1.0], b) is None


def test_cells_quote_the_records_and_p_against_the_vs_row():
    recs = {"1": {"seeds": [0, 1, 2], "result": {"val_loss_seed0": 1.5, "val_loss_seed1": 1.52,
                                                 "val_loss_seed2": 1.51}},
            "2": {"seeds": [0, 1, 2], "result": {"val_loss_seed0": 1.40, "val_loss_seed1": 1.43,
                                                 "val_loss_seed2": 1.41}}}
    got = sr.cells({"#": "2", "vs": "1"}, recs)
    assert got["seeds"] == "0, 1, 2" and got["val loss"] == "1.4133"
    assert got["spread"] == "0.0300"
    assert got["p"] == f"{sr.welch_less([1.40, 1.43, 1.41], [1.5, 1.52, 1.51]):.2g}"
    assert sr.cells({"#": "1", "vs": ""}, recs)["p"] == "—"


def test_a_row_with_another_rows_command_reads_its_runs(tmp_path, monkeypatch, capsys):
    rows = [{"#": "11", "command": "python train.py --x", "vs": "",
             "change over the row above": "a"},
            {"#": "12", "command": "python train.py --x", "vs": "11",
             "change over the row above": "a code change"}]
    monkeypatch.setattr(sr, "table", lambda: rows)
    for seed, bpb in ((0, 1.70), (1, 1.71)):
        _fake_run(tmp_path / f"row11-s{seed}", 540, bpb)
    ran = []
    monkeypatch.setattr(sr, "run", lambda *a: ran.append(a))
    assert sr.main(["--rows=12", "--seeds=0,1", f"--work={tmp_path}"]) == 0
    assert ran == []  # nothing trained: row 11's runs are row 12's
    assert "row 12: 1.1818" in capsys.readouterr().out  # mean of 1.70, 1.71 bits x ln 2


def test_refusals_are_one_line(capsys):
    assert sr.main(["--rows=99"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --rows: no row 99") and err.count("\n") == 1
    assert sr.main(["--rows=18", "--seeds=a"]) == 2
    assert capsys.readouterr().err.startswith("error: --seeds=a")
