"""Sweeps, fits and the report: power-law fits recover known constants; a tiny 3-size sweep
runs end to end through the command line and a rerun skips what finished."""

import copy
import itertools
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from transformer.config import ConfigError, base_config
from transformer.scaling import fit
from transformer.scaling import report as report_lib
from transformer.scaling import sweep as scaling

ROOT = Path(__file__).resolve().parents[1]


def test_power_law_fit_recovers_known_constants():
    rng = np.random.default_rng(0)
    N = np.geomspace(1e4, 1e7, 8)
    loss = 1.5 + 50.0 * N ** -0.3 + rng.normal(0, 0.005, N.shape)
    f = fit.power_law(N, loss)
    assert abs(f["alpha"] - 0.3) < 0.02 and abs(f["E"] - 1.5) < 0.05
    assert abs(f["A"] / 50.0 - 1) < 0.15
    for name in ("E", "A", "alpha"):  # the truth lies within a few standard errors
        assert 0 < f[f"{name}_err"] < np.inf
        assert abs(f[name] - {"E": 1.5, "A": 50.0, "alpha": 0.3}[name]) < 4 * f[f"{name}_err"]


def test_two_term_fit_recovers_known_constants():
    rng = np.random.default_rng(1)
    N = np.repeat(np.geomspace(1e5, 1e8, 5), 3)
    D = np.tile(np.geomspace(1e7, 1e10, 3), 5)
    loss = 1.7 + 400 * N ** -0.34 + 410 * D ** -0.28 + rng.normal(0, 0.003, N.shape)
    f = fit.power_law_nd(N, D, loss)
    assert abs(f["alpha"] - 0.34) < 0.03 and abs(f["beta"] - 0.28) < 0.03
    assert abs(f["E"] - 1.7) < 0.05
    assert np.allclose(fit.predict(f, N, D), loss, atol=0.02)


def test_fits_refuse_too_few_points():
    assert fit.power_law([1e4, 1e5], [3.0, 2.5]) is None
    assert fit.power_law_nd([1e4, 1e5, 1e6], [1e6] * 3, [3.0, 2.5, 2.2]) is None
    f = fit.power_law([1e4, 1e5, 1e6], [3.0, 2.5, 2.3])  # exact: no error estimate
    assert np.isnan(f["alpha_err"]) and f["rmse"] < 1e-6


def test_an_exponent_the_losses_do_not_determine_is_not_given_an_error_of_zero():
    """Losses that rise with N (or do not move) fit A = 0, where any alpha fits as well: the
    report printed alpha = 0.280(±0), false certainty, also in the plot's legend. Its error
    is nan; a term that the data do determine keeps a finite, non-zero error."""
    N = [1e4, 1e5, 1e6, 1e7]
    for loss in ([3.0, 3.1, 3.2, 3.3], [3.0, 3.0, 3.0, 3.0]):
        f = fit.power_law(N, loss)
        assert np.isnan(f["alpha_err"]), f
        assert "(±0)" not in fit.describe(f)
    f = fit.power_law(N, [3.5, 3.2, 3.05, 3.0])
    assert 0 < f["alpha_err"] < np.inf
    D = np.tile([1e6, 4e6, 1.6e7], 3)
    Nd = np.repeat([1e4, 1e5, 1e6], 3)
    f = fit.power_law_nd(Nd, D, 1.0 + 30 * Nd ** -0.3 + 0.01 * np.log(D))  # D: no fall
    assert np.isnan(f["beta_err"]) or f["B"] > 0, f


def test_two_term_fit_is_not_given_where_its_exponents_are_not_determined():
    """A ladder at 2 token budgets (configs/scaling/tiny_ladder.py: 5 sizes x 2) meets the D
    term as 2 numbers, which E, B and beta fit exactly for any beta: the fit printed a beta
    made up by the fitter (1.70 and E 2.30 for a planted 0.4 and 1.0, with errors of 1e-5).
    L(N, D) and Approach 3 are fitted only from 3 distinct N and 3 distinct D; at 3 budgets
    the same planted law comes back."""
    from transformer.scaling import chinchilla
    truth = dict(E=1.0, A=30.0, alpha=0.3, B=200.0, beta=0.4)
    sizes = [3.3e3, 1.3e4, 3.6e4, 8e4, 1.6e5]
    for budgets, determined in (((1e5, 2e5), False), ((1e5, 2e5, 4e5), True)):
        N = np.repeat(sizes, len(budgets))
        D = np.tile(budgets, len(sizes))
        loss = chinchilla.loss_nd(truth, N, D)
        f = fit.power_law_nd(N, D, loss)
        a3 = chinchilla.approach3([dict(N=n, D=d, loss=x) for n, d, x in zip(N, D, loss)])
        if not determined:
            assert f is None and a3 is None
            continue
        for name in ("E", "alpha", "beta"):
            assert f[name] == pytest.approx(truth[name], rel=0.02), (name, f)
            assert a3[name] == pytest.approx(truth[name], rel=0.05), (name, a3)
    assert fit.power_law([1e4, 1e4, 1e5], [3.0, 3.01, 2.5]) is None  # 2 sizes: no exponent


def test_ladder_follows_its_rule_and_budgets_set_steps():
    sizes = scaling.ladder([1, 2, 4], aspect=32, head_dim=32)
    assert [s["d_model"] for s in sizes] == [32, 64, 128]
    assert all(s["d_model"] == s["n_heads"] * 32 == s["d_ff"] // 4 for s in sizes)
    with pytest.raises(ConfigError, match="head_dim"):
        scaling.ladder([3], aspect=20, head_dim=32)

    from transformer.config import base_config
    base = base_config()
    base.model.update(max_seq_len=32)
    base.sample.max_new_tokens = 10
    base.train.batch_size = 4  # 128 tokens a step
    for kind, budget in (("tokens", 12_800), ("flops", 1e10), ("chinchilla", 2)):
        members = scaling.members(scaling.sweep_config(base, sizes, kind, [budget]))
        assert len(members) == 3 and len({m.name for m in members}) == 3
        steps = [m.config.train.steps for m in members]
        if kind == "tokens":
            assert steps == [100, 100, 100]
        else:  # compute-fixed: bigger models see fewer tokens; tokens ∝ params: more
            assert steps == sorted(steps, reverse=(kind == "flops")) and steps[0] != steps[-1]
    with pytest.raises(ConfigError, match="budget_kind"):
        scaling.members(scaling.sweep_config(base, sizes, "epochs", [1]))


def test_two_members_never_train_in_one_folder():
    """A member's folder is its name, and budgets are named to a few digits (flop1.0e12,
    tok1.234M): budgets that round to one name used to train into one folder, the second
    resuming or skipping the first's run. Such a sweep is refused in one line, before
    anything is written; budgets that differ in their name still make a member each."""
    base = base_config()
    base.model.update(max_seq_len=32)
    base.sample.max_new_tokens = 10
    base.train.batch_size = 4
    sizes = scaling.ladder([1, 2], aspect=16, head_dim=16)
    for kind, budgets in (("flops", [1.0e12, 1.04e12]), ("tokens", [1_234_000, 1_234_400])):
        with pytest.raises(ConfigError, match="would both train in the folder"):
            scaling.members(scaling.sweep_config(base, sizes, kind, budgets))
    twins = [dict(size, name="L1") for size in sizes]
    with pytest.raises(ConfigError, match="'L1_tok1K'"):
        scaling.members(scaling.sweep_config(base, twins, "tokens", [1000]))
    ms = scaling.members(scaling.sweep_config(base, sizes, "flops", [1.0e12, 1.1e12]))
    assert len({m.name for m in ms}) == len(ms) == 4


TINY_SWEEP = '''
from transformer.config import base_config
from transformer.scaling.sweep import ladder, sweep_config

def get_config():
    base = base_config()
    base.model.update(max_seq_len=32)
    base.data.update(max_bytes=100_000)
    base.train.update(batch_size=4, lr=3e-3, warmup_steps=2, log_every=4, eval_every=8,
                      eval_batches=1, ckpt_every=8)
    base.sample.max_new_tokens = 10
    return sweep_config(base, ladder([1, 2, 3], aspect=16, head_dim=16),
                        budget_kind="tokens", budgets=[1000])
'''


def _scaling(*args, env=None):
    from tests.conftest import fork_run
    return fork_run("-m", "transformer", "scaling", "--no_progress", *args, cwd=ROOT,
                    timeout=600, env=None if env is None else {**os.environ, **env})


@pytest.mark.parametrize("override", ["--sweep.base.train.steps=3",
                                      "--sweep.base.model.d_model=32"])
def test_an_override_each_member_replaces_is_refused(tmp_path, override):
    """A member's steps come from its budget and its shape from sweep.sizes:
    --sweep.base.train.steps=3 (what `--sweep.base.train.stepz` is told it meant) trained
    every member for its budget's steps all the same, saying nothing."""
    sweep_file = tmp_path / "tiny_sweep.py"
    sweep_file.write_text(TINY_SWEEP)
    result = _scaling(f"--sweep={sweep_file}", f"--workdir={tmp_path / 'sweep'}", override,
                      "--index=0")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "each member's" in lines[0], \
        result.stderr[-2000:]
    assert not (tmp_path / "sweep").exists()


@pytest.mark.slow  # ~21 s of CPU: three members train (docs/testing.md)
def test_tiny_sweep_end_to_end_and_rerun_skips(tmp_path):
    sweep_file = tmp_path / "tiny_sweep.py"
    sweep_file.write_text(TINY_SWEEP)
    workdir = tmp_path / "sweep"
    first = _scaling(f"--sweep={sweep_file}", f"--workdir={workdir}",
                     env={"TRANSFORMER_CACHE": str(tmp_path / "cache")})
    assert first.returncode == 0, first.stderr[-3000:]
    runs = sorted(p.parent.name for p in workdir.glob("*/result.json"))
    assert runs == ["L1-d16_tok1K", "L2-d32_tok1K", "L3-d48_tok1K"]
    # The members share one tokenized set: prepared by the first, read by the others.
    assert len(list((tmp_path / "cache" / "prepared").iterdir())) == 1
    for name in ("report.csv", "report.md", "fit.json", "loss_vs_params.png",
                 "loss_vs_compute.png", "loss_curves.png"):
        assert (workdir / name).stat().st_size > 0, name
    assert (workdir / "loss_curves.png").read_bytes()[:4] == b"\x89PNG"
    rows = (workdir / "report.csv").read_text().splitlines()
    assert len(rows) == 4 and rows[0].startswith("name,")
    fits = json.loads((workdir / "fit.json").read_text())
    assert set(fits["L(N)"]) >= {"E", "A", "alpha", "alpha_err"}  # 3 points: a fit, no error
    assert "L(N):" in first.stdout

    # Each member is an ordinary run: 8 steps of 128 tokens, checkpointed; its wall_s is
    # its checkpoint's count of seconds (over its invocations, tests/test_training.py)
    assert (workdir / "L2-d32_tok1K" / "checkpoints" / "8").is_dir()
    assert json.loads((workdir / "L2-d32_tok1K" / "result.json").read_text())["wall_s"] > 0

    metrics_before = (workdir / "L1-d16_tok1K" / "metrics.jsonl").read_text()
    again = _scaling(f"--sweep={sweep_file}", f"--workdir={workdir}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("finished, skipped") == 3
    assert (workdir / "L1-d16_tok1K" / "metrics.jsonl").read_text() == metrics_before

    report = _scaling(f"--workdir={workdir}", "--report")
    assert report.returncode == 0 and "val loss falls monotonically" in report.stdout


def test_index_out_of_range_and_empty_report_are_one_line_errors(tmp_path):
    sweep_file = tmp_path / "tiny_sweep.py"
    sweep_file.write_text(TINY_SWEEP)
    bad = _scaling(f"--sweep={sweep_file}", f"--workdir={tmp_path / 'w'}", "--index=7")
    assert bad.returncode == 2 and "--index=7" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "w").exists()  # nothing written for a bad index
    empty = _scaling(f"--workdir={tmp_path / 'nothing'}", "--report")
    assert empty.returncode == 2 and "no finished sweep members" in empty.stderr
    # Finished members without a finite val loss (a NaN, or no val line): one line too.
    run = tmp_path / "no_val" / "L1-d16_tok1K"
    run.mkdir(parents=True)
    (run / "result.json").write_text(json.dumps(dict(
        name=run.name, budget="tokens", budget_value=1000, n_layers=1, d_model=16, steps=8,
        tokens=1024, params_total=100, params_non_embedding=50, flops=1e9, wall_s=1.0)))
    (run / "metrics.jsonl").write_text(json.dumps({"step": 8, "val_loss": float("nan")}) + "\n")
    no_val = _scaling(f"--workdir={run.parent}", "--report")
    assert no_val.returncode == 2 and "Traceback" not in no_val.stderr, no_val.stderr[-2000:]
    assert "finite final val loss" in no_val.stderr


def test_report_of_several_budgets_fits_loss_against_size_and_data(tmp_path):
    """Runs written by hand (no training): 3 sizes × 3 token budgets on a known L(N, D)."""
    for i, (n, d) in enumerate((n, d) for d in (1e6, 4e6, 16e6) for n in (1e4, 1e5, 1e6)):
        run = tmp_path / f"run{i}"
        run.mkdir()
        loss = 1.0 + 30 * n ** -0.3 + 200 * d ** -0.35
        (run / "result.json").write_text(json.dumps(dict(
            name=run.name, budget="tokens", budget_value=d, n_layers=1, d_model=8, steps=10,
            tokens=d, params_total=int(n * 1.1), params_non_embedding=int(n), flops=6 * n * d,
            wall_s=1.0)))
        (run / "metrics.jsonl").write_text(
            json.dumps({"step": 10, "tokens": d, "train_loss": loss, "tokens_per_s": 5.0})
            + "\n" + json.dumps({"step": 10, "tokens": d, "val_loss": loss}) + "\n")
    lines = []
    fits = report_lib.report(tmp_path, log=lines.append)
    assert abs(fits["L(N,D)"]["alpha"] - 0.3) < 0.02 and abs(fits["L(N,D)"]["beta"] - 0.35) < 0.02
    assert fits["L(N)"]["n_points"] == 3  # the largest budget only
    assert fits["L(C)"] is not None
    assert "monotonically with size: yes" in lines[0]
    assert len((tmp_path / "report.csv").read_text().splitlines()) == 10
    for name in ("loss_vs_params.png", "loss_vs_compute.png", "loss_curves.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"

    # A finished member without a finite val loss is in the table but in no fit: the report
    # says so (it was dropped silently: neither fitted nor listed as unfinished).
    (tmp_path / "run4" / "metrics.jsonl").write_text(json.dumps(
        {"step": 10, "tokens": 4e6, "val_loss": float("nan")}) + "\n")
    lines = []
    fits = report_lib.report(tmp_path, log=lines.append)
    assert "left out of the fits (val loss not finite): run4" in lines[0]
    assert fits["L(N,D)"]["n_points"] == 8


def _write_isoflop_runs(workdir, groups=("",), shift=0.0):
    """Finished members written by hand: 3 budgets × 5 sizes on a known L(N, D), C = 6ND."""
    for g_i, group in enumerate(groups):
        for C in (1e15, 4e15, 1.6e16):
            n_opt = (C / 120) ** 0.5
            for k, n in enumerate(n_opt * np.geomspace(0.2, 5, 5)):
                d = C / (6 * n)
                loss = 1.5 + g_i * shift + 400 * n ** -0.34 + 410 * d ** -0.28
                name = "_".join(p for p in (group, f"n{k}", f"flop{C:.1e}") if p)
                run = workdir / name
                run.mkdir(parents=True)
                (run / "result.json").write_text(json.dumps(dict(
                    name=name, budget="flops", budget_value=C, n_layers=k + 1, d_model=16,
                    steps=10, tokens=d, params_total=int(n * 1.2), params_non_embedding=int(n),
                    flops=C, wall_s=1.0, group=group)))
                (run / "metrics.jsonl").write_text(json.dumps(
                    {"step": 10, "tokens": d, "val_loss": loss, "val_bpb": loss / 2}) + "\n")
    (workdir / "sweep.json").write_text(json.dumps({"sweep": {"sizes": [dict(
        name="L1-d16", n_layers=1, d_model=16, n_heads=1, d_ff=64)]}, "members": []}))


def test_isoflop_report_predicts_and_checks_a_held_out_budget(tmp_path):
    _write_isoflop_runs(tmp_path)
    lines = []
    fits = report_lib.report(tmp_path, log=lines.append, holdout="largest", n_boot=8)
    text = lines[0]
    assert "Approach 2" in text and "Approach 3" in text and "Holdout" in text
    assert abs(fits["isoflop"]["approach3"]["alpha"] - 0.34) < 0.03
    assert abs(fits["isoflop"]["approach2"]["a"] + fits["isoflop"]["approach2"]["b"] - 1) < 0.05
    assert (tmp_path / "isoflop.png").read_bytes()[:4] == b"\x89PNG"
    held = [line for line in text.splitlines() if "flop1.6e+16" in line and line.startswith("| n")]
    assert len(held) == 10  # 5 runs in the run table, and again in the holdout table
    assert "val_bpb" in (tmp_path / "report.csv").read_text().splitlines()[0]

    out = []
    best = report_lib.predict(tmp_path, 1e17, log=out.append, n_boot=8)
    assert best["N_int"][0] <= best["N"] <= best["N_int"][1]
    assert best["D"] / best["N"] > 1
    # This sweep.json has sizes but no base config: the ladder's sizes cannot be counted, so
    # no size is named (one counted on a default model would not be the one --verify trains).
    assert "nearest ladder size: (sweep.json lacks the sweep's sizes or base" in out[0]


def test_predict_does_not_fit_several_variants_as_one_sweep(tmp_path):
    """Two variants' IsoFLOP runs (the second planted 0.5 nats worse at every size): the
    report fits no compute-optimal law through them, but --predict fitted one through both
    and printed a prediction that belongs to neither. It is refused in one line."""
    _write_isoflop_runs(tmp_path, groups=("gpt2", "modern"), shift=0.5)
    with pytest.raises(ConfigError, match="variants"):
        report_lib.predict(tmp_path, 1e17, log=lambda s: None, n_boot=2)


def test_predict_and_holdout_flags_refuse_bad_values(tmp_path):
    _write_isoflop_runs(tmp_path)
    no_budget = _scaling(f"--workdir={tmp_path}", "--predict")
    assert no_budget.returncode == 2 and "--flops" in no_budget.stderr
    for flag in ("--predict", "--verify"):  # nan passed as positive: a prediction of nans
        for value in ("nan", "inf"):
            bad = _scaling(f"--workdir={tmp_path}", flag, f"--flops={value}", "--bootstrap=2")
            assert bad.returncode == 2 and "--flops" in bad.stderr, (flag, value, bad.stdout)
            assert "Traceback" not in bad.stderr
    bad = _scaling(f"--workdir={tmp_path}", "--report", "--holdout=smallest")
    assert bad.returncode == 2 and "--holdout=smallest" in bad.stderr


def test_variants_name_members_and_the_report_fits_one_curve_per_group(tmp_path):
    variants = scaling.grid({"model.position": ["learned", "rope"], "train.lr": [1e-3, 3e-3]})
    assert [v["name"] for v in variants][:2] == ["position=learned_lr=0.001",
                                                 "position=learned_lr=0.003"]
    assert {v["group"] for v in variants} == {"position=learned", "position=rope"}
    base = base_config()
    sweep = scaling.sweep_config(base, scaling.ladder([1, 2], aspect=16, head_dim=16),
                                 "tokens", [1000], variants)
    ms = scaling.members(sweep)
    assert len(ms) == 8 and ms[-1].name == "position=rope_lr=0.003_L2-d32_tok1K"
    assert ms[-1].config.model.position == "rope" and ms[-1].config.train.lr == 3e-3
    bad = scaling.sweep_config(base, scaling.ladder([1], aspect=16, head_dim=16), "tokens",
                               [1000], [{"name": "x", "model.positions": "rope"}])
    with pytest.raises(ConfigError, match="model.positions"):
        scaling.members(bad)

    # The report keeps the best lr per size, then fits each group: the "modern" group is
    # planted 0.1 nats better at every size, with a worse lr that must be ignored.
    # Its models are 1% smaller (SwiGLU's rounded width): the sweep's first variant, not the
    # smallest model's, stays the baseline of the gap table.
    index = itertools.count()
    for group, offset, scale in (("gpt2", 0.0, 1.0), ("modern", -0.1, 0.99)):
        for lr, penalty in ((1e-3, 0.5), (3e-3, 0.0)):
            for k, size in enumerate((1e4, 3e4, 1e5, 3e5)):
                name, n = f"{group}_lr={lr:g}_n{k}", size * scale
                loss = 2.0 + offset + penalty + 30 * size ** -0.3
                run = tmp_path / name
                run.mkdir()
                (run / "result.json").write_text(json.dumps(dict(
                    index=next(index), name=name, budget="tokens", budget_value=1e6,
                    n_layers=k + 1, d_model=8, steps=10, tokens=1e6, params_total=int(n),
                    params_non_embedding=int(n), flops=6e6 * n, wall_s=1.0, group=group)))
                (run / "metrics.jsonl").write_text(json.dumps(
                    {"step": 10, "tokens": 1e6, "val_loss": loss}) + "\n")
    lines = []
    fits = report_lib.report(tmp_path, log=lines.append)
    assert set(fits) == {"gpt2", "modern"}
    assert "| modern − gpt2 |" in lines[0]
    gaps = [line for line in lines[0].splitlines() if line.startswith("| L")]
    assert [line.split(" | ")[-1] for line in gaps] == ["-0.1000 |"] * 4  # best lr vs best lr
    assert fits["modern"]["L(N)"]["E"] == pytest.approx(1.9, abs=0.02)
    assert fits["gpt2"]["L(N)"]["E"] == pytest.approx(2.0, abs=0.02)
    assert fits["gpt2"]["L(N)"]["alpha"] == pytest.approx(0.3, abs=0.02)


def test_an_allowed_change_keeps_the_finished_members_as_it_says(tmp_path, monkeypatch):
    """--allow_change=base.train.batch_size prints "finished members are kept as they are",
    but a change that alters a member's steps sent the finished member back to training,
    where its checkpoint refused the changed config and the sweep stopped there. Finished
    members are kept (train is not called for them); unfinished ones train. Training is
    stubbed: only the bookkeeping runs."""
    from transformer.scaling.sweep import ladder, sweep_config
    trained = []
    _stub_training(monkeypatch, lambda workdir: trained.append(workdir.name))
    base = base_config()
    base.model.update(max_seq_len=32)
    base.train.update(batch_size=4)
    base.sample.max_new_tokens = 10
    sweep = sweep_config(base, ladder([1, 2], aspect=16, head_dim=16), "tokens", [1000])
    scaling.run(sweep, tmp_path, index=0, log=lambda s: None, progress=False)
    first = scaling.members(sweep)[0].name
    before = (tmp_path / first / "result.json").read_text()
    changed = copy.deepcopy(sweep)
    changed.base.train.batch_size = 2  # 16 steps where the finished member took 8
    trained.clear()
    lines = []
    scaling.run(changed, tmp_path, log=lines.append, progress=False,
                allow_change=["base.train.batch_size"])
    assert trained == [scaling.members(changed)[1].name], lines
    assert (tmp_path / first / "result.json").read_text() == before
    assert any(first in line and "kept" in line for line in lines), lines


def _stub_training(monkeypatch, trained=lambda workdir: None) -> None:
    """A sweep's members are started (start.prepare: a byte tokenizer, vocab_size=0 filled
    in) and trained (run.train: `trained(workdir)`, the workdir made) with no data read and
    no step run: only the sweep's bookkeeping runs."""
    from types import SimpleNamespace

    from transformer.data import tokenizers
    from transformer.train.resolve import resolve
    monkeypatch.setattr("transformer.train.start.prepare", lambda config, workdir, **k: (
        SimpleNamespace(workdir=Path(workdir),
                        config=resolve(config, platform=None,
                                       tokenizer=tokenizers.ByteTokenizer())[0])))
    monkeypatch.setattr("transformer.train.run.train", lambda member, options: (
        trained(member.workdir), member.workdir.mkdir(parents=True, exist_ok=True)))


class _Killed(BaseException):
    """What a SIGKILL mid-write leaves: the bytes written so far, nothing after."""


def test_a_kill_mid_write_leaves_sweep_state_whole(tmp_path, monkeypatch):
    """sweep.json and a member's result.json, rewritten while the process dies half way
    through the write, still read as the complete old file (a torn one breaks the sweep's
    resume and its report). Training is stubbed: only the bookkeeping runs."""
    from transformer.scaling.sweep import ladder, sweep_config
    _stub_training(monkeypatch)
    base = base_config()
    base.model.update(max_seq_len=32)
    base.train.update(batch_size=4)
    base.sample.max_new_tokens = 10
    sweep = sweep_config(base, ladder([1], aspect=16, head_dim=16), "tokens", [1000])
    scaling.run(sweep, tmp_path, log=lambda s: None, progress=False)
    member = scaling.members(sweep)[0].name
    result = tmp_path / member / "result.json"
    old = {"sweep.json": json.loads((tmp_path / "sweep.json").read_text()),
           "result.json": {**json.loads(result.read_text()), "steps": -1}}  # so it reruns
    result.write_text(json.dumps(old["result.json"]))
    import builtins

    from transformer.data import durable
    for torn in ("sweep.json", "result.json"):
        def dies_half_way(file, mode="r", *args, torn=torn, **kwargs):
            """The writer's open(): a file named like `torn` gets half its text, then the
            process 'dies' (durable.write_atomic writes a temporary file, then renames)."""
            f = builtins.open(file, mode, *args, **kwargs)
            if "w" in mode and torn in Path(file).name:
                def write(text, f=f, real=f.write):
                    real(text[:len(text) // 2])
                    f.close()
                    raise _Killed
                f.write = write
            return f
        monkeypatch.setattr(durable, "open", dies_half_way, raising=False)
        with pytest.raises(_Killed):
            scaling.run(sweep, tmp_path, log=lambda s: None, progress=False)
        monkeypatch.delattr(durable, "open")
        assert json.loads((tmp_path / member / torn if torn == "result.json"
                           else tmp_path / torn).read_text()) == old[torn], torn


def _write_planted_isoflop(workdir, sweep, truth):
    """Finished members of an IsoFLOP `sweep`, written by hand: the token counts the sweep
    gives them and losses from a known L(N, D) (nothing trains)."""
    from transformer.model import flops
    from transformer.model.sizes import model_config_of
    from transformer.scaling import chinchilla
    for m in scaling.members(sweep):
        model = model_config_of(m.config)
        counts = flops.param_counts(model)
        run = workdir / m.name
        run.mkdir(parents=True)
        (run / "result.json").write_text(json.dumps(dict(
            name=m.name, index=m.index, budget="flops", budget_value=m.value,
            n_layers=model.n_layers, d_model=model.d_model, steps=m.config.train.steps,
            tokens=m.tokens, params_total=counts["total"],
            params_non_embedding=counts["non_embedding"],
            flops=flops.train_flops_per_token(model) * m.tokens, wall_s=1.0, group="")))
        n = flops.train_flops_per_token(model) / 6  # compute-equivalent, as the fits count it
        loss = float(chinchilla.loss_nd(truth, n, m.tokens))
        (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "val_loss": loss}) + "\n")
    (workdir / "sweep.json").write_text(json.dumps({"sweep": json.loads(sweep.to_json())}))


TRUTH = dict(E=1.5, A=30.0, alpha=0.3, B=60.0, beta=0.3)


def test_predict_and_verify_name_the_same_size_on_a_base_with_gqa_and_swiglu(tmp_path):
    """configs/scaling/cpu_isoflop_gpt2.py with multi-query attention and SwiGLU: the size
    --predict prints is the one --verify trains, counted on the sweep's base (the old
    --predict counted a default GPT-2 block: d128, 396.8K, where --verify trains L2-d144);
    the sizes --verify sets beside it lie at about half and twice its N."""
    import importlib.util

    from transformer.scaling import verify
    spec = importlib.util.spec_from_file_location(
        "iso", ROOT / "configs/scaling/cpu_isoflop_gpt2.py")
    iso = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(iso)
    sweep = iso.get_config()
    sweep.base.model.update(n_kv_heads=1, mlp="swiglu")
    _write_planted_isoflop(tmp_path, sweep, TRUTH)

    out = []
    report_lib.predict(tmp_path, 8e12, log=out.append, n_boot=2)
    [said] = [line for line in out[0].splitlines() if "nearest ladder size" in line]
    check, fits, C, best, size = verify.plan(tmp_path, 8e12, n_boot=2, seeds=1)
    cost = fits["cost"]
    n = cost.count(size)[0]
    assert said.endswith(f"n_layers={size['n_layers']}, d_model={size['d_model']}, "
                         f"n_heads={size['n_heads']}, d_ff={size['d_ff']} "
                         f"({report_lib.human(n)} compute-equivalent params, "
                         f"{report_lib.human(cost.non_embedding(size))} non-embedding)"), said
    lower, middle, upper = [cost.count(s)[0] for s in check.sizes]
    assert middle == n and check.sizes[1] == size
    for ratio in (n / lower, upper / n):
        assert 2 / 1.3 < ratio < 2 * 1.3, ratio  # the ladder's widths come in steps


def test_the_report_after_a_whole_sweep_takes_its_bootstrap_and_holdout_flags(tmp_path):
    """`--sweep=... --workdir=...` ends with the report; it used to ignore --bootstrap and
    --holdout there (100 resamples, no holdout table, whatever was asked). Every member of
    configs/scaling/cpu_isoflop.py (its window keeps 29 of 9 sizes x 5 budgets) is planted as
    finished, so nothing trains."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("iso", ROOT / "configs/scaling/cpu_isoflop.py")
    iso = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(iso)
    _write_planted_isoflop(tmp_path, iso.get_config(), TRUTH)
    done = _scaling("--sweep=configs/scaling/cpu_isoflop.py", f"--workdir={tmp_path}",
                    "--bootstrap=3", "--holdout=largest")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("finished, skipped") == 29
    assert "[3 resamples]" in done.stdout and "[100 resamples]" not in done.stdout
    assert "Holdout: fitted without" in done.stdout


def test_verify_does_not_train_a_config_no_member_of_the_sweep_had(tmp_path):
    """An IsoFLOP sweep over a train.lr grid (one group: the report keeps each size's best
    lr): --verify rebuilt its runs from the base config and dropped the variants, so it
    trained at the base's lr, which no member used, and compared that run with a fit of
    the best-lr losses. What it trains must be some member's config; here it is refused."""
    from transformer.scaling import verify
    base = base_config()
    base.model.update(vocab_size=0, max_seq_len=32)
    base.train.update(batch_size=4, lr=3e-3)
    base.sample.max_new_tokens = 10
    sizes = [dict(name=f"L1-d{d}", n_layers=1, d_model=d, n_heads=-(-d // 16), d_ff=4 * d)
             for d in (8, 16, 24, 32, 48, 64)]
    sweep = scaling.sweep_config(base, sizes, "flops", [2e7, 6e7, 2e8],
                                 scaling.grid({"train.lr": [1e-2, 3e-2]}))
    _write_planted_isoflop(tmp_path, sweep, TRUTH)
    swept = {m.config.train.lr for m in scaling.members(sweep)}
    try:
        check = verify.plan(tmp_path, None, n_boot=2, seeds=1)[0]
    except ConfigError as e:
        assert "variants" in str(e)
    else:
        assert {m.config.train.lr for m in scaling.members(check)} <= swept


def test_the_verdict_is_confirmed_refuted_or_inconclusive_against_the_paired_seed_spread():
    from transformer.scaling.verify import verdict
    said, why, gaps = verdict({"a": [3.10, 3.20], "b": [3.00, 3.10], "c": [3.05, 3.12]}, "b")
    assert said == "confirmed" and why.startswith("confirmed: b")
    assert gaps["a"][0] == pytest.approx(0.10)
    said, why, _ = verdict({"a": [3.1, 3.2], "b": [3.0, 3.1], "c": [2.9, 3.01]}, "b")
    assert said == "refuted" and why.startswith("refuted: c")
    said, why, _ = verdict({"a": [3.1], "b": [3.0], "c": [3.2]}, "b")  # one seed: no spread
    assert said == "inconclusive" and "one seed" in why
    # A NaN loss is neither lower nor higher than another: a diverged or unevaluated run
    # (the predicted size's or a neighbour's) must not read as "confirmed".
    for losses in ({"a": [3.1], "b": [float("nan")], "c": [3.2]},
                   {"a": [3.1, 3.2], "b": [3.0, 3.1], "c": [3.05, float("nan")]}):
        said, why, _ = verdict(losses, "b")
        assert said == "no verdict" and "not finite" in why, why


@pytest.mark.parametrize("c", [[3.01, 3.07], [2.995, 3.105], [3.005, 3.095]])
def test_a_noise_sized_gap_is_inconclusive(c):
    """A neighbour within the paired seed spread of the predicted size, lower (by 0.01, or
    0.0025) or higher (by 0.0025), decides nothing: the old rule called the first two
    "confirmed within seed noise" and, at one seed, a 0.009 gap "NOT confirmed"."""
    from transformer.scaling.verify import verdict
    said, why, gaps = verdict({"a": [3.1, 3.2], "b": [3.00, 3.10], "c": c}, "b")
    assert said == "inconclusive" and "within its seed spread" in why, why
    assert gaps["c"][1] == pytest.approx(np.std(np.array(c) - [3.00, 3.10], ddof=1))


@pytest.mark.slow  # ~23 s of CPU: nine runs train (docs/testing.md)
def test_verify_trains_the_predicted_size_and_its_neighbours_once_per_budget(tmp_path,
                                                                             shared_trainers):
    """An IsoFLOP sweep written by hand (a tiny ladder's 18 members with losses from a known
    L(N, D) in compute-equivalent N); --verify then really trains the ladder size nearest
    Approach 3's optimum at 4x the largest budget and the sizes nearest half and twice its N,
    at 2 seeds, sized as members would be, in a folder of that budget, and prints the
    three-size table and one of its three verdicts. A second
    --verify at another budget trains into its own folder (it used to be refused as
    "another sweep"). The two seeds of a size share one Trainer (shared_trainers: what is
    checked is the plan, the table and the folders, not the building of each run's step)."""
    from transformer.scaling import chinchilla, verify
    base = base_config()
    base.model.update(vocab_size=0, max_seq_len=32)
    base.data.update(max_bytes=100_000)
    base.train.update(batch_size=4, lr=3e-3, warmup_steps=2, log_every=10,
                      eval_every=10**6, eval_batches=1, ckpt_every=10**6)
    base.sample.max_new_tokens = 10
    sizes = [dict(name=f"L1-d{d}", n_layers=1, d_model=d, n_heads=-(-d // 16), d_ff=4 * d)
             for d in (8, 16, 24, 32, 48, 64)]
    sweep = scaling.sweep_config(base, sizes, "flops", [2e7, 6e7, 2e8])
    _write_planted_isoflop(tmp_path, sweep, TRUTH)

    lines = []
    out = verify.verify(tmp_path, log=lines.append, n_boot=4, progress=False, seeds=2)
    assert out["C"] == 8e8 and out["name"] == "L1-d8_flop8.0e08"  # N_opt 3.6K: d8 (3.8K)
    assert out["source"] == "Approach 3"  # the planted law fits exactly
    folder = tmp_path / "verify" / "flop8e08"
    assert out["folder"] == str(folder)
    result = json.loads((folder / out["name"] / "result.json").read_text())
    assert result["flops"] == pytest.approx(8e8, rel=0.01)  # whole steps of 128 tokens
    n = result["flops"] / (6 * result["tokens"])
    assert out["predicted"] == pytest.approx(
        chinchilla.loss_nd(TRUTH, n, result["tokens"]), rel=1e-3)
    assert 0 < out["measured"] < 6  # a real byte-level run: below ln 256 + a bit
    trained = sorted(p.parent.name for p in folder.glob("*/result.json"))
    assert len(trained) == 6 and all(n.endswith("_flop8.0e08") for n in trained)
    assert {n.split("_")[-2] for n in trained} == {"L1-d4", "L1-d8", "L1-d12"}  # ½x, 2x N
    text = "\n".join(lines)
    assert "measured val loss" in text and "interval half-widths" in text
    table = [line for line in text.splitlines() if line.startswith("| L1-d")]
    assert [line.split(" | ")[0] for line in table] == ["| L1-d4", "| L1-d8", "| L1-d12"]
    assert "(predicted)" in table[1] and out["why"] == text.splitlines()[-1]
    assert out["verdict"] in ("confirmed", "refuted", "inconclusive")
    assert out["why"].startswith(out["verdict"])

    again = _scaling(f"--workdir={tmp_path}", "--verify", "--flops=4e8", "--seeds=1",
                     "--bootstrap=4")
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(list((tmp_path / "verify" / "flop4e08").glob("*/result.json"))) == 3
    assert "| L1-d" in again.stdout and "inconclusive: one seed" in again.stdout
    bad = _scaling(f"--workdir={tmp_path}", "--verify", "--seeds=0")
    assert bad.returncode == 2 and "--seeds=0" in bad.stderr and "Traceback" not in bad.stderr


def _finished_sweep(tmp_path, text=TINY_SWEEP):
    """A workdir that looks like a finished run of `text` (sweep.json and each member's
    result.json, written by hand: nothing trains), and the sweep file."""
    sweep_file = tmp_path / "tiny_sweep.py"
    sweep_file.write_text(text)
    namespace = {}
    exec(compile(text, str(sweep_file), "exec"), namespace)
    sweep = namespace["get_config"]()
    workdir = tmp_path / "sweep"
    workdir.mkdir()
    names = [m.name for m in scaling.members(sweep)]
    (workdir / "sweep.json").write_text(json.dumps(
        {"sweep": json.loads(sweep.to_json()), "members": names}, indent=1))
    for name in names:
        (workdir / name).mkdir()
        (workdir / name / "result.json").write_text(json.dumps({"name": name, "steps": 8}))
    return sweep_file, sweep, workdir


def _snapshot(folder):
    return {p: p.read_bytes() for p in sorted(Path(folder).rglob("*")) if p.is_file()}


def test_a_sweep_workdir_refuses_another_sweep_or_a_changed_base(tmp_path):
    sweep_file, sweep, workdir = _finished_sweep(tmp_path)
    before = _snapshot(workdir)
    other = tmp_path / "other_sweep.py"
    other.write_text(TINY_SWEEP.replace("budgets=[1000]", "budgets=[2000]"))
    for args, names in (([f"--sweep={other}"], "budgets"),
                        ([f"--sweep={sweep_file}", "--sweep.base.train.lr=0.01"], "base.train.lr")):
        refused = _scaling(*args, f"--workdir={workdir}", "--index=0")
        assert refused.returncode == 2, refused.stdout[-2000:]
        [line] = refused.stderr.strip().splitlines()
        assert line.startswith("error: ") and f"--allow_change={names}" in line, line
        assert names.split(".")[-1] in line.split("--allow_change")[0]  # what differs
        assert _snapshot(workdir) == before  # the finished sweep's files untouched

    # Named differences pass (and are reported); the same sweep passes silently.
    changed = scaling.sweep_config(sweep.base, sweep.sizes, "tokens", [2000])
    assert set(scaling.check_workdir(changed, workdir, ["budgets"])) == {"budgets"}
    assert scaling.check_workdir(sweep, workdir) is None
    with pytest.raises(ConfigError, match="holds another sweep"):
        scaling.check_workdir(changed, workdir, ["sizes"])


def test_a_sweep_workdir_refuses_a_change_to_what_its_members_measure(tmp_path):
    """Free on a resumed run is not free within a sweep: the final val loss the report fits is
    measured over train.eval_tokens, and an IsoFLOP member's tokens depend on the
    padded vocabulary (model.vocab_multiple). Members finished before such a change and
    trained after it would be fitted together; the workdir refuses it, naming the key
    (--verify's budget folders follow the same rule). Logging stays free."""
    from transformer.scaling import verify
    _, sweep, workdir = _finished_sweep(tmp_path)
    for key, value in (("train.eval_tokens", 4096), ("model.vocab_multiple", 64)):
        changed = copy.deepcopy(sweep)
        section, field = key.split(".")
        changed.base[section][field] = value
        with pytest.raises(ConfigError, match=f"base.{key}"):
            scaling.check_workdir(changed, workdir)
        assert set(scaling.check_workdir(changed, workdir, [f"base.{key}"])) == {f"base.{key}"}
        with pytest.raises(ConfigError, match=f"base.{key}"):
            verify._refuse_another_plan(changed, workdir)
    logged = copy.deepcopy(sweep)
    logged.base.train.log_every = 1
    assert scaling.check_workdir(logged, workdir) is None


def test_a_run_config_or_an_empty_budget_given_as_sweep_is_one_line(tmp_path):
    bad = _scaling("--sweep=configs/tiny.py", f"--workdir={tmp_path / 'w'}")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr[-2000:]
    [line] = bad.stderr.strip().splitlines()
    assert "this is a run config" in line and "train.py" in line
    sweep_file = tmp_path / "tiny_sweep.py"
    sweep_file.write_text(TINY_SWEEP)
    zero = _scaling(f"--sweep={sweep_file}", "--sweep.budgets=(0,)", f"--workdir={tmp_path / 'z'}")
    assert zero.returncode == 2 and "Traceback" not in zero.stderr, zero.stderr[-2000:]
    [line] = zero.stderr.strip().splitlines()
    assert "sweep.budgets" in line and "positive" in line
    assert not (tmp_path / "z").exists()


@pytest.mark.parametrize("command", [["train.py"], ["-m", "transformer", "sizes"]])
def test_a_sweep_config_given_as_a_run_config_says_so(command):
    from tests.conftest import fork_run
    out = fork_run(*command, "--config=configs/scaling/cpu_ladder.py", cwd=ROOT, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    [line] = out.stderr.strip().splitlines()
    assert "this is a sweep config" in line and "transformer scaling --sweep" in line


def test_a_window_keeps_at_each_budget_the_sizes_whose_tokens_per_param_it_holds():
    """configs/scaling/cpu_isoflop.py spans 100x in compute with one ladder: its window keeps
    a size at a budget exactly where tokens per non-embedding parameter fall in it (none
    outside, none inside left out), every budget keeps >= 5 sizes for its parabola, and the
    quick start's width trains at the two largest budgets. A window that empties a budget,
    or is no window, is refused naming sweep.window."""
    import importlib.util

    from transformer.model import flops
    from transformer.model.sizes import model_config_of
    spec = importlib.util.spec_from_file_location("iso", ROOT / "configs/scaling/cpu_isoflop.py")
    iso = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(iso)
    sweep = iso.get_config()
    low, high = sweep.window
    kept = {m.name for m in scaling.members(sweep)}
    unwindowed = copy.deepcopy(sweep)
    del unwindowed["window"]
    everything = scaling.members(unwindowed)
    assert len(everything) == len(iso.WIDTHS) * len(iso.BUDGETS) > len(kept)
    for m in everything:
        ratio = m.tokens / flops.param_counts(model_config_of(m.config))["non_embedding"]
        # the steps round the tokens: the ratio may miss the edge by half a step's worth
        if abs(ratio / low - 1) > 0.02 and abs(ratio / high - 1) > 0.02:
            assert (m.name in kept) == (low <= ratio <= high), (m.name, ratio)
    for budget in iso.BUDGETS:
        assert sum(m.value == budget for m in scaling.members(sweep)) >= 5, budget
    assert {"L4-d128_flop6.0e12", "L4-d128_flop2.0e13"} <= kept
    for window in ((3000, 4000), (10, 1), (0, 5), ("1", 5)):
        bad = copy.deepcopy(sweep)
        bad.window = window
        with pytest.raises(ConfigError, match="sweep.window"):
            scaling.members(bad)


def test_a_sizes_own_window_replaces_the_sweeps_for_that_size_alone():
    """A size's keep_within (half-steps kept near each optimum) keeps it exactly where its
    tokens per parameter fall inside its own window, however wide the sweep's; the other sizes
    keep the sweep's window; keep_within is no model field (the member builds without it); a
    bad one is refused naming sweep.sizes[k].keep_within."""
    from transformer.model import flops
    from transformer.model.sizes import model_config_of
    base = base_config()
    base.model.update(max_seq_len=32)
    size = lambda d, **kw: dict(name=f"L1-d{d}", n_layers=1, d_model=d, n_heads=1,
                                d_ff=2 * d, **kw)
    sweep = scaling.sweep_config(base, [size(8), size(16), size(12, keep_within=(20, 60))],
                                 "flops", (3e9, 3e10), window=(1, 1000), window_n="compute")
    per_param = {}
    for m in scaling.members(sweep):
        assert "keep_within" not in m.config.model
        per_param[m.name] = m.tokens / (flops.train_flops_per_token(model_config_of(m.config)) / 6)
    kept_d12 = {name for name in per_param if "-d12_" in name}
    assert kept_d12 and all(20 <= per_param[name] <= 60 for name in kept_d12)
    assert sum("-d8_" in name or "-d16_" in name for name in per_param) == 4  # the sweep's window
    wide = copy.deepcopy(sweep)
    wide.sizes[2] = size(12)
    assert sum("-d12_" in m.name for m in scaling.members(wide)) == 2 > len(kept_d12)
    bad = copy.deepcopy(sweep)
    bad.sizes[2] = size(12, keep_within=(60, 20))
    with pytest.raises(ConfigError, match=r"sweep.sizes\[2\].keep_within"):
        scaling.members(bad)


def test_a_members_seeds_are_averaged_and_their_spread_is_the_seed_noise():
    """Members differing only in a seed variant (seed=<s>_..., the first seed plain) become
    one row at their mean loss before any fit; the seed noise pools each member's variance
    over its seeds; members of one seed measure none. A tuned field (an lr variant) still
    keeps its best value, after its seeds are averaged."""
    from transformer.scaling import report

    def row(name, loss, seed, group=""):
        return dict(name=name, group=group, budget="flops", budget_value=1e11,
                    params_non_embedding=1000 if "d8" in name else 2000, val_loss=loss,
                    seed=seed)

    rows = [row("L4-d8_flop1.0e11", 3.00, 0), row("seed=1_L4-d8_flop1.0e11", 3.02, 1),
            row("L4-d16_flop1.0e11", 2.90, None), row("seed=1_L4-d16_flop1.0e11", 2.86, 1)]
    means = {r["name"]: r for r in report.seed_means(rows)}
    assert set(means) == {"L4-d8_flop1.0e11", "L4-d16_flop1.0e11"}
    assert means["L4-d8_flop1.0e11"]["val_loss"] == pytest.approx(3.01)
    assert means["L4-d16_flop1.0e11"]["val_losses"] == [2.90, 2.86]
    noise, members = report.seed_noise(rows)
    assert members == 2
    assert noise == pytest.approx(math.sqrt((0.02 ** 2 / 2 + 0.04 ** 2 / 2) / 2))
    assert report.seed_noise(rows[::2]) is None
    tuned = [row("lr=1_L4-d8_flop1.0e11", 3.00, 0), row("seed=1_lr=1_L4-d8_flop1.0e11", 3.10, 1),
             row("lr=2_L4-d8_flop1.0e11", 3.04, 0), row("seed=1_lr=2_L4-d8_flop1.0e11", 3.04, 1)]
    (best,) = report.best_per_size(tuned)
    assert best["val_loss"] == pytest.approx(3.04) and best["name"].startswith("lr=2")


def test_verify_takes_a_sweep_of_seeds_and_fits_each_sizes_mean(tmp_path):
    """A sweep whose variants only set train.seed (configs/scaling/cpu_isoflop_rules.py) is
    the base at several seeds: --verify plans from it (a variant setting anything else is
    refused, above), fits one point per size at its seeds' mean, and holds Approach 3 to the
    seed noise its paired members measure, not the sweep's assumed one."""
    from transformer.scaling import verify
    base = base_config()
    base.model.update(vocab_size=0, max_seq_len=32)
    base.train.update(batch_size=4)
    base.sample.max_new_tokens = 10
    sizes = [dict(name=f"L1-d{d}", n_layers=1, d_model=d, n_heads=-(-d // 16), d_ff=4 * d)
             for d in (8, 16, 24, 32, 48, 64)]
    seeds = [{"name": "", "group": "", "train.seed": 0},
             {"name": "seed=1", "group": "", "train.seed": 1}]
    sweep = scaling.sweep_config(base, sizes, "flops", [2e7, 6e7, 2e8], seeds,
                                 seed_noise=0.5)
    _write_planted_isoflop(tmp_path, sweep, TRUTH)
    for k, run in enumerate(sorted(tmp_path.glob("seed=1_*/metrics.jsonl"))):
        loss = json.loads(run.read_text())["val_loss"] + (0.004 if k % 2 else -0.004)
        run.write_text(json.dumps({"step": 1, "val_loss": loss}) + "\n")
    check, fits, C, best, size = verify.plan(tmp_path, None, n_boot=2, seeds=2)
    assert [v["train.seed"] for v in check.variants] == [0, 1]
    # From the members' rows and the sweep alone (a refit of records, no run folders): the
    # same plan.
    again = verify.plan(tmp_path / "elsewhere", None, n_boot=2, seeds=2,
                        rows=report_lib.collect(tmp_path), saved=json.loads(sweep.to_json()))
    assert again[0].to_json() == check.to_json() and again[2:] == (C, best, size)
    assert fits["seed_noise"] == pytest.approx(0.004 / math.sqrt(2), rel=1e-6)
    assert fits["seed_noise_source"].startswith("measured over the seeds of")
    assert len(fits["a3"] and fits["gate"]["budgets"]) == 3
    assert sum(n for _, n, _ in fits["gate"]["budgets"].values()) == len(
        [m for m in scaling.members(sweep) if not m.name.startswith("seed=")])
