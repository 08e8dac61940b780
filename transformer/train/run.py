"""A training run, start to end: `train(config, workdir)` is what `python train.py` does.

    state, tokenizer = train(config, workdir)            trains, or resumes the run in workdir

In order: check everything that needs no write (start.prepare: config, corpus, checkpoint,
a changed config), claim the workdir (start.claim: lock, damaged checkpoints aside), build
the compiled step for the mesh (training.Trainer), take the state (restored or fresh), and
run the loop (loop.Loop) to `train.steps`.

The batch at step s is a pure function of (seed, s) and every save holds params, optimizer
state and step, so a run restarted on its workdir continues where its last checkpoint stood.
On the same mesh it continues bit for bit; a checkpoint restores bit-exactly onto any mesh,
and continuing on another mesh is correct but not bitwise (a different split sums in another
order). tests/test_resume.py kills runs to check it.
"""

from __future__ import annotations

import time
from typing import Callable

import jax

from transformer import config as config_lib
from transformer import data
from transformer.model.kernels import auto as matmul_auto
from transformer.parallel import sharding
from transformer.train import checkpoint, trackers
from transformer.train import start as start_lib
from transformer.train.faults import NO_HOOKS, NonFiniteGuard, TestHooks
from transformer.train.loop import Loop
from transformer.train.metrics import MetricsLog, Progress
from transformer.train.trainer import Trainer, summary


def train(config, workdir, log: Callable[[str], None] = print, progress: bool = True,
          mesh=None, stop_at: int | None = None, allow_change=(), hooks: TestHooks = NO_HOOKS):
    """Trains (or resumes) the run in `workdir` on `mesh` (default: from config.mesh).

    Returns (state, tokenizer). On several processes every process calls this; only process 0
    logs and writes metrics, and orbax coordinates the checkpoint writes. `stop_at` ends this
    invocation early at that step (with a checkpoint), as an interruption would; running
    again continues the same schedule to `train.steps`. `hooks` provoke faults (tests only).

    Raises signals.Stopped after saving on SIGINT/SIGTERM, faults.NonFiniteError on NaN/inf,
    checkpoint.WorkdirError when another run holds the workdir."""
    # This run's own copy with `auto` resolved: the caller's config is never changed.
    config, matmul = matmul_auto.resolve(config_lib.replace(config_lib.validate(config)))
    main_process = jax.process_index() == 0
    if not main_process:
        log, progress = (lambda _: None), False
    mesh = sharding.make_mesh(config.mesh) if mesh is None else mesh
    plan = start_lib.prepare(config, workdir, mesh, allow_change)
    with start_lib.claim(plan):
        trainer = Trainer.build(plan.config, mesh)
        state, skipped = start_lib.initial_state(trainer, plan)
        restored = plan.found.step if plan.found else 0
        # TensorBoard curves continue after the restored step (earlier events from there on
        # are purged): only process 0 writes.
        tracker = trackers.open_for(plan.workdir, restored, plan.config) if main_process \
            else None
        metrics_log = MetricsLog(plan.workdir, enabled=main_process, tracker=tracker)
        # This invocation's first line names its kernels (a resumed run may run other ones).
        metrics_log.add_to_next(matmul=matmul.mode, matmul_reason=matmul.reason)
        # Later steps are redone and logged again (a run killed before its first checkpoint
        # starts over: its lines go too).
        metrics_log.truncate_after(restored)
        if plan.found:
            log(f"resuming from step {plan.found.step}")
        log(summary(plan.config, state.params, plan.tokenizer,
                    data.corpus.describe(plan.config.data.corpus)))
        log(matmul_auto.describe(matmul))
        log(sharding.describe(trainer.mesh))
        meta = {"config": config_lib.to_dict(plan.config), "tokenizer": plan.tokenizer.to_json(),
                "matmul_reason": matmul.reason}
        try:
            state = _run_loop(trainer, plan, state, skipped, metrics_log, meta, stop_at,
                              progress, hooks, log)
        finally:
            metrics_log.close()
    return state, plan.tokenizer


def _run_loop(trainer, plan, state, skipped, metrics_log, meta, stop_at, progress, hooks,
              log):
    t = plan.config.train
    begin, first = time.perf_counter(), int(state.step)
    end = t.steps if stop_at is None else min(stop_at, t.steps)
    ckpts = checkpoint.Checkpoints(plan.workdir, keep=t.keep_checkpoints)
    bar = Progress(first, t.steps, enabled=progress)
    hooks.install()
    guard = NonFiniteGuard(t.nonfinite, skipped)
    loop = Loop(trainer, plan.source, ckpts, metrics_log, meta, guard, hooks, bar,
                data.tokens_per_byte(plan.tokenizer, plan.source))
    try:
        state = loop.run(state, first, end)
    finally:
        bar.close()
        ckpts.wait()  # a save in flight is committed even when the run stops with an error
        ckpts.close()
    if first < end:
        log(f"trained steps {first}..{end} in {time.perf_counter() - begin:.1f}s")
    return state
