"""What a checkpoint holds, and how to write and read it (orbax-checkpoint).

A checkpoint of step N lives in `<workdir>/checkpoints/N/` with three items:
    params   the model parameters
    train    {'step', 'opt_state'}: everything else training needs to continue
    meta     JSON: the step, the resolved config and the tokenizer, so that `sample.py`
             rebuilds the model from the checkpoint alone

Saves are asynchronous; orbax writes into a temporary folder and renames it only when the
save is complete, so a reader never sees a half-written checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import orbax.checkpoint as ocp


class CheckpointError(ValueError):
    """No usable checkpoint where one was expected."""


def directory(workdir) -> Path:
    return Path(workdir).absolute() / "checkpoints"


class Checkpoints:
    """The checkpoints of one workdir. `read_only=True` for readers such as sample.py."""

    def __init__(self, workdir, keep: int = 3, read_only: bool = False):
        path = directory(workdir)
        if read_only and not path.is_dir():
            raise CheckpointError(f"{workdir}: no checkpoints folder; train a model there first "
                                  f"(python train.py --workdir={workdir})")
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=not read_only,
                                               read_only=read_only)
        self._manager = ocp.CheckpointManager(path, options=options,
                                              item_names=("params", "train", "meta"))

    def latest_step(self):
        return self._manager.latest_step()

    def save(self, step: int, params, train_state, meta: dict) -> None:
        self._manager.save(step, args=ocp.args.Composite(
            params=ocp.args.StandardSave(params),
            train=ocp.args.StandardSave(train_state),
            meta=ocp.args.JsonSave(meta)))

    def read_meta(self, step=None) -> dict:
        step = self._require(step)
        return self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

    def restore(self, step, abstract_params, abstract_train=None):
        """(params, train_state) at `step`; pass abstract trees (jax.ShapeDtypeStruct leaves,
        with shardings to restore onto a mesh). Without abstract_train only params are read."""
        step = self._require(step)
        items = {"params": ocp.args.StandardRestore(abstract_params)}
        if abstract_train is not None:
            items["train"] = ocp.args.StandardRestore(abstract_train)
        out = self._manager.restore(step, args=ocp.args.Composite(**items))
        return out["params"], out.get("train") if abstract_train is not None else None

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.close()

    def _require(self, step):
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"{self._manager.directory}: no checkpoint yet; "
                                  "train first, or wait for the first save")
        return step
