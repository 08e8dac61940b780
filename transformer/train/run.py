"""A training run, start to end: what `python train.py` does.

    run = start.prepare(config, workdir)                 reads only: every value worked out once
    state = train(run, Options(...))                     trains, or resumes the run in workdir

In order: resolve the config, make the mesh, find the checkpoint to continue from, load the
data and fill in the config's derived values (start.prepare, reading only: a refused run leaves
its workdir as it was), then claim the workdir (start.claim: lock, damaged checkpoints aside),
build the compiled step for the mesh (trainer.Trainer), take the state (start.initial_state:
restored, imported or fresh), and run the loop (loop.Loop) to `train.steps`. The caller keeps
the Run: the tokenizer, the mesh and the config as resolved are what a sample after training
needs (train.py).

The batch at step s is a pure function of (seed, s) and every save holds params, optimizer
state and step, so a run restarted on its workdir continues where its last checkpoint stood.
On the same mesh it continues bit for bit; a checkpoint restores bit-exactly onto any mesh,
and continuing on another mesh is correct but not bitwise (a different split sums in another
order). tests/test_resume.py kills runs to check it.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor

import jax

from transformer import data
from transformer.config import ModelConfig, depth, resume
from transformer.hf import load as hf_import
from transformer.model import flops, sizes
from transformer.model.gpt import count_params
from transformer.model.kernels import auto as matmul_auto
from transformer.parallel import sharding
from transformer.train import start as start_lib
from transformer.train import trackers
from transformer.train.loop import Loop, Options
from transformer.train.metrics import MetricsLog
from transformer.train.trainer import Trainer

def train(run: start_lib.Run, options: Options = Options()):
    """Trains (or resumes) the run that start.prepare worked out; returns the state after its
    last step.

    On several processes every process calls this; only process 0 logs and writes metrics,
    and orbax coordinates the checkpoint writes. `options.stop_at` ends this invocation early
    at that step (with a checkpoint), as an interruption would; running again continues the
    same schedule to `train.steps`. `options.hooks` provoke faults (tests only).

    The step compiles in a thread while the state is made (restored, imported or
    initialised, itself a compile) and evaluation and a save's fingerprints compile, so a
    2-core machine compiles them side by side. `options.alongside(run, trainer)`, if given,
    runs in a thread while the run trains and has finished when this returns: train.py
    compiles its end-of-training sample's program there (an exception in it is the caller's
    to catch inside it).

    Raises signals.Stopped after saving on SIGINT/SIGTERM, faults.NonFiniteError on NaN/inf,
    workdir.WorkdirError when another run holds the workdir."""
    main_process = jax.process_index() == 0
    if not main_process:
        options = dataclasses.replace(options, log=lambda _: None, progress=False)
    log, config = options.log, run.config
    with start_lib.claim(run), ThreadPoolExecutor(2, "compile") as threads:
        trainer = Trainer.build(config, run.mesh)
        t = config.train
        batch = run.source.batch(t.seed, "train", 0, t.batch_size, rows=[0])  # for its shapes
        # The step, the longest compile, in a thread; this thread makes the state (for a
        # fresh run the init, a compile) and then compiles evaluation and a save's
        # fingerprints, so the two cores share ~7 s of single-threaded compiling evenly.
        compiling = threads.submit(trainer.precompile, batch, ("step",))
        state, skipped = start_lib.initial_state(trainer, run)
        _precompile_quietly(trainer, batch, ("eval", "save"))
        restored = run.found.step if run.found else 0
        # TensorBoard curves continue after the restored step (earlier events from there on
        # are purged): only process 0 writes.
        tracker = trackers.open_for(run.workdir, restored, config) if main_process else None
        metrics_log = MetricsLog(run.workdir, enabled=main_process, tracker=tracker)
        # This invocation's first line names its kernels (a resumed run may run other ones).
        metrics_log.add_to_next(matmul=run.matmul.mode, matmul_reason=run.matmul.reason)
        # Later steps are redone and logged again (a run killed before its first checkpoint
        # starts over: its lines go too).
        metrics_log.truncate_after(restored)
        finished = run.found is not None and run.found.step >= t.steps
        if run.found:
            log(finished_line(run.workdir, run.found.step) if finished else
                f"resuming from step {run.found.step}")
            options = dataclasses.replace(options, progress=options.progress and not finished)
            changed = resume.computing_differently(run.changes)
            if changed:
                log(changed)
        elif t.init_from:
            log(hf_import.describe(config, run.tokenizer))
        log(summary(config, state.params, run.tokenizer, data.describe(config, run.source)))
        log(matmul_auto.describe(run.matmul))
        log(sharding.describe(trainer.mesh))
        compiling.exception()  # wait: a first step during its compile would compile again;
        # a compile that failed here fails again, with its error, at that first step
        if options.alongside is not None:
            threads.submit(options.alongside, run, trainer)
        try:
            state = Loop(trainer, run, metrics_log, options).train(state, skipped)
        finally:
            metrics_log.close()
    return state


def _precompile_quietly(trainer: Trainer, batch: dict, which) -> None:
    """trainer.precompile, whose failure is left for the first real call to report."""
    try:
        trainer.precompile(batch, which)
    except Exception:  # noqa: BLE001 - the same call, uncompiled, raises it properly
        pass


def finished_line(workdir, step: int) -> str:
    return (f"{workdir} is finished: its checkpoint is at step {step} = train.steps; to train "
            f"longer pass --config.train.steps=N (N > {step}) --allow_change=train.steps; "
            f"to sample: python sample.py --workdir={workdir}")


def summary(config, params, tokenizer, corpus_desc: str) -> str:
    """The start-up summary: `python -m transformer sizes`'s report for this run, then its
    variant and what it trains on."""
    t = config.train
    model_config = ModelConfig.from_config(config)
    m = config.model
    window = f", window {m.sliding_window}" if m.sliding_window else ""
    lines = [sizes.summary(model_config, batch=t.batch_size, check=False),
             *filter(None, [depth.describe(config)]),
             f"variant: {m.position} positions, {m.norm_placement}-{m.norm}, {m.mlp} MLP, "
             f"{model_config.kv_heads} K/V heads, {m.attention_kernel} attention{window}"]
    counted, real = flops.param_counts(model_config)["total"], count_params(params)
    if counted != real:  # flops.py fell behind model/gpt.py; tests/test_flops.py should catch it
        lines.append(f"warning: flops.py counts {counted:,} params, the model has {real:,}")
    tokens_per_step = t.batch_size * config.model.max_seq_len
    total_tokens = tokens_per_step * t.steps
    accum = (f" in {t.grad_accum} micro-batches of {t.batch_size // t.grad_accum} rows"
             if t.grad_accum > 1 else "")
    lines.append(f"data: {corpus_desc}, {tokenizer.kind} tokenizer; {tokens_per_step:,} "
                 f"tokens/step{accum}, {t.steps:,} steps = {total_tokens:,} tokens, "
                 f"{flops.train_flops_per_token(model_config) * total_tokens:.3g} FLOPs")
    return "\n".join(lines)
