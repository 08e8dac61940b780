"""The training loop: steps, metrics read one step late, evaluation, checkpoints, and a stop
that every process agrees on.

    loop = Loop(trainer, run, metrics_log, Options(stop_at=...))     run: start.prepare's
    state = loop.train(state, skipped)      # raises signals.Stopped after a save on a signal

The host never waits for the step it just queued: a logging step's metrics are read after
the next step is queued (or when the loop syncs anyway, to evaluate or save), and the
non-finite check (faults.NonFiniteGuard) looks one step back too.

A SIGINT/SIGTERM only sets a flag (signals.py). On several processes a signal may reach one
process, or reach them at different steps; the loop must not save on one process while
another queues the next step (each would wait for the other forever). So the flag goes
through processes.StopVote every step, and every process stops at the step the vote names,
saves that step together and raises the same `Stopped`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import TYPE_CHECKING, Any, Callable

import jax

from transformer import checkpoint, data
from transformer import config as config_lib
from transformer.model import flops
from transformer.parallel import processes
from transformer.train import metrics as metrics_lib
from transformer.train import optimizer, signals
from transformer.train.faults import NO_HOOKS, NonFiniteGuard, TestHooks
from transformer.train.metrics import MetricsLog, Progress, Throughput
from transformer.train.profile import StepTrace
from transformer.train.trainer import (Trainer, bits_per_byte, compute_precision, evaluate,
                                       evaluate_final)

if TYPE_CHECKING:
    from transformer.train.start import Run


class Reporter:
    """Writes the train metrics of logging steps, read late: `hold` keeps the step's device
    values, `flush` reads and writes them (the only host sync of a logging interval)."""

    def __init__(self, trainer: Trainer, metrics_log: MetricsLog, bar: Progress,
                 guard: NonFiniteGuard, start: int = 0, tokens_before: int = 0):
        config = trainer.config
        self.log, self.bar, self.guard = metrics_log, bar, guard
        self.tokens_per_step = config.train.batch_size * config.model.max_seq_len
        # Tokens trained through step `start`: a run resumed with another batch size
        # (--allow_change=train.batch_size) trained its earlier steps at their own size.
        self.start, self.tokens_before = start, tokens_before
        self.flops_per_token = flops.train_flops_per_token(trainer.model_config)
        self.peak, _ = metrics_lib.peak_flops(compute_precision(trainer.model_config))
        self.schedule = optimizer.learning_rate(config.train)
        self.meter, self.tokens_since, self.pending = Throughput(), 0, None

    def tokens_at(self, done: int) -> int:
        """Tokens trained through step `done` (of this invocation's steps or `start`)."""
        return self.tokens_before + (done - self.start) * self.tokens_per_step

    def stepped(self) -> None:
        self.tokens_since += self.tokens_per_step

    def hold(self, done: int, metrics) -> None:
        self.pending = (done, metrics)

    def flush(self) -> None:
        if self.pending is None:
            return
        done, metrics = self.pending
        self.pending = None
        # The guard looks one step late, so step `done`'s own skip may be unchecked yet: check
        # it now (its metrics are read here anyway), so that the line counts it.
        self.guard.flush()
        metrics = jax.device_get(metrics)
        tokens_per_s = self.meter.tick(self.tokens_since)
        self.tokens_since = 0
        loss = float(metrics["train_loss"])
        mfu = metrics_lib.mfu(tokens_per_s, self.flops_per_token, self.peak, jax.device_count())
        # The rate this step applied: the schedule at the step (step `done` is update
        # done - 1, skipped steps included: step.schedule_at), or 0 when it was skipped.
        lr = 0.0 if bool(metrics["nonfinite"]) else float(self.schedule(done - 1))
        self.log.write(step=done, tokens=self.tokens_at(done), train_loss=loss,
                       lr=lr, grad_norm=metrics["grad_norm"], tokens_per_s=tokens_per_s, mfu=mfu,
                       skipped_steps=self.guard.skipped)
        self.bar.set_postfix(loss=loss, tok_s=round(tokens_per_s), mfu=f"{mfu:.1%}")


@dataclasses.dataclass
class Options:
    """How a run is driven, not what it computes (run.train, Loop)."""

    log: Callable[[str], None] = print
    progress: bool = True             # the progress bar
    stop_at: int | None = None        # ends this invocation at that step, saved as a stop is
    hooks: TestHooks = NO_HOOKS       # faults to provoke (tests only)
    alongside: Callable | None = None  # alongside(run, trainer), in a thread while it trains
    meta: dict = dataclasses.field(default_factory=dict)  # saved with every checkpoint too


@dataclasses.dataclass
class Loop:
    trainer: Trainer
    run: Run                         # start.prepare's: data, workdir, the checkpoint continued
    metrics_log: MetricsLog
    options: Options
    eval_seconds: float = 0.0        # spent evaluating so far (the end-of-run line says it)
    # What train() opens for its steps:
    ckpts: Any = dataclasses.field(default=None, init=False)  # checkpoint.Checkpoints, writing
    bar: Progress = dataclasses.field(default=None, init=False)
    guard: NonFiniteGuard = dataclasses.field(default=None, init=False)
    trace: StepTrace = dataclasses.field(default=None, init=False)  # train.profile's trace
    tokens_per_byte: float = dataclasses.field(default=1.0, init=False)  # of the val text

    @property
    def config(self):
        """The run's config, as start.prepare resolved it (the trainer was built from it): the
        one the loop reads."""
        return self.run.config

    def train(self, state, skipped: int):
        """Steps from the state's step to train.steps (or options.stop_at); returns the state
        after the last. `skipped`: steps skipped so far (train.nonfinite)."""
        t, workdir, log = self.config.train, self.run.workdir, self.options.log
        begin, first = time.perf_counter(), int(state.step)
        end = t.steps if self.options.stop_at is None else min(self.options.stop_at, t.steps)
        self.ckpts = checkpoint.Checkpoints(workdir, keep=t.keep_checkpoints)
        self.bar = Progress(first, t.steps, enabled=self.options.progress,
                            lines=jax.process_index() == 0)
        self.options.hooks.install()
        self.guard = NonFiniteGuard(t.nonfinite, skipped)
        self.trace = StepTrace(t.profile, workdir, log, enabled=jax.process_index() == 0)
        self.tokens_per_byte = data.tokens_per_byte(self.run.tokenizer, self.run.source)
        try:
            state = self._steps(state, first, end)
        finally:
            self.bar.close()
            self.ckpts.wait()  # a save in flight is committed even when the run stops with an error
            self.ckpts.close()
        if first < end:
            log(f"trained steps {first}..{end} in {time.perf_counter() - begin:.1f}s "
                f"(evaluation {self.eval_seconds:.1f}s of it)")
        return state

    def _steps(self, state, start: int, end: int):
        """Steps start+1 .. end; returns the state after step `end`."""
        t = self.config.train
        reporter = Reporter(self.trainer, self.metrics_log, self.bar, self.guard, start,
                            self.run.tokens_trained)
        vote = processes.StopVote()
        with signals.GracefulStop() as stop, _closing(self.trace):
            for step in range(start, end):
                done = step + 1
                batch = self.options.hooks.poison(
                    self.trainer.batch(self.run.source, t.seed, "train", step), done)
                self.trace.before(done, state)
                state, metrics = self.trainer.step_fn(state, batch)
                self.trace.after(done, state)
                reporter.flush()  # the previous logging step's: this step is queued already
                self.guard.push(done, metrics["nonfinite"])
                self.options.hooks.after_step()
                reporter.stepped()
                if done % t.log_every == 0 or done == t.steps:
                    reporter.hold(done, metrics)
                self.bar.update(1)
                signum = vote.update(stop.requested or 0)  # the same at this step everywhere
                self._after_step(state, done, end, signum, reporter)
            self.guard.flush()
            signum = vote.final(stop.requested or 0)
        if signum:  # a signal came during the last step, which was saved
            raise signals.Stopped(signum, end)
        return state

    def meta(self) -> dict:
        """Saved with every checkpoint: the run's config and tokenizer, why its matmul is what
        it is, the caller's options.meta."""
        return {"config": config_lib.to_dict(self.config),
                "tokenizer": self.run.tokenizer.to_json(),
                "matmul_reason": self.run.matmul.reason, **self.options.meta}

    def wall_s(self) -> float | None:
        """Seconds the run has taken to reach this point over all its invocations (a resumed
        one adds its own to the restored checkpoint's; the work a killed one did after its
        last checkpoint is redone, not counted twice). None once unknown: a checkpoint saved
        before wall_s was recorded."""
        before = self.run.found.meta.get("wall_s") if self.run.found else 0.0
        return None if before is None else \
            round(before + time.perf_counter() - self.run.began, 3)

    def _after_step(self, state, done: int, end: int, signum: int, reporter) -> None:
        """What follows step `done`: late metrics, evaluation, a save, or the agreed stop."""
        t = self.config.train
        evaluating = done % t.eval_every == 0 or done == t.steps
        saving = done % t.ckpt_every == 0 or done == end or signum
        if evaluating or saving:
            reporter.flush()  # about to sync anyway
        if evaluating:
            # The run's last number: train.eval_tokens, the same windows whatever the seed.
            score = evaluate_final if done == t.steps else evaluate
            began = time.perf_counter()
            with reporter.meter.paused():  # evaluation time is not training throughput
                val_loss = score(self.trainer, state.params, self.run.source, t.seed)
            self.eval_seconds += time.perf_counter() - began
            val_bpb = bits_per_byte(val_loss, self.tokens_per_byte)
            self.metrics_log.write(step=done, tokens=reporter.tokens_at(done),
                                   val_loss=val_loss, val_bpb=val_bpb)
            self.bar.write(f"step {done}: val_loss {val_loss:.4f}, val_bpb {val_bpb:.4f}")
        if saving:
            self.guard.flush()  # never save a state that followed an unchecked step
            with reporter.meter.paused():
                self.ckpts.save(done, state.params,
                                {"step": state.step, "opt_state": state.opt_state},
                                {**self.meta(), "step": done, "skipped_steps": self.guard.skipped,
                                 "tokens": reporter.tokens_at(done), "wall_s": self.wall_s()})
        if signum:
            self.ckpts.wait()
            raise signals.Stopped(signum, done)


@contextlib.contextmanager
def _closing(trace: StepTrace):
    """A trace still running when the loop ends (a stop, an error) is stopped and written."""
    try:
        yield
    finally:
        trace.close()
