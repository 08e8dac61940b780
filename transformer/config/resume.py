"""May this config continue the run saved in a workdir? The rules, in one place.

Restarting the same command continues exactly. A changed config is compared field by field
with the config saved in the latest checkpoint:
- FREE fields change only what is logged, evaluated, saved or sampled, where the state
  lives (mesh.*: a checkpoint restores onto any mesh) or what the backward pass recomputes
  (model.remat: the same values), never what the params are: they may change silently (e.g.
  more frequent checkpoints after a crash). model.matmul may switch freely between the
  float32 modes (plain, fast_f32: the same arithmetic up to summation order), not to or from
  fast_bf16, which rounds matmul inputs to bfloat16 (`auto` picks it on CPUs with native
  bfloat16, so a run resumed on another CPU would silently change precision);
- FIXED fields change the shape of the saved state or the meaning of its tokens (model
  shape, tokenizer): the checkpoint cannot continue under them, whatever the flags;
- every other field (train.steps, train.lr, train.seed, data.corpus, ...) changes what the
  run computes from here on (CHANGE in fields.py): refused unless named in --allow_change, e.g.
  `--allow_change=train.steps` to train longer. The result is then no longer the run any
  single config describes (the learning-rate schedule, for one, depends on train.steps).

    diffs = differences(saved_config_dict, config_dict)      # {"train.lr": (3e-3, 1e-3)}
    check(diffs, allowed={"train.lr"}, workdir="runs/tiny")  # raises ConfigError or passes
"""

from __future__ import annotations

from transformer.config import ConfigError, fields, flatten

# Each field's rule is declared with the field (fields.py); these are views of that table.
FREE = tuple(f.name for f in fields.FIELDS if f.resume == fields.FREE)
FIXED = tuple(f.name for f in fields.FIELDS if f.resume == fields.FIXED)


def differences(saved: dict, current: dict) -> dict:
    """{field: (saved value, current value)} for every field that differs (flattened names).
    A field the saved config lacks (added to the schema later) is not a difference."""
    saved, current = flatten(saved), flatten(current)
    diffs = {k: (saved[k], v) for k, v in current.items() if k in saved and saved[k] != v}
    if set(diffs.get("model.matmul", ())) <= set(fields.FLOAT32_MATMULS):
        diffs.pop("model.matmul", None)  # the same float32 arithmetic: not a difference
    if current.get("train.optimizer") != "muon":  # no Newton-Schulz steps to compute in it;
        diffs.pop("train.muon_ns_dtype", None)  # auto follows model.matmul even so
    return diffs


def computing_differently(diffs: dict) -> str | None:
    """The line a run's start-up summary prints when it continues under allowed changes that
    alter what it computes (None when nothing but free fields changed)."""
    changed = {k: v for k, v in diffs.items() if k not in FREE}
    if not changed:
        return None
    return ("note: from here on this run computes differently from how it started: "
            + _describe(changed))


def check(diffs: dict, allowed, workdir) -> None:
    """Raises ConfigError naming the differing fields unless each is free or allowed."""
    allowed = check_names(allowed)
    fixed = {k: v for k, v in diffs.items() if k in FIXED}
    if fixed:
        raise ConfigError(f"{workdir} holds a checkpoint of another model or tokenizer "
                          f"({_describe(fixed)}): these cannot change; use a new --workdir "
                          "or the saved values")
    refused = {k: v for k, v in diffs.items() if k not in FREE and k not in allowed}
    if refused:
        names = ",".join(sorted(refused))
        raise ConfigError(f"{workdir} was trained with a different config ({_describe(refused)}): "
                          f"rerun with the saved values, use a new --workdir, or pass "
                          f"--allow_change={names} to continue with the change")


def check_names(allowed) -> set:
    """The --allow_change names as a set; a name that is no field is refused, on a fresh run
    too (a typo there would otherwise surface only at the resume it was meant for)."""
    allowed = set(allowed or ())
    unknown = sorted(allowed - set(fields.BY_NAME))
    if unknown:
        raise ConfigError(f"--allow_change={unknown[0]}: no such config field; name fields as "
                          "section.field, e.g. --allow_change=train.steps")
    return allowed


def _describe(diffs: dict) -> str:
    return "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in sorted(diffs.items()))
