"""Where a run's numbers go besides `metrics.jsonl`: trackers, one small interface.

    tracker = trackers.open_for(workdir, resumed_at=step)   # TensorBoard, always
    tracker.log(step, {"train_loss": 2.31, "lr": 1e-3})     # numbers, keyed as in metrics.jsonl
    tracker.log_text(step, "sample", text)
    tracker.close()

`metrics.jsonl` stays the record that reports and plots read (metrics.MetricsLog); every line
written there is also handed to the trackers, so a curve in TensorBoard is the same numbers.

TensorBoard event files are written into the workdir itself by tensorboardX (no TensorFlow),
so `tensorboard --logdir runs` shows every run, and a sweep's members side by side under the
sweep's folder. A resumed run redoes the steps after its checkpoint: it opens its writer with
`purge_step` = the restored step + 1, which TensorBoard's reader honours by dropping the
earlier files' events from that step on (a SessionLog START at that step), so the curve
continues with no duplicated or doubled-back steps. A fresh start purges from step 1: a run
killed before its first checkpoint leaves events that the new run replaces.

Weights & Biases (`train.wandb=online|offline`, the `wandb` extra) gets the same numbers
under the same tags. Its run id is kept in `<workdir>/wandb_run_id`, so a resumed run
continues the same W&B run; offline runs write under `<workdir>/wandb` for `wandb sync`.
W&B cannot purge: it ignores the redone steps of a resumed run (steps must grow), keeping
the values first logged, which a resumed run reproduces bit for bit anyway (its speed
figures aside).
"""

from __future__ import annotations

import itertools
import math
import time
import uuid
from pathlib import Path
from typing import Protocol

# metrics.jsonl key -> TensorBoard tag. Grouped by section, so TensorBoard puts the loss
# curves together, the speed figures together.
TAGS = {
    "train_loss": "train/loss",
    "grad_norm": "train/grad_norm",
    "lr": "train/lr",
    "skipped_steps": "train/skipped_steps",
    "val_loss": "val/loss",
    "val_bpb": "val/bpb",
    "tokens_per_s": "speed/tokens_per_s",
    "mfu": "speed/mfu",
}


_WRITERS = itertools.count()


def _tensorboardx():
    """(EventsWriter, event_pb2) from tensorboardX, ~0.3 s to import: only runs that write pay.

    tensorboardX's package imports torch when it is installed (for its torch-only writers and
    graphs, which this module does not use): 1.2 s of every run's start on a machine with
    torch, i.e. any `.[test]` install and nanoGPT's side by side. Unless torch is already
    imported, the import runs with `sys.modules["torch"] = None`, which Python answers with
    ImportError, and tensorboardX catches; the entry is removed after, so a later
    `import torch` (the user's, or the bench's peer) works as ever. Should a release stop
    catching it, the import is simply done again the usual way."""
    import sys

    if "torch" not in sys.modules:
        sys.modules["torch"] = None  # type: ignore[assignment]
        try:
            from tensorboardX.event_file_writer import EventsWriter
            from tensorboardX.proto import event_pb2
            return EventsWriter, event_pb2
        except ImportError:
            for name in [m for m in sys.modules if m.startswith("tensorboardX")]:
                del sys.modules[name]  # half-imported under the block: import again below
        finally:
            if sys.modules.get("torch", 0) is None:
                del sys.modules["torch"]
    from tensorboardX.event_file_writer import EventsWriter
    from tensorboardX.proto import event_pb2
    return EventsWriter, event_pb2


class Tracker(Protocol):
    def log(self, step: int, values: dict) -> None: ...
    def log_text(self, step: int, tag: str, text: str) -> None: ...
    def close(self) -> None: ...


class TensorBoard:
    """Scalars and text into a tensorboardX event file in `logdir`, written synchronously.

    tensorboardX's SummaryWriter hands events to a background thread, and its flush() does
    not wait for that queue: a run SIGKILLed after a logging step could lose the step's events
    although metrics.jsonl has it, and the resumed run, purging from its checkpoint on, never
    writes them again (seen: a curve without step 8). So the events are written here, in the
    caller's thread, with tensorboardX's own record writer, and flushed at every logging step;
    `purge_step` writes what SummaryWriter writes for it (a file version and a SessionLog START
    at that step)."""

    def __init__(self, logdir, purge_step: int | None = None):
        import os

        EventsWriter, event_pb2 = _tensorboardx()
        self._pb = event_pb2
        Path(logdir).mkdir(parents=True, exist_ok=True)
        # The name holds the second it was made: the pid and a per-process count keep two
        # writers of one second (a run and its end-of-training sample) in two files.
        suffix = f".{os.getpid()}.{next(_WRITERS)}"
        self._events = EventsWriter(str(Path(logdir) / "events"), filename_suffix=suffix)
        if purge_step is not None:
            self._write(event_pb2.Event(step=purge_step, file_version="brain.Event:2"))
            self._write(event_pb2.Event(step=purge_step, session_log=event_pb2.SessionLog(
                status=event_pb2.SessionLog.START)))
        self._events.flush()

    def _write(self, event) -> None:
        event.wall_time = time.time()
        self._events.write_event(event)

    def log(self, step: int, values: dict) -> None:
        from tensorboardX.summary import scalar

        for key, value in values.items():
            tag = TAGS.get(key)
            if tag is None or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if math.isfinite(value):
                self._write(self._pb.Event(step=int(step), summary=scalar(tag, float(value))))
        self._events.flush()  # a logging step is rare: a kill loses nothing written

    def log_text(self, step: int, tag: str, text: str) -> None:
        from tensorboardX.summary import text as text_summary

        # TensorBoard renders text as Markdown: a code block keeps a sample's spaces and lines.
        self._write(self._pb.Event(step=int(step),
                                   summary=text_summary(tag, "```\n" + text + "\n```")))
        self._events.flush()

    def close(self) -> None:
        self._events.close()


class Many:
    """Several trackers as one."""

    def __init__(self, trackers):
        self.trackers = list(trackers)

    def log(self, step, values):
        for t in self.trackers:
            t.log(step, values)

    def log_text(self, step, tag, text):
        for t in self.trackers:
            t.log_text(step, tag, text)

    def close(self):
        for t in self.trackers:
            t.close()


class WandB:
    """Weights & Biases: the same tags; one W&B run per workdir, however often it resumes."""

    ID_FILE = "wandb_run_id"

    def __init__(self, workdir, mode: str, project: str, config: dict | None = None):
        try:
            import wandb
        except ImportError as e:
            from transformer.config import ConfigError
            raise ConfigError(f"train.wandb={mode} needs the wandb package: "
                              "pip install -e '.[wandb]' (or set train.wandb=off)") from e
        workdir = Path(workdir)
        path = workdir / self.ID_FILE
        run_id = path.read_text().strip() if path.exists() else uuid.uuid4().hex[:12]
        path.write_text(run_id + "\n")
        self.run = wandb.init(project=project, id=run_id, resume="allow", dir=str(workdir),
                              mode=mode, config=config, name=workdir.resolve().name)

    def log(self, step: int, values: dict) -> None:
        scalars = {TAGS[k]: float(v) for k, v in values.items()
                   if k in TAGS and not isinstance(v, bool) and isinstance(v, (int, float))
                   and math.isfinite(v)}
        if scalars:
            self.run.log(scalars, step=int(step))

    def log_text(self, step: int, tag: str, text: str) -> None:
        self.run.summary[tag] = text

    def close(self) -> None:
        self.run.finish()


def open_for(workdir, resumed_at: int | None = None, config=None) -> Tracker:
    """The trackers of a run in `workdir`, which continues after step `resumed_at` (None or 0:
    from the start): TensorBoard, and W&B if `config.train.wandb` asks. Call on process 0
    only."""
    Path(workdir).mkdir(parents=True, exist_ok=True)
    trackers = [TensorBoard(workdir, purge_step=(resumed_at or 0) + 1)]
    if config is not None and config.train.wandb != "off":
        from transformer import config as config_lib
        trackers.append(WandB(workdir, config.train.wandb, config.train.wandb_project,
                              config_lib.to_dict(config)))
    return Many(trackers)


def append_text(workdir, step: int, tag: str, text: str) -> None:
    """Adds one text (e.g. the end-of-training sample) to a run's curves, purging nothing."""
    tracker = TensorBoard(workdir)
    try:
        tracker.log_text(step, tag, text)
    finally:
        tracker.close()
