"""May this config continue the run saved in a workdir? The rules, in one place.

Restarting the same command continues exactly. A changed config is compared field by field
with the config saved in the latest checkpoint:
- FREE fields change only what is logged, evaluated, saved or sampled, or where the state
  lives (mesh.*: a checkpoint restores onto any mesh), or how one update's batch is split
  (train.grad_accum: the same update up to float rounding, as on another mesh), never what
  the params are: they may change silently (e.g. more frequent checkpoints after a crash);
- FIXED fields change the shape of the saved state or the meaning of its tokens (model
  shape, tokenizer): the checkpoint cannot continue under them, whatever the flags;
- every other field (train.steps, train.lr, train.seed, data.corpus, ...) changes what the
  run computes from here on: refused unless named in --allow_change, e.g.
  `--allow_change=train.steps` to train longer. The result is then no longer the run any
  single config describes (the learning-rate schedule, for one, depends on train.steps).

    diffs = differences(saved_config_dict, config_dict)      # {"train.lr": (3e-3, 1e-3)}
    check(diffs, allowed={"train.lr"}, workdir="runs/tiny")  # raises ConfigError or passes
"""

from __future__ import annotations

from transformer.config import ConfigError, base_config, flatten, to_dict

FREE = ("train.log_every", "train.eval_every", "train.eval_batches", "train.ckpt_every",
        "train.keep_checkpoints", "train.nonfinite", "train.grad_accum", "sample.", "mesh.")
FIXED = ("model.vocab_size", "model.d_model", "model.n_layers", "model.n_heads", "model.d_ff",
         "model.max_seq_len", "model.tie_embeddings", "model.param_dtype", "model.scan_layers",
         "model.position", "model.norm", "model.norm_placement", "model.mlp", "model.n_kv_heads",
         "data.tokenizer", "data.bpe_vocab_size")


def differences(saved: dict, current: dict) -> dict:
    """{field: (saved value, current value)} for every field that differs (flattened names).
    A field the saved config lacks (added to the schema later) is not a difference."""
    saved, current = flatten(saved), flatten(current)
    return {k: (saved[k], v) for k, v in current.items() if k in saved and saved[k] != v}


def _free(field: str) -> bool:
    return any(field == f or (f.endswith(".") and field.startswith(f)) for f in FREE)


def check(diffs: dict, allowed, workdir) -> None:
    """Raises ConfigError naming the differing fields unless each is free or allowed."""
    allowed = set(allowed or ())
    unknown = sorted(allowed - set(flatten(to_dict(base_config()))))
    if unknown:
        raise ConfigError(f"--allow_change={unknown[0]}: no such config field; name fields as "
                          "section.field, e.g. --allow_change=train.steps")
    fixed = {k: v for k, v in diffs.items() if k in FIXED}
    if fixed:
        raise ConfigError(f"{workdir} holds a checkpoint of another model or tokenizer "
                          f"({_describe(fixed)}): these cannot change; use a new --workdir "
                          "or the saved values")
    refused = {k: v for k, v in diffs.items() if not _free(k) and k not in allowed}
    if refused:
        names = ",".join(sorted(refused))
        raise ConfigError(f"{workdir} was trained with a different config ({_describe(refused)}): "
                          f"rerun with the saved values, use a new --workdir, or pass "
                          f"--allow_change={names} to continue with the change")


def _describe(diffs: dict) -> str:
    return "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in sorted(diffs.items()))
