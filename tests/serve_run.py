"""Shared by the server's test files: one tiny byte-level run trained on English, Russian and
Chinese text and one tiny char-level run (each once per test session, by whichever file and
xdist worker asks first), and a server process on a free 127.0.0.1 port that stops when
its `with` block ends."""

from __future__ import annotations

import contextlib
import random
import subprocess
import time

import httpx

from tests.conftest import ROOT, fork_popen, free_port, shared_dir
from tests.test_resume import MODEL, env_with, run, write_corpus

WORDS = {
    "en": "the quick brown fox jumps over a lazy dog while seven wizards hex jolly boxes",
    "ru": "быстрая коричневая лиса прыгает через ленивую собаку и съешь ещё этих булок",
    "zh": "敏捷 的 棕色 狐狸 跳过 了 懒狗 我们 今天 学习 中文 汉字",
}
BYTE_MODEL = ["--config=configs/tiny.py", "--config.model.d_model=32", "--config.model.n_heads=2",
              "--config.model.n_layers=1", "--config.model.d_ff=64",
              "--config.model.max_seq_len=64", "--config.model.vocab_size=0",
              "--config.data.tokenizer=byte", "--config.model.matmul=plain",
              "--config.train.batch_size=8",
              "--config.train.warmup_steps=4", "--config.train.log_every=20",
              "--config.train.eval_every=60", "--config.train.eval_batches=1",
              "--config.sample.max_new_tokens=0", "--config.sample.prompt=the ", "--no_progress"]
CONTEXT = 64
# The servers' tests read a trained run, not how well it is trained: 60 steps. lm-eval's
# comparison (test_lm_eval.py, -m slow) asks for its answers from a run of 300.
STEPS = 60


def corpus_text() -> str:
    rng = random.Random(0)
    lines = []
    for _ in range(300):
        for words in WORDS.values():
            lines.append(" ".join(rng.choices(words.split(), k=7)) + ".\n")
    return "".join(lines)


def byte_run(tmp_path_factory, steps=STEPS):
    """The workdir of the session's trained byte-level run of `steps` steps (trained once, by
    whichever xdist worker asks first; the servers only read it)."""
    def train(folder):
        corpus = folder / "text.txt"
        corpus.write_text(corpus_text(), encoding="utf-8")
        out = run(["train.py", *BYTE_MODEL, f"--config.data.corpus={corpus}",
                   f"--workdir={folder / 'run'}", f"--config.train.steps={steps}",
                   f"--config.train.ckpt_every={steps}"])
        assert out.returncode == 0, out.stderr
    return shared_dir(tmp_path_factory, f"serve-byte-run-{steps}", train) / "run"


def char_run(tmp_path_factory):
    """The workdir of the session's tiny char-level run (test_resume's MODEL, 60 steps) that
    test_serve.py and test_serve_batching.py serve: trained once, read only."""
    def train(folder):
        corpus = write_corpus(folder / "text.txt")
        out = run(["train.py", *MODEL, f"--config.data.corpus={corpus}",
                   f"--workdir={folder / 'run'}", "--config.train.steps=60",
                   "--config.train.ckpt_every=60"])
        assert out.returncode == 0, out.stderr
    return shared_dir(tmp_path_factory, "serve-char-run", train) / "run"


@contextlib.contextmanager
def server(workdir, *flags, name="tiny", max_tokens=64, start_timeout=240, hf=False):
    """A `python -m transformer serve` process (of a Hugging Face folder with `hf`); yields
    its base URL and the process."""
    port = free_port()
    # A child of the fork server (tests/conftest.py's ForkedProcess: no new Python start-up),
    # at a pid of its own; its output is read if it fails to start.
    source = f"--hf={workdir}" if hf else f"--workdir={workdir}"
    proc = fork_popen(["-m", "transformer", "serve", source, f"--port={port}",
                       f"--max_tokens={max_tokens}", f"--name={name}", *flags],
                      cwd=ROOT, env=env_with(), stderr_to_stdout=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "the server did not start"
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        yield base, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def model_logprobs(workdir, ids):
    """(log p(ids[t] | ids[:t]) for t >= 1, the full [T, V] log-softmax, the tokenizer), from
    the model's own forward pass (GPT.apply), not the server's scoring program."""
    import jax
    import numpy as np

    from transformer.checkpoint import load_run
    from transformer.model.gpt import GPT

    run_ = load_run(workdir)
    forward = jax.jit(lambda p, x: GPT(run_.model_config).apply({"params": p}, x))  # not op by op
    logits = forward(run_.params, np.asarray([ids], np.int32))
    logp = np.asarray(jax.nn.log_softmax(np.asarray(logits[0], np.float32), axis=-1))
    return logp[np.arange(len(ids) - 1), ids[1:]], logp, run_.tokenizer


def settled_job(fn=None, error: BaseException | None = None):
    """What a fake engine's `submit(fn)` returns: a job already done, with fn(job)'s result
    or `error` (for app-level tests that need no model)."""
    import concurrent.futures

    class Job:
        future = concurrent.futures.Future()

        def cancel(self):
            pass

    job = Job()
    if error is not None:
        job.future.set_exception(error)
    else:
        job.future.set_result(fn(job))
    return job
