"""A training run, start to end: `train(config, workdir)` is what `python train.py` does.

    state, tokenizer = train(config, workdir)            trains, or resumes the run in workdir

In order: resolve the config (start.resolve_config), read everything and check what needs no
write (start.prepare: checkpoint, data, derived values, resume rules), claim the workdir
(start.claim: lock, damaged checkpoints aside), build the compiled step for the mesh
(trainer.Trainer), take the state (start.initial_state: restored, imported or fresh), and
run the loop (loop.Loop) to `train.steps`.

The batch at step s is a pure function of (seed, s) and every save holds params, optimizer
state and step, so a run restarted on its workdir continues where its last checkpoint stood.
On the same mesh it continues bit for bit; a checkpoint restores bit-exactly onto any mesh,
and continuing on another mesh is correct but not bitwise (a different split sums in another
order). tests/test_resume.py kills runs to check it.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import jax

from transformer import checkpoint, data
from transformer import config as config_lib
from transformer.config import ModelConfig, depth, resume
from transformer.hf import load as hf_import
from transformer.model import flops, sizes
from transformer.model.gpt import count_params
from transformer.model.kernels import auto as matmul_auto
from transformer.parallel import sharding
from transformer.train import start as start_lib
from transformer.train import trackers
from transformer.train.faults import NO_HOOKS, NonFiniteGuard, TestHooks
from transformer.train.loop import Loop
from transformer.train.metrics import MetricsLog, Progress
from transformer.train.profile import StepTrace
from transformer.train.trainer import Trainer


def train(config, workdir, log: Callable[[str], None] = print, progress: bool = True,
          mesh=None, stop_at: int | None = None, allow_change=(), hooks: TestHooks = NO_HOOKS,
          alongside: Callable | None = None):
    """Trains (or resumes) the run in `workdir` on `mesh` (default: from config.mesh).

    Returns (state, tokenizer). On several processes every process calls this; only process 0
    logs and writes metrics, and orbax coordinates the checkpoint writes. `stop_at` ends this
    invocation early at that step (with a checkpoint), as an interruption would; running
    again continues the same schedule to `train.steps`. `hooks` provoke faults (tests only).

    The step compiles in a thread while the state is made (restored, imported or
    initialised, itself a compile) and evaluation and a save's fingerprints compile, so a
    2-core machine compiles them side by side. `alongside(config, tokenizer, trainer)`, if given, runs in a thread while the run
    trains and has finished when this returns: train.py compiles its end-of-training
    sample's program there (an exception in it is the caller's to catch inside it).

    Raises signals.Stopped after saving on SIGINT/SIGTERM, faults.NonFiniteError on NaN/inf,
    workdir.WorkdirError when another run holds the workdir."""
    began = time.perf_counter()  # this invocation's share of the run's wall_s
    # This run's own copy, auto resolved for the mesh's devices (default: this host's, which
    # the default mesh spans).
    config, matmul = start_lib.resolve_config(
        config, None if mesh is None else sharding.platform(mesh))
    main_process = jax.process_index() == 0
    if not main_process:
        log, progress = (lambda _: None), False
    mesh = sharding.make_mesh(config.mesh) if mesh is None else mesh
    plan = start_lib.prepare(config, workdir, mesh, allow_change)
    with start_lib.claim(plan), ThreadPoolExecutor(2, "compile") as threads:
        trainer = Trainer.build(plan.config, mesh)
        t = plan.config.train
        batch = plan.source.batch(t.seed, "train", 0, t.batch_size, rows=[0])  # for its shapes
        # The step, the longest compile, in a thread; this thread makes the state (for a
        # fresh run the init, a compile) and then compiles evaluation and a save's
        # fingerprints, so the two cores share ~7 s of single-threaded compiling evenly.
        compiling = threads.submit(trainer.precompile, batch, ("step",))
        state, skipped = start_lib.initial_state(trainer, plan)
        _precompile_quietly(trainer, batch, ("eval", "save"))
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
        finished = plan.found is not None and plan.found.step >= plan.config.train.steps
        if plan.found:
            log(finished_line(plan.workdir, plan.found.step) if finished else
                f"resuming from step {plan.found.step}")
            progress = progress and not finished
            changed = resume.computing_differently(plan.changes)
            if changed:
                log(changed)
        elif plan.config.train.init_from:
            log(hf_import.describe(plan.config, plan.tokenizer))
        log(summary(plan.config, state.params, plan.tokenizer,
                    data.describe(plan.config, plan.source)))
        log(matmul_auto.describe(matmul))
        log(sharding.describe(trainer.mesh))
        meta = {"config": config_lib.to_dict(plan.config), "tokenizer": plan.tokenizer.to_json(),
                "matmul_reason": matmul.reason}
        compiling.exception()  # wait: a first step during its compile would compile again;
        # a compile that failed here fails again, with its error, at that first step
        if alongside is not None:
            threads.submit(alongside, plan.config, plan.tokenizer, trainer)
        # Seconds the run has taken to reach each checkpoint, over all its invocations (a
        # resumed one adds its own to the restored checkpoint's; the work a killed one did
        # after its last checkpoint is redone, not counted twice). None once unknown: a
        # checkpoint saved before wall_s was recorded.
        before = plan.found.meta.get("wall_s") if plan.found else 0.0
        wall_s = None if before is None else \
            (lambda: round(before + time.perf_counter() - began, 3))
        try:
            state = _run_loop(trainer, plan, state, skipped, metrics_log, meta, stop_at,
                              progress, hooks, log, wall_s)
        finally:
            metrics_log.close()
    return state, plan.tokenizer


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


def _run_loop(trainer, plan, state, skipped, metrics_log, meta, stop_at, progress, hooks,
              log, wall_s=None):
    t = plan.config.train
    begin, first = time.perf_counter(), int(state.step)
    end = t.steps if stop_at is None else min(stop_at, t.steps)
    ckpts = checkpoint.Checkpoints(plan.workdir, keep=t.keep_checkpoints)
    bar = Progress(first, t.steps, enabled=progress, lines=jax.process_index() == 0)
    hooks.install()
    guard = NonFiniteGuard(t.nonfinite, skipped)
    trace = StepTrace(t.profile, plan.workdir, log, enabled=jax.process_index() == 0)
    loop = Loop(trainer, plan.source, ckpts, metrics_log, meta, guard, hooks, bar,
                data.tokens_per_byte(plan.tokenizer, plan.source), trace,
                tokens_before=start_lib.tokens_trained(plan.found), wall_s=wall_s)
    try:
        state = loop.run(state, first, end)
    finally:
        bar.close()
        ckpts.wait()  # a save in flight is committed even when the run stops with an error
        ckpts.close()
    if first < end:
        log(f"trained steps {first}..{end} in {time.perf_counter() - begin:.1f}s "
            f"(evaluation {loop.eval_seconds:.1f}s of it)")
    return state


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
