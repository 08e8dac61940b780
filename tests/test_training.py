"""Training end to end on synthetic tasks: the mask holds, attention moves information,
and the loop's state (params, optimizer, step, data position) resumes exactly."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import one_trainer_per_config, train_quietly
from transformer.config import base_config
from transformer.model import attention

VOCAB = 16


def _config(corpus, steps):
    c = base_config()
    # matmul pinned: what `auto` picks depends on the machine, and these tests are about the
    # training loop, so they must compute the same numbers everywhere and under any load.
    c.model.update(vocab_size=VOCAB, d_model=64, n_layers=2, n_heads=4, d_ff=128, max_seq_len=32,
                   matmul="fast_f32")
    c.data.corpus = corpus
    c.train.update(steps=steps, batch_size=16, lr=3e-3, warmup_steps=20, log_every=25,
                   eval_every=1000, eval_batches=4, ckpt_every=1000)
    c.sample.max_new_tokens = 8
    return c


def _final_val_loss(workdir):
    from transformer.train.metrics import MetricsLog
    return [m["val_loss"] for m in MetricsLog(workdir).read() if "val_loss" in m][-1]


def _train(config, workdir, stop_at=None):
    return train_quietly(config, workdir, stop_at=stop_at)


@pytest.fixture(scope="module")
def copy_run(tmp_path_factory, module_trainers):
    """The copy task, 30 steps uninterrupted, a line every step: (final state, workdir). The
    resumed run and the profiled run are both compared with it; the resumed one's runs take
    its Trainer (conftest.one_trainer_per_config)."""
    workdir = tmp_path_factory.mktemp("copy_run")
    with one_trainer_per_config(module_trainers):
        state, _ = _train(_copy30(), workdir)
    return state, workdir


def _copy30():
    c = _config("copy", 30)
    c.train.log_every = 1
    return c


def test_random_tokens_cannot_be_predicted_below_ln_vocab(tmp_path):
    """i.i.d. uniform tokens: no causal model beats ln V except by the chance unevenness of
    the held-out sample (~V/2N nats for N tokens, under 0.01 here); a leaking mask gains more
    than 1 nat (next test). 0.05 sits far from both."""
    _train(_config("random", 150), tmp_path)
    val_loss = _final_val_loss(tmp_path)
    assert math.isfinite(val_loss) and val_loss > math.log(VOCAB) - 0.05, val_loss


def test_the_random_token_check_would_catch_a_leaking_mask(tmp_path, monkeypatch):
    """The test above can fail: with the future visible, the next token is simply read off."""
    monkeypatch.setattr(attention, "causal_mask",
                        lambda T, window=0: jnp.ones((1, 1, T, T), bool))
    _train(_config("random", 150), tmp_path)
    assert _final_val_loss(tmp_path) < math.log(VOCAB) - 1.0


def test_copy_task_loss_on_the_copied_half_falls_near_zero(tmp_path):
    _train(_config("copy", 200), tmp_path)
    assert _final_val_loss(tmp_path) < 0.1


def test_resumed_run_equals_uninterrupted_run(tmp_path, copy_run, shared_trainers):
    """... and its wall_s (what a scaling sweep reports for a member) adds the invocations:
    the seconds to the checkpoint it resumed from, then the resumed part's (it was the
    resumed part's alone)."""
    import time

    from transformer import checkpoint
    full, _ = copy_run
    interrupted, _ = _train(_copy30(), tmp_path / "split", stop_at=10)
    assert int(interrupted.step) == 10
    began = time.perf_counter()
    resumed, _ = _train(_copy30(), tmp_path / "split")
    second = time.perf_counter() - began
    assert int(resumed.step) == 30
    for a, b in zip(jax.tree.leaves(full), jax.tree.leaves(resumed)):
        np.testing.assert_array_equal(a, b)
    ckpts = checkpoint.Checkpoints(tmp_path / "split", read_only=True)
    at_10, at_30 = (ckpts.read_meta(s)["wall_s"] for s in (10, 30))
    ckpts.close()
    # at_30 - at_10 is the resumed call's time to its last save, within the call's seconds
    # (and most of them: after the save, the call only waits for it and closes files)
    assert 0 < at_10 and at_10 + 0.3 * second <= at_30 <= at_10 + second


def test_a_run_makes_its_mesh_and_checks_its_fit_once(tmp_path, monkeypatch, shared_trainers):
    """The start works each value out once and hands it on (start.prepare's Run): a fresh
    run, and one resumed from its checkpoint, each make one mesh and check once that it
    splits the model, whatever is built on them (the Trainer, the restore's target)."""
    from transformer.parallel import sharding
    calls = []
    for name in ("make_mesh", "check_fits"):
        monkeypatch.setattr(sharding, name, lambda *a, _real=getattr(sharding, name),
                            _name=name, **k: (calls.append(_name), _real(*a, **k))[1])
    for stop_at in (1, 2):  # fresh, then resumed from the checkpoint at step 1
        calls.clear()
        _, the_run = train_quietly(_copy30(), tmp_path, stop_at=stop_at)
        assert sorted(calls) == ["check_fits", "make_mesh"], (stop_at, calls)
    assert the_run.found.step == 1


def test_tokens_logged_count_each_step_at_the_batch_it_trained_with(tmp_path, shared_trainers):
    """A run resumed with another batch size (--allow_change=train.batch_size): every
    metrics line's `tokens` is the tokens trained so far, the earlier steps at their own
    batch, and the plot's token axis reads them."""
    from transformer.scaling import plot
    from transformer.train.metrics import MetricsLog
    T = 32
    config = _config("random", 30)
    config.train.update(log_every=10, eval_every=10, ckpt_every=10)
    _train(config, tmp_path, stop_at=10)  # batch 16
    config.train.batch_size = 4
    train_quietly(config, tmp_path, stop_at=20, allow_change=["train.batch_size"])
    expected = {10: 10 * 16 * T, 20: 10 * 16 * T + 10 * 4 * T}
    lines = MetricsLog(tmp_path).read()
    assert {(m["step"], m["tokens"]) for m in lines} == set(expected.items())
    # and again from the checkpoint at 20 (batch 4 since step 10), which must say its count
    train_quietly(config, tmp_path)
    expected[30] = expected[20] + 10 * 4 * T
    lines = MetricsLog(tmp_path).read()
    assert {(m["step"], m["tokens"]) for m in lines} == set(expected.items())
    steps, tokens, _ = plot.read_curves(tmp_path)["val"]
    assert list(tokens) == [expected[int(s)] for s in steps]


def test_every_evaluation_reports_bits_per_byte_of_the_held_out_text(tmp_path):
    """Byte tokens plus one end-of-text token per document: val_bpb is nats / ln 2 times the
    validation tokens per byte, counted here from the shards themselves."""
    from test_prepare import read_split

    from transformer import data
    from transformer.train.metrics import MetricsLog
    c = _config("stdlib", 4)
    c.model.vocab_size = 0
    c.data.update(tokenizer="byte", max_bytes=200_000)
    c.train.update(eval_every=2, eval_batches=1)
    _train(c, tmp_path)
    val = np.concatenate(read_split(data.load(c)[1].folder, "val"))
    ends = int((val == 256).sum())
    assert ends >= 1
    per_byte = len(val) / (len(val) - ends)  # every other token is a byte
    evals = [m for m in MetricsLog(tmp_path).read() if "val_loss" in m]
    assert [m["step"] for m in evals] == [2, 4]
    for m in evals:
        assert m["val_bpb"] == pytest.approx(m["val_loss"] / math.log(2) * per_byte, rel=1e-12)


def test_bits_per_byte_of_a_char_model_on_multibyte_text_matches_a_hand_count(tmp_path):
    """A corpus of "aé你😀" (4 characters, 1+2+3+4 = 10 UTF-8 bytes) 1,000 times: one file too
    small to split by document, so its last 10% (400 characters, 1,000 bytes) is held out, with
    the file's end-of-text token: 401 tokens for 1,000 bytes, so val_bpb = val_loss / ln 2 ·
    0.401 (a byte-count slip, e.g. 1 byte per character, shows)."""
    from transformer.train.metrics import MetricsLog
    corpus = tmp_path / "text.txt"
    corpus.write_text("aé你😀" * 1000, encoding="utf-8")
    c = _config(str(corpus), 2)
    c.model.update(vocab_size=0, max_seq_len=32)
    c.data.update(tokenizer="char", max_bytes=10_000, val_fraction=0.1)
    c.train.update(eval_every=2, eval_batches=1, batch_size=4)
    _train(c, tmp_path / "run")
    [m] = [m for m in MetricsLog(tmp_path / "run").read() if "val_loss" in m]
    assert m["val_bpb"] == pytest.approx(m["val_loss"] / math.log(2) * 0.401, rel=1e-9)


def test_bpe_tokens_per_byte_is_the_compression_of_the_held_out_text():
    from test_prepare import read_split

    from transformer import data
    c = _config("stdlib", 1)
    c.model.update(vocab_size=0, max_seq_len=64)
    c.data.update(tokenizer="bpe", bpe_vocab_size=512, max_bytes=300_000)
    tokenizer, source = data.load(c)
    docs = read_split(source.folder, "val")
    ratio = data.tokens_per_byte(tokenizer, source)
    text_bytes = sum(len(tokenizer.decode(d).encode()) for d in docs)
    assert ratio == pytest.approx(sum(map(len, docs)) / text_bytes, rel=0.01)
    assert 0.2 < ratio < 0.8  # BPE merges bytes: fewer tokens than bytes

def test_after_a_skipped_step_the_logged_lr_is_the_one_applied_and_the_run_ends_at_the_floor(
        tmp_path):
    """A batch poisoned with NaN at step 3 of 8, train.nonfinite=skip. The rate each step
    applied is read off the weights (every step checkpointed; Adam with b1 = b2 = 0, no decay,
    no clipping moves every weight by lr·g/(|g| + eps), so the largest move is lr to ~1e-6):
    it equals the logged `lr` at every step, the skipped step moved nothing and logs 0, and
    the schedule counts steps, skipped or not, so the last update is at lr·min_lr_ratio.
    (Before, the skip also rewound the schedule: every later step applied the rate of the
    step before it, logged the next one's, and the run ended above the floor.)"""
    from transformer import checkpoint
    from transformer.train import optimizer
    from transformer.train.faults import TestHooks
    from transformer.train.metrics import MetricsLog

    c = _config("copy", 8)
    c.model.matmul = "plain"
    c.train.update(warmup_steps=2, lr=1e-2, min_lr_ratio=0.25, b1=0.0, b2=0.0,
                   weight_decay=0.0, grad_clip=0.0, nonfinite="skip", log_every=1,
                   ckpt_every=1, keep_checkpoints=100)
    train_quietly(c, tmp_path, hooks=TestHooks(nan_step=3))

    logged = {m["step"]: m["lr"] for m in MetricsLog(tmp_path).read() if "lr" in m}
    params = {s: checkpoint.load_run(tmp_path, step=s).params for s in range(1, 9)}
    # in numpy (float32 as the step's): eagerly, each op on each leaf shape was an XLA program
    applied = {s: max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in
                      zip(jax.tree.leaves(params[s]), jax.tree.leaves(params[s - 1])))
               for s in range(2, 9)}
    assert applied[3] == 0.0 and logged[3] == 0.0  # the skipped step: nothing applied
    schedule = optimizer.learning_rate(c.train)
    for s in (2, 4, 5, 6, 7, 8):
        assert applied[s] == pytest.approx(logged[s], rel=1e-4), (s, applied, logged)
        assert logged[s] == pytest.approx(float(schedule(s - 1)), rel=1e-6)
    assert applied[8] == pytest.approx(1e-2 * 0.25, rel=1e-4)  # the floor, skip or not


@pytest.mark.parametrize("nan_step", [3, 6])
def test_every_line_counts_the_skipped_steps_up_to_its_own(tmp_path, nan_step, shared_trainers):
    """train.nonfinite=skip, a NaN batch at step 3 (mid-run) or 6 (the last) of 6, a line
    every step: each line's skipped_steps counts the skipped steps up to and including its
    own step, so the skipped step's line (lr 0) says 1, as does the checkpoint."""
    from transformer import checkpoint
    from transformer.train.faults import TestHooks
    from transformer.train.metrics import MetricsLog

    c = _config("copy", 6)
    c.train.update(batch_size=4, warmup_steps=1, nonfinite="skip", log_every=1)
    train_quietly(c, tmp_path, hooks=TestHooks(nan_step=nan_step))
    lines = {m["step"]: m for m in MetricsLog(tmp_path).read() if "train_loss" in m}
    assert sorted(lines) == [1, 2, 3, 4, 5, 6]
    assert lines[nan_step]["lr"] == 0.0
    for step, m in lines.items():
        assert m["skipped_steps"] == int(step >= nan_step), (step, m)
    assert checkpoint.load_run(tmp_path).meta["skipped_steps"] == 1


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_the_cpu_step_updates_params_and_optimizer_state_where_they_lie(optimizer):
    """The step's state is donated, so XLA updates params and moments in place. On CPU the
    compiled step copies none of them first. (With the non-finite guard as a select, XLA
    computed each moment in two fusions that both read the old moment, one of them writing
    it in place, and so copied every moment and parameter before the update: ~30 MB a step at
    the bench's shape, the step 1.07x.)"""
    import re

    from transformer.train import trainer as training

    c = _config("copy", 4)
    c.train.optimizer = optimizer
    t = training.Trainer.build(c)
    B, T = c.train.batch_size, c.model.max_seq_len
    batch = {"inputs": jax.ShapeDtypeStruct((B, T), jnp.int32),
             "targets": jax.ShapeDtypeStruct((B, T), jnp.int32),
             "weights": jax.ShapeDtypeStruct((B, T), jnp.float32)}
    hlo = t.step_fn.lower(t.abstract_state(), batch).compile().as_text()
    entry = hlo[hlo.index("\nENTRY "):]
    entry = entry[:entry.index("\n}")]
    # The entry's array parameters (the state's leaves and the batch), then copies of them.
    arrays = set(re.findall(r"%([\w.\-]+) = \w+\[\d[\d,]*\]\S* parameter\(", entry))
    copied = [name for name in re.findall(r" copy\(%([\w.\-]+)\)", entry) if name in arrays]
    assert len(arrays) > 3 * len(jax.tree.leaves(t.abstract_state().params)) // 2
    assert copied == [], copied


@pytest.mark.skipif(__import__("platform").libc_ver()[0] != "glibc",
                    reason="the settings are glibc's (scratch.py)")
def test_a_cpu_step_reuses_the_scratch_pages_of_the_step_before():
    """A train step keeps ~100 MB of scratch (its activations). As glibc and XLA come, the
    kernel maps in every page of it again each step (one page fault per 4 KiB page, each
    zeroed); with scratch.py's two settings the next step reuses the same pages. Each case
    runs in a process of its own (tests/scratch_check.py): the settings are process-wide."""
    import json

    from tests.conftest import run_cli
    found = {}
    for case in ("kept", "as_is"):
        result = run_cli("tests/scratch_check.py", case, fork=False)
        assert result.returncode == 0, result.stderr[-2000:]
        found[case] = json.loads(result.stdout.strip().splitlines()[-1])
    pages = found["as_is"]["scratch_pages"]
    assert found["as_is"]["faults_per_step"] > pages // 2, found  # the cost is real
    assert found["kept"]["faults_per_step"] < pages // 20, found  # and gone


def test_train_profile_leaves_a_trace_of_its_steps_and_changes_no_number(tmp_path, copy_run):
    """train.profile=3:5 writes a jax.profiler trace (TensorBoard's xplane.pb and a Chrome /
    Perfetto trace.json.gz) into the workdir, and the run ends with the same params and logs
    the same losses as the run without it (copy_run), bit for bit."""
    import gzip
    import json

    from transformer import config as config_lib
    from transformer.train.metrics import MetricsLog

    plain, plain_dir = copy_run
    c = _copy30()
    c.train.profile = "3:5"
    lines = []
    traced, _ = train_quietly(c, tmp_path / "traced", log=lines.append)
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(traced)):
        np.testing.assert_array_equal(a, b)
    losses = [[m["train_loss"] for m in MetricsLog(w).read() if "train_loss" in m]
              for w in (plain_dir, tmp_path / "traced")]
    assert losses[0] == losses[1] and len(losses[0]) == 30
    [folder] = (tmp_path / "traced" / "plugins" / "profile").iterdir()
    assert list(folder.glob("*.xplane.pb")) and any(f.stat().st_size for f in folder.iterdir())
    [chrome] = [f for f in folder.glob("*.trace.json.gz")]
    events = json.loads(gzip.decompress(chrome.read_bytes()))["traceEvents"]
    assert any(e.get("dur") for e in events)  # timed events: the steps' work
    assert any(line.startswith("profile: steps 3..4 traced into") for line in lines)
    from transformer.tools import trace  # python -m transformer trace: the steps, per op
    summary = trace.summarize(trace.newest_trace(tmp_path / "traced"))
    assert summary["executions"] == 2 and summary["ops"] and summary["kinds"]["matmul"] > 0
    assert sum(summary["kinds"].values()) == pytest.approx(summary["op_ms"])
    assert not (plain_dir / "plugins").exists()

    for bad in ("5:3", "0:2", "3", "a:b", "5:40"):  # 5:40 ends after the run's 30 steps
        with pytest.raises(config_lib.ConfigError, match="^train.profile="):
            config_lib.validate(config_lib.replace(c, **{"train.profile": bad}))


def test_trace_counts_a_conds_body_once_not_the_cond_too(tmp_path):
    """A cond's event spans the ops it ran (here one on its own thread, one on another): op
    time is the ops' time, and the cond is not listed as an op of its own."""
    import gzip
    import json

    from transformer.tools import trace

    def op(name, ts, dur, tid, run="1"):
        return {"ph": "X", "pid": 1, "tid": tid, "ts": ts, "dur": dur, "name": name,
                "args": {"hlo_module": "jit_step", "hlo_op": name, "run_id": run}}

    events = [op("dot.1", 0, 100, 1), op("cond.7", 100, 400, 1), op("add_fusion.2", 150, 200, 1),
              op("ynn_fusion.3", 120, 300, 2), op("copy.4", 500, 50, 1)]
    path = tmp_path / "host.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    summary = trace.summarize(path)
    assert summary["op_ms"] == pytest.approx((100 + 200 + 300 + 50) / 1000)
    assert "cond.7" not in dict(summary["ops"])
    assert summary["wall_ms"] == pytest.approx(550 / 1000) and summary["executions"] == 1


def test_the_final_evaluation_scores_its_budget_of_fixed_windows_or_the_whole_split(tmp_path):
    """evaluate_final, what the last step reports: train.eval_tokens=0 is the mean loss over
    every window of the validation split; a budget of k windows' tokens is the mean over the k
    windows evenly spaced over the split (prepared.spaced), whatever the seed. Both computed
    here window by window, with a batch size that divides neither count (the last batch's
    rows past the windows count nothing)."""
    from transformer import data
    from transformer.data.prepared import spaced
    from transformer.train.step import loss_fn
    from transformer.train.trainer import Trainer, evaluate_final
    c = _config("stdlib", 1)
    c.model.vocab_size = 257  # the bytes and the end-of-text token
    c.data.update(tokenizer="byte", max_bytes=150_000)
    _, source = data.load(c)
    n, k = source.windows["val"], 11
    c.train.batch_size = next(b for b in (7, 6, 5) if n % b and k % b)
    trainer = Trainer.build(c)
    params = trainer.init(0).params
    T = c.model.max_seq_len
    loss = jax.jit(lambda p, b: loss_fn(p, b, trainer.model_config))

    def by_hand(ws):
        rows = np.stack([source.shards["val"][s].read((w - source.starts["val"][s]) * T, T + 1)
                         for w in ws
                         for s in [int(np.searchsorted(source.starts["val"], w, "right") - 1)]]
                        ).astype(np.int32)
        return float(loss(params, {"inputs": rows[:, :-1], "targets": rows[:, 1:],
                                   "weights": np.ones((len(ws), T), np.float32)}))

    whole = by_hand(range(n))
    assert evaluate_final(trainer, params, source, 0, 0) == pytest.approx(whole, rel=1e-5)
    assert evaluate_final(trainer, params, source, 0, n * T + 5) == pytest.approx(whole,
                                                                                rel=1e-5)
    fixed = by_hand(spaced(n, k))
    for seed in (0, 3):  # the budget's windows are the same for every seed
        assert evaluate_final(trainer, params, source, seed, k * T + T - 1) == \
            pytest.approx(fixed, rel=1e-5)
    assert fixed != pytest.approx(whole, rel=1e-5)
    # the run's data line says what the final loss scores
    c.train.eval_tokens = k * T
    assert f"the final val loss scores {k * T:,} val tokens of {n * T:,} ({k:,} evenly " \
        f"spaced windows of {n:,}" in source.describe(c)
    c.train.eval_tokens = 0
    assert f"scores the whole val split ({n * T:,} tokens, train.eval_tokens=0)" in \
        source.describe(c)


def test_the_budgets_windows_are_evenly_spaced_over_the_split():
    """k of n windows: k distinct, in order, first at 0, gaps of floor or ceil of n/k; all n
    when k is 0 or at least n."""
    from transformer.data.prepared import spaced
    for n, k in ((10, 3), (1000, 7), (4096, 4095), (5, 5), (5, 9), (6, 0), (1, 1)):
        w = spaced(n, k)
        if k == 0 or k >= n:
            assert list(w) == list(range(n))
            continue
        gaps = np.diff(np.append(w, n))
        assert len(w) == k and w[0] == 0 and set(gaps) <= {n // k, -(-n // k)}, (n, k, w)
