"""TensorBoard curves (train/trackers.py): every run writes event files in its workdir, and a
run SIGKILLed after logging steps it had not saved yet, then resumed, shows one value per
logged step, equal to metrics.jsonl. Read back with TensorBoard's own event reader, which
applies the purge a resumed writer asks for (what the user's `tensorboard --logdir` sees)."""

from __future__ import annotations

import json
import signal

import pytest

from tests.conftest import train_quietly
from tests.test_resume import committed, run, start, train_args, wait_for, write_corpus
from transformer.train import trackers

STEPS = 24


def logged_steps(workdir) -> list[int]:
    path = workdir / "metrics.jsonl"
    if not path.exists():
        return []
    steps = []
    for line in path.read_text().splitlines():
        try:
            steps.append(json.loads(line)["step"])
        except (ValueError, KeyError):
            pass  # a line cut short by the kill
    return steps


def read_events(workdir):
    """{tag: [(step, value), ...]} and {tag: [(step, text), ...]} as TensorBoard shows them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(workdir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    scalars = {tag: [(e.step, e.value) for e in acc.Scalars(tag)]
               for tag in acc.Tags()["scalars"]}
    texts = {tag: [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors(tag)]
             for tag in acc.Tags()["tensors"]}
    return scalars, texts


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tb")
    corpus = write_corpus(tmp / "text.txt")
    workdir = tmp / "run"
    # Saves every 8 steps, logs every 4: a kill can land after a logged step that the
    # resumed run must redo (and log again).
    args = train_args(corpus, workdir, steps=STEPS, ckpt_every=8,
                      extra=["--config.sample.max_new_tokens=4"])  # the sample is an event here
    proc = start(args, step_delay=0.05)
    wait_for(lambda: committed(workdir) and max(logged_steps(workdir)) > max(committed(workdir)),
             proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = (max(committed(workdir)), max(logged_steps(workdir)))
    out = run(args)
    assert out.returncode == 0, out.stderr
    assert f"resuming from step {killed_at[0]}" in out.stdout
    return workdir, killed_at, out.stdout


def test_resumed_run_has_one_value_per_logged_step_equal_to_metrics_jsonl(killed_and_resumed):
    workdir, (saved, logged), _ = killed_and_resumed
    assert len(list(workdir.glob("events.out.tfevents.*"))) >= 2  # the killed run's, the new
    lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    scalars, _ = read_events(workdir)
    checked = set()
    for key, tag in trackers.TAGS.items():
        expected = [(line["step"], line[key]) for line in lines if key in line]
        if not expected:
            continue
        got = scalars[tag]
        steps = [s for s, _ in got]
        assert steps == sorted(set(steps)), f"{tag}: duplicated or doubled-back steps {steps}"
        assert steps == [s for s, _ in expected], tag
        assert [v for _, v in got] == pytest.approx([v for _, v in expected], rel=1e-6), tag
        checked.add(key)
    assert {"train_loss", "val_loss", "val_bpb", "lr", "grad_norm", "tokens_per_s",
            "mfu"} <= checked
    # The kill landed after a logged step past the checkpoint: it was redone, once.
    assert logged > saved
    assert [s for s, _ in scalars["train/loss"]] == list(range(4, STEPS + 1, 4))


def test_end_of_training_sample_is_a_text_event(killed_and_resumed):
    workdir, _, stdout = killed_and_resumed
    _, texts = read_events(workdir)
    [(step, text)] = texts["sample/text_summary"]
    assert step == STEPS
    sample = stdout.split("--- sample (prompt 'the ') ---\n")[1].rstrip("\n")
    assert text == "```\n" + sample + "\n```"


class FakeWandb:
    """Stands in for the wandb package: records what a run asks of it."""

    def __init__(self):
        self.inits, self.logged, self.finished = [], [], 0

    def init(self, **kwargs):
        self.inits.append(kwargs)
        fake = self

        class Run:
            summary = {}

            def log(self, values, step):
                fake.logged.append((step, values))

            def finish(self):
                fake.finished += 1
        return Run()


def wandb_config(corpus, steps):
    from transformer.config import base_config

    c = base_config()
    c.model.update(vocab_size=0, d_model=32, n_layers=1, n_heads=2, d_ff=64, max_seq_len=32,
                   matmul="plain")
    c.data.update(corpus=str(corpus), tokenizer="char")
    c.train.update(steps=steps, batch_size=4, warmup_steps=2, log_every=2, eval_every=4,
                   eval_batches=1, ckpt_every=100, wandb="offline", wandb_project="tests")
    return c


def test_wandb_gets_the_same_numbers_and_a_resumed_run_keeps_its_id(tmp_path, monkeypatch,
                                                                     shared_trainers):
    """(The resumed run takes the first one's Trainer: conftest.one_trainer_per_config.)"""
    import sys

    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    corpus, workdir = write_corpus(tmp_path / "text.txt"), tmp_path / "run"
    config = wandb_config(corpus, steps=8)
    train_quietly(config, workdir, stop_at=4)
    train_quietly(config, workdir)  # resumes at 4
    first, second = fake.inits
    assert first["id"] == second["id"] == (workdir / "wandb_run_id").read_text().strip()
    assert first["resume"] == "allow" and first["mode"] == "offline"
    assert first["dir"] == str(workdir) and first["project"] == "tests"
    assert first["config"]["train"]["wandb"] == "offline" and fake.finished == 2
    lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    expected = [(line["step"], {trackers.TAGS[k]: v for k, v in line.items() if k in trackers.TAGS})
                for line in lines]
    assert [s for s, _ in fake.logged] == [s for s, _ in expected] == [2, 4, 4, 6, 8, 8]
    for (_, got), (_, want) in zip(fake.logged, expected):
        assert got == pytest.approx(want)


def test_wandb_missing_is_a_config_error(tmp_path, monkeypatch):
    import sys

    from transformer.config import ConfigError

    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[wandb\]'"):
        trackers.WandB(tmp_path, "offline", "tests")


def test_wandb_offline_for_real_writes_one_run_per_workdir(tmp_path):
    """With the wandb package (the `wandb` extra; not in `test`): two opens of one workdir
    write two offline segments of the same run id, with no network."""
    pytest.importorskip("wandb")
    for _ in range(2):
        tracker = trackers.WandB(tmp_path, "offline", "tests", {"a": 1})
        tracker.log(1, {"train_loss": 2.5, "note": "x"})
        tracker.close()
    run_id = (tmp_path / "wandb_run_id").read_text().strip()
    segments = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert len(segments) == 2 and all(p.name.endswith(run_id) for p in segments)


def test_writing_events_does_not_import_torch_and_leaves_it_importable(tmp_path):
    """tensorboardX's package imports torch when installed (1.2 s of every run's start):
    the writer is imported without it, and torch still imports afterwards, in a fresh
    process (this one may have torch imported already)."""
    import subprocess
    import sys

    pytest.importorskip("torch")
    code = ("import sys\n"
            "from transformer.train import trackers\n"
            f"t = trackers.TensorBoard({str(tmp_path)!r}, purge_step=1)\n"
            "t.log(1, {'train_loss': 1.5}); t.close()\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n"
            "import torch\n"
            "print('torch', torch.__version__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("torch ")
    assert list(tmp_path.glob("events*"))
