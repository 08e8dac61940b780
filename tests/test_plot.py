"""Loss curves of several workdirs into one PNG, through the command line."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from transformer.scaling import plot

ROOT = Path(__file__).resolve().parents[1]


def _fake_run(workdir: Path, scale: float, tokens: bool = True):
    workdir.mkdir(parents=True)
    lines = []
    for step in range(10, 101, 10):
        extra = {"tokens": step * 512} if tokens else {}
        lines.append({"step": step, **extra, "train_loss": scale / step ** 0.2,
                      "tokens_per_s": 1000.0})
        if step % 50 == 0:
            lines.append({"step": step, **extra, "val_loss": scale / step ** 0.2 + 0.1})
    (workdir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_read_curves_splits_train_and_val(tmp_path):
    _fake_run(tmp_path / "a", 5.0)
    curves = plot.read_curves(tmp_path / "a")
    steps, tokens, losses = curves["train"]
    assert len(steps) == 10 and np.array_equal(tokens, steps * 512)
    assert np.all(np.diff(losses) < 0)
    assert list(curves["val"][0]) == [50, 100]


def test_plot_cli_writes_one_png_for_many_runs(tmp_path):
    _fake_run(tmp_path / "a", 5.0)
    _fake_run(tmp_path / "b", 4.0, tokens=False)  # an older run: plotted against steps only
    out = tmp_path / "curves.png"
    from tests.conftest import fork_run
    result = fork_run("-m", "transformer", "plot", tmp_path / "a", tmp_path / "b", f"--out={out}",
                      cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert out.read_bytes()[:4] == b"\x89PNG" and out.stat().st_size > 10_000
    assert str(out) in result.stdout


def test_plot_cli_refuses_a_folder_without_metrics(tmp_path):
    from tests.conftest import fork_run
    result = fork_run("-m", "transformer", "plot", tmp_path, cwd=ROOT, timeout=300)
    assert result.returncode == 2 and "no metrics.jsonl" in result.stderr


def test_plot_cli_with_an_out_that_cannot_be_written_is_one_error_line(tmp_path):
    from tests.conftest import fork_run
    _fake_run(tmp_path / "a", 5.0)
    (tmp_path / "file").write_text("x")
    for out in (tmp_path / "file" / "curves.png", tmp_path / "a"):
        result = fork_run("-m", "transformer", "plot", tmp_path / "a", f"--out={out}", cwd=ROOT,
                          timeout=300)
        assert result.returncode == 2, result.stderr[-2000:]
        assert result.stderr.startswith("error: --out=")
        assert len(result.stderr.strip().splitlines()) == 1


def test_labels_name_each_run():
    assert plot.labels_for(["runs/a", "runs/b"]) == ["a", "b"]
    assert plot.labels_for(["x/run", "y/run"]) == ["x/run", "y/run"]


def test_sweep_curves_read_at_5_and_at_50_runs_without_layout_warnings(tmp_path):
    """Coloured by size with a colour bar (no 100-entry legend squashing the plots), and no
    'Tight layout not applied' warning."""
    import warnings
    for n in (5, 50):
        runs = [tmp_path / f"{n}" / f"L{i}" for i in range(n)]
        for i, run in enumerate(runs):
            _fake_run(run, 6.0 - 3.0 * i / n)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = plot.plot_runs(runs, tmp_path / f"sweep{n}.png", title=f"sweep of {n}",
                                 color_by=[1e4 * 1.2 ** i for i in range(n)],
                                 color_label="non-embedding parameters N")
        assert not [str(w.message) for w in caught]
        assert out.read_bytes()[:4] == b"\x89PNG"


def test_plot_defaults_into_the_run_folder_per_step_and_offers_bits_per_byte(tmp_path):
    _fake_run(tmp_path / "a", 5.0)
    lines = (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()
    with_bpb = [json.loads(x) for x in lines]
    for x in with_bpb:
        if "val_loss" in x:
            x["val_bpb"] = x["val_loss"] / np.log(2)
    (tmp_path / "a" / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in with_bpb))
    _fake_run(tmp_path / "b", 4.0)
    for args, want in (([str(tmp_path / "a")], tmp_path / "a" / "loss_curves_step100.png"),
                       ([str(tmp_path / "a"), str(tmp_path / "b"), "--metric=val_bpb"],
                        tmp_path / "val_bpb_curves_a+b.png")):
        result = subprocess.run([sys.executable, "-m", "transformer", "plot", *args], cwd=tmp_path,
                                env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        assert want.is_file() and str(want) in result.stdout
        assert not list(tmp_path.glob("loss_curves.png"))  # nothing in the current folder
    assert plot.read_curves(tmp_path / "a", "val_bpb")["train"][0].size == 0
    assert list(plot.read_curves(tmp_path / "a", "val_bpb")["val"][2]) == \
        [x["val_bpb"] for x in with_bpb if "val_bpb" in x]
