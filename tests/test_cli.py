"""The real command lines in a subprocess: train → checkpoint → sample, resume, bad input."""

import json

import pytest
from conftest import run_cli

TINY = ["--config=configs/tiny.py", "--config.train.steps=20", "--config.train.ckpt_every=10",
        "--config.train.eval_every=10", "--config.data.max_bytes=100000", "--no_progress"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """train.py's run, its checkpoint metas read counted (tests/meta_reads.py)."""
    workdir = tmp_path_factory.mktemp("run")
    result = run_cli("tests/meta_reads.py", "train.py", *TINY, f"--workdir={workdir}")
    assert result.returncode == 0, result.stderr
    return workdir, result


def test_a_fresh_run_samples_at_its_end_with_no_checkpoint_read_back(trained):
    """The sample after training takes the config, tokenizer and mesh as the run's start
    worked them out (start.Run): a fresh run reads no checkpoint's meta, before training or
    after (it once read the newest one back to fill in vocab_size=0 as training had)."""
    _, result = trained
    assert "--- sample" in result.stdout
    assert result.stderr.strip().splitlines()[-1] == "checkpoint metas read: 0", result.stderr


def test_train_writes_checkpoints_metrics_and_prints_a_sample(trained):
    workdir, result = trained
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) == [
        "10", "20"]
    lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    train_lines = [m for m in lines if "train_loss" in m]
    assert [m["step"] for m in train_lines] == [10, 20]
    assert all(m["tokens_per_s"] > 0 for m in train_lines)
    # the learning rate of each logged step: tiny's lr 3e-3 at the end of its 10-step warmup,
    # exactly lr·min_lr_ratio (default 0.1) at the last step
    assert [m["lr"] for m in train_lines] == pytest.approx([3e-3, 3e-4], rel=1e-6)
    assert [m["step"] for m in lines if "val_loss" in m] == [10, 20]
    assert "--- sample" in result.stdout and "params:" in result.stdout


def test_sample_needs_only_the_workdir(trained):
    workdir, _ = trained
    result = run_cli("sample.py", f"--workdir={workdir}", "--prompt=def ", "--max_new_tokens=20",
                     "--temperature=0.8", "--top_k=40", "--top_p=0.95", "--num_samples=3",
                     "--seed=0")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("--- sample") == 3
    assert result.stdout.count("def ") >= 3
    again = run_cli("sample.py", f"--workdir={workdir}", "--prompt=def ", "--max_new_tokens=20",
                    "--temperature=0.8", "--top_k=40", "--top_p=0.95", "--num_samples=3",
                    "--seed=0")
    assert again.stdout == result.stdout  # same seed, same samples


@pytest.mark.slow  # in process: test_decode's long streams, test_textgen's streams and cut
def test_sample_streams_the_same_text_past_the_context(trained):
    """One sample streams by default; --no_stream prints the same text at the end. 200 new
    tokens from a 64-token model, after a prompt longer than its context (cut, with a note)."""
    workdir, _ = trained
    args = ["sample.py", f"--workdir={workdir}", "--prompt=" + "def f(x):\n" * 10,
            "--max_new_tokens=200", "--seed=1"]
    streamed, whole = run_cli(*args), run_cli(*args, "--no_stream")
    assert streamed.returncode == 0 and whole.returncode == 0, streamed.stderr + whole.stderr
    assert streamed.stdout == whole.stdout and streamed.stdout.count("--- sample") == 1
    assert "continuing from its last 64 tokens" in streamed.stderr
    assert len(streamed.stdout) > 100 + 200 * 0.5  # the prompt and (mostly one-byte) tokens


def test_second_train_resumes_at_the_saved_step(trained, tmp_path):
    workdir, _ = trained
    # Training longer changes the config: it must be allowed explicitly (docs/resume.md).
    result = run_cli("train.py", *TINY[:-1], "--config.train.steps=30", f"--workdir={workdir}",
                     "--no_progress", "--allow_change=train.steps",
                     "--config.sample.max_new_tokens=0")  # a free field: no sample this time
    assert result.returncode == 0, result.stderr
    assert "resuming from step 20" in result.stdout
    assert "computes differently from how it started: train.steps: 20 -> 30" in result.stdout
    lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines if "train_loss" in m] == [10, 20, 30]
    assert "--- sample" not in result.stdout


def test_ctrl_c_stops_a_long_streamed_sample_with_its_text_printed(trained):
    """10^8 new tokens, streamed: the generation runs in chunks, so SIGINT (Ctrl-C) stops it
    at the next chunk, with the text so far on stdout and exit status 130."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import ROOT
    workdir, _ = trained
    proc = subprocess.Popen([sys.executable, "sample.py", f"--workdir={workdir}", "--prompt=def ",
                             "--max_new_tokens=100000000", "--seed=0", "--noend_at_eot"],
                            cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        seen = ""
        deadline = time.monotonic() + 240
        while len(seen) < 300 and time.monotonic() < deadline:
            seen += proc.stdout.read(1)  # streamed text arrives while it is being made
        assert len(seen) >= 300, seen
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err
    assert (seen + out).startswith("--- sample 0") and (seen + out).endswith("\n")


def test_a_stream_whose_reader_goes_away_stops_quietly(trained):
    """sample.py | head: once the pipe's reader has gone, sample.py stops generating and exits
    with 128 + SIGPIPE, as `yes | head` does, saying nothing. The write's BrokenPipeError,
    raised inside the streaming callback, printed ~60 lines of traceback (exit 1)."""
    import subprocess
    import sys

    from conftest import ROOT
    workdir, _ = trained
    proc = subprocess.Popen([sys.executable, "sample.py", f"--workdir={workdir}", "--prompt=def ",
                             "--max_new_tokens=100000000", "--noend_at_eot"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.read(20)  # streamed text arrives while it is being made
        proc.stdout.close()  # the reader goes away; 10**8 tokens would run for hours
        err = proc.communicate(timeout=120)[1].decode()
    finally:
        proc.kill()
    assert proc.returncode == 141 and err == "", err[-2000:]


def test_resuming_in_another_precision_must_be_allowed(trained):
    """The run trained in the matmul mode auto picked here; the other precision (fast_f32 <->
    fast_bf16) computes other numbers, so resuming under it is refused, naming the field."""
    workdir, _ = trained
    first = json.loads((workdir / "metrics.jsonl").read_text().splitlines()[0])
    other = "fast_f32" if first["matmul"] == "fast_bf16" else "fast_bf16"
    result = run_cli("train.py", *TINY, "--config.train.steps=30", "--allow_change=train.steps",
                     f"--workdir={workdir}", f"--config.model.matmul={other}")
    assert result.returncode == 2 and "--allow_change=model.matmul" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("script,args,words", [
    ("train.py", ["--config.model.d_model=65"], "model.d_model=65"),
    ("train.py", ["--config.model.dmodel=64"], "dmodel"),
    ("train.py", ["--config.train.steps=ten"], "steps"),
    ("train.py", ["--config=configs/missing.py"], "missing.py"),
    ("train.py", ["--config.data.corpus=/no/such/corpus"], "/no/such/corpus"),
    ("sample.py", ["--top_p=1.5"], "top_p"),
    ("sample.py", ["--temperature=-1"], "temperature"),
])
def test_bad_input_is_one_line_and_a_nonzero_exit(trained, tmp_path, script, args, words):
    workdir, _ = trained
    if script == "train.py":
        args = ["--config=configs/tiny.py", f"--workdir={tmp_path / 'new'}", *args]
    else:
        args = [f"--workdir={workdir}", *args]
    result = run_cli(script, *args)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], result.stderr
    assert not (tmp_path / "new").exists()


def test_sample_on_a_workdir_without_checkpoint_fails_clearly(tmp_path):
    result = run_cli("sample.py", f"--workdir={tmp_path}")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.strip().startswith("error: ") and "train" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args,flag", [(["train.py"], "--config"), (["sample.py"], "--prompt"),
                                       (["-m", "transformer", "scaling"], "--sweep")])
def test_help_lists_the_program_flags(args, flag):
    """We parse flags without absl's app.run, which is where --help is usually defined."""
    result = run_cli(*args, "--help")
    assert "Unknown command line flag" not in result.stderr, result.stderr
    assert flag in result.stdout and "--workdir" in result.stdout
