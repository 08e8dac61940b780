"""Scaling sweeps: a ladder of model sizes under a budget, each member an ordinary run.

    python -m transformer scaling --sweep=configs/scaling/cpu_ladder.py --workdir=runs/ladder
    python -m transformer scaling --sweep=configs/scaling/cpu_ladder.py --workdir=runs/ladder --index=2

A sweep config (see `configs/scaling/`) holds a base training config, a list of sizes (from
`ladder`, one sizing rule) and a budget per run:
    tokens      every run sees `value` tokens
    flops       IsoFLOP: tokens = value / (training FLOPs per token of that size)
    chinchilla  tokens = value × non-embedding params (Hoffmann et al. 2022 use ~20)
Each budget value × size is a member: an ordinary training run in <workdir>/<name>, so it can
be sampled, resumed and plotted like any other. A finished member (it has `result.json`) is
skipped; a partial one resumes from its checkpoint. `--index=i` runs member i alone, so a
scheduler can fan the sweep out; report.py then gathers whatever has finished. A sweep with
`variants` (e.g. from `grid`) repeats the ladder per variant. A workdir holds one sweep: another
one (or a changed base) is refused unless the differing keys are allowed.
"""


from __future__ import annotations

import dataclasses
import itertools
import json
import math
from pathlib import Path

import ml_collections

from transformer.config import (ConfigError, ModelConfig, fields, flatten, replace,
                                validate)
from transformer.data import durable
from transformer.model import flops
from transformer.model.sizes import human, model_config_of

BUDGETS = ("tokens", "flops", "chinchilla")


def ladder(n_layers, aspect: int, head_dim: int, mlp_ratio: int = 4) -> list[dict]:
    """The sizing rule: d_model = aspect × n_layers, heads of `head_dim`, d_ff = mlp_ratio ×
    d_model. A fixed aspect ratio grows width and depth together, as Kaplan et al. found best."""
    sizes = []
    for L in n_layers:
        d = aspect * L
        if d % head_dim:
            raise ConfigError(f"ladder: d_model={d} (aspect {aspect} × {L} layers) is not a "
                              f"multiple of head_dim={head_dim}")
        sizes.append(dict(name=f"L{L}-d{d}", n_layers=L, d_model=d, n_heads=d // head_dim,
                          d_ff=mlp_ratio * d))
    return sizes


def depths(values) -> list[dict]:
    """Sizes that differ only by model.depth: each derives its width, heads, rates and batch
    from its depth by config/depth.py's rules, with the base config as the reference."""
    return [dict(name=f"D{L}", depth=L) for L in values]


def sweep_config(base, sizes, budget_kind: str, budgets, variants=(), window=None,
                 window_n=None, rules=False, seed_noise=None) -> ml_collections.ConfigDict:
    """What a sweep config file's get_config() returns: `budgets` are token counts, FLOP
    counts or tokens per parameter, as `budget_kind` says. `variants` (optional, see `grid`)
    repeat the whole ladder once per variant: {"name": ..., "group": ..., "model.x": value}.
    `window` (optional, (low, high)) keeps a size at a budget only where its tokens per
    non-embedding parameter fall in [low, high]: an IsoFLOP sweep over 100x in compute then
    trains, at each budget, the sizes around its optimum, not a 10,000-step run of a size far
    too small for it or a 10-step run of one far too large. `window_n="compute"` counts those
    tokens per compute-equivalent parameter C/(6D) instead. A size may carry its own
    "keep_within": (low, high), which replaces `window` for that size: half-steps of a ladder
    kept only near each budget's optimum, where they sharpen its valley. `rules=True` gives
    each member its batch, rates, weight decay and warm-up by scaling/rules.py from its width
    and tokens.
    `seed_noise` (nats per token): the recipe's seed noise, which the report holds Approach 3's
    rmse against (scaling/gate.py)."""
    s = ml_collections.ConfigDict()
    s.base = base
    s.sizes = [dict(size) for size in sizes]
    s.budget_kind = budget_kind
    s.budgets = tuple(budgets)
    s.variants = [dict(v) for v in variants]
    if window:  # absent otherwise: a sweep saved before windows existed reads the same
        s.window = tuple(window)
    if window_n:  # "compute": the window counts tokens per compute-equivalent parameter
        s.window_n = window_n
    if rules:  # each member's batch, rates, decay and warm-up from scaling/rules.py
        s.rules = True
    if seed_noise:  # the recipe's seed noise (nats): the yardstick Approach 3's fit must meet
        s.seed_noise = float(seed_noise)
    return s


def grid(axes: dict) -> list[dict]:
    """Variants for every combination of config values, e.g.
    grid({"model.position": ["learned", "rope"], "train.lr": [1e-3, 3e-3]}) gives 4, named
    "position=rope_lr=0.003". An lr axis is tuned, not compared: members that differ only in
    train.lr share a group, and the report keeps the best lr per size of each group."""
    fields = list(axes)
    out = []
    for values in itertools.product(*(axes[f] for f in fields)):
        parts = [f"{f.split('.')[-1]}={v:g}" if isinstance(v, float) else
                 f"{f.split('.')[-1]}={v}" for f, v in zip(fields, values)]
        group = [p for f, p in zip(fields, parts) if f != "train.lr"]
        out.append({"name": "_".join(parts), "group": "_".join(group) or "all",
                    **dict(zip(fields, values))})
    return out


def _apply_variant(config, variant: dict) -> None:
    for field, value in variant.items():
        if field in ("name", "group"):
            continue
        section, _, key = field.partition(".")
        if section not in config or key not in config[section]:
            raise ConfigError(f"sweep variant {variant.get('name')!r}: {field} is not a config "
                              "field; name fields as section.field, e.g. model.position")
        config[section][key] = value


@dataclasses.dataclass
class Member:
    index: int
    name: str
    config: ml_collections.ConfigDict
    budget: str
    value: float
    group: str = ""

    @property
    def tokens(self) -> int:
        return self.config.train.steps * self.config.train.batch_size * \
            self.config.model.max_seq_len


SWEEP_KEYS = ("base", "sizes", "budget_kind", "budgets")
# Keys of a size that are not model fields: its name, and the window it alone is kept within.
SIZE_ONLY = ("name", "keep_within")


def check(sweep) -> None:
    """Refuses what is not a sweep config (a run config given as --sweep, above all) and
    budgets that cannot train anything, each with one line."""
    keys = set(sweep.keys())
    if not set(SWEEP_KEYS) <= keys:
        if {"model", "train", "data"} & keys:
            raise ConfigError("--sweep: this is a run config (it has model/train/data "
                              "sections), not a sweep config: train it with train.py "
                              "--config=FILE, or give a sweep config such as "
                              "configs/scaling/cpu_ladder.py")
        missing = ", ".join(k for k in SWEEP_KEYS if k not in keys)
        raise ConfigError(f"--sweep: not a sweep config (it lacks {missing}); get_config() "
                          "returns sweep_config(base, sizes, budget_kind, budgets), see "
                          "configs/scaling/")
    kind = sweep.budget_kind
    if kind not in BUDGETS:
        raise ConfigError(f"sweep.budget_kind={kind!r}: must be one of {', '.join(BUDGETS)}")
    if not sweep.sizes or not sweep.budgets:
        raise ConfigError("sweep.sizes and sweep.budgets must not be empty")
    for value in sweep.budgets:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not math.isfinite(value) or value <= 0:
            raise ConfigError(f"sweep.budgets={tuple(sweep.budgets)!r}: every budget must be a "
                              f"positive number ({kind}), not {value!r}")
    windows = [("sweep.window", sweep.get("window"))] + [
        (f"sweep.sizes[{k}].keep_within", size["keep_within"])
        for k, size in enumerate(sweep.sizes) if size.get("keep_within") is not None]
    for field, window in windows:
        if window is not None and not (len(window) == 2 and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in window)
                and 0 < window[0] < window[1]):
            raise ConfigError(f"{field}={window!r}: give (low, high) tokens per "
                              "parameter with 0 < low < high, or None for every size at every "
                              "budget")


def members(sweep) -> list[Member]:
    """Every run of the sweep, budgets outer, sizes inner (small to large)."""
    check(sweep)
    kind = sweep.budget_kind
    out = []
    variants = list(sweep.get("variants") or []) or [{"name": ""}]
    window = sweep.get("window")
    kept = {value: 0 for value in sweep.budgets}
    for variant, value, size in itertools.product(variants, sweep.budgets, sweep.sizes):
        config = ml_collections.ConfigDict(sweep.base.to_dict())
        _apply_variant(config, variant)
        config.model.update({k: v for k, v in size.items() if k not in SIZE_ONLY})
        if config.model.depth:  # a depth ladder: the depth's sizes, rates and batch
            # (config/depth.py); the budget sets the steps, which its run then keeps
            # (tokens_per_param=0: the other rules do not read the ratio).
            from transformer.train.resolve import resolve
            config, _ = resolve(replace(config, **{"train.tokens_per_param": 0}),
                                platform=None)
        model = model_config_of(ml_collections.ConfigDict(config.to_dict()))  # vocab 0 stays
        non_embedding = flops.param_counts(model)["non_embedding"]
        if kind == "tokens":
            tokens = value
        elif kind == "flops":
            tokens = value / flops.train_flops_per_token(model)
        else:
            tokens = value * non_embedding
        keep = size.get("keep_within") or window
        if keep and not keep[0] <= tokens / _window_n(sweep, model) <= keep[1]:
            continue
        kept[value] += 1
        config = _member_settings(sweep, variant, config, tokens)
        tag = {"tokens": f"tok{human(value)}", "chinchilla": f"x{value:g}",
               "flops": f"flop{value:.1e}".replace("e+", "e")}[kind]
        name = "_".join(p for p in (variant["name"], size["name"], tag) if p)
        group = variant.get("group", variant["name"])
        out.append(Member(len(out), name, validate(config), kind, value, group))
    empty = [value for value, n in kept.items() if not n]
    if empty:
        shown = tuple(window) if window else None
        raise ConfigError(f"sweep.window={shown!r}: no size falls in it at budget(s) "
                          f"{', '.join(f'{v:g}' for v in empty)}: widen the window, or add "
                          "sizes")
    seen = {}
    for m in out:  # a member's folder is its name: two of one name would train into one
        if m.name in seen:
            first = seen[m.name]
            raise ConfigError(f"sweep: members {first.index} and {m.index} would both train "
                              f"in the folder {m.name!r} (budgets {first.value:g} and "
                              f"{m.value:g}): give every size, variant and budget a name of its "
                              "own (a budget's name keeps 2 digits of a FLOP count, 4 of a "
                              "token count)")
        seen[m.name] = m
    return out


def _window_n(sweep, model) -> float:
    """The N a window's tokens per parameter divide by: non-embedding parameters (sweeps saved
    before `window_n` existed), or with window_n="compute" the compute-equivalent parameters
    C/(6D) = F/6 that the IsoFLOP fits use (isoflop.runs_of)."""
    if sweep.get("window_n") == "compute":
        return flops.train_flops_per_token(model) / 6
    return flops.param_counts(model)["non_embedding"]


def _member_settings(sweep, variant: dict, config, tokens: float):
    """The member's steps for its tokens at the base's batch; with sweep.rules, its batch,
    rates, weight decay and warm-up too, from its width and tokens (scaling/rules.py), the
    base config with the variant's changes as the reference."""
    if not sweep.get("rules"):
        tokens_per_step = config.train.batch_size * config.model.max_seq_len
        config.train.steps = max(1, round(tokens / tokens_per_step))
        return config
    from transformer.scaling import rules
    reference = ml_collections.ConfigDict(sweep.base.to_dict())
    _apply_variant(reference, variant)
    return replace(config, **rules.settings(reference, config.model.d_model, tokens))


def differences(saved: dict, current: dict) -> dict:
    """{key: (saved, current)} for every key of two sweep dicts that differs, nested keys
    dotted ("budgets", "sizes", "base.train.lr"); a key only one side has differs too."""
    saved, current = flatten(saved), flatten(current)
    return {k: (saved.get(k, "(absent)"), current.get(k, "(absent)"))
            for k in sorted(set(saved) | set(current)) if saved.get(k, _ABSENT) !=
            current.get(k, _ABSENT)}


_ABSENT = object()


def _short(value) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# Free on a resumed run, but not within a sweep: the final validation loss the report fits is
# measured over train.eval_tokens, and the padded vocabulary's head is in the FLOPs an
# IsoFLOP member is sized by. Members finished before and after such a change would not compare.
NOT_FREE_IN_A_SWEEP = ("train.eval_tokens", "model.vocab_multiple")


def free_in_a_sweep(key: str) -> bool:
    """Whether a dotted sweep key ("base.train.log_every") may differ between the members of
    one sweep: base fields free on a resumed run (logging, evaluation during training,
    checkpoints, mesh, the sample) change nothing a member's result holds, except those in
    NOT_FREE_IN_A_SWEEP."""
    name = key[5:] if key.startswith("base.") else None
    return (name in fields.BY_NAME and fields.BY_NAME[name].resume == fields.FREE
            and name not in NOT_FREE_IN_A_SWEEP)


def check_workdir(sweep, workdir, allow_change=()) -> dict | None:
    """Refuses a workdir that holds another sweep (or a changed base) unless every differing
    key is named in `allow_change`; also one that holds a training run. Returns the
    differences that were allowed (None when the workdir is new or holds this very sweep)."""
    workdir = Path(workdir)
    saved = _sweep_of(workdir)
    if saved is None:
        if (workdir / "checkpoints").is_dir():
            raise ConfigError(f"--workdir={workdir} holds a training run, not a sweep: give "
                              "the sweep a folder of its own")
        return None
    diffs = {k: v for k, v in differences(saved, json.loads(sweep.to_json())).items()
             if not free_in_a_sweep(k)}
    if not diffs:
        return None
    refused = {k: v for k, v in diffs.items() if k not in set(allow_change or ())}
    if refused:
        shown = list(refused.items())[:3]
        what = "; ".join(f"{k}: {_short(a)} -> {_short(b)}" for k, (a, b) in shown)
        if len(refused) > len(shown):
            what += f"; and {', '.join(list(refused)[len(shown):])}"
        raise ConfigError(f"{workdir} holds another sweep ({what}): use a new --workdir, or "
                          f"pass --allow_change={','.join(refused)} to replace its sweep.json "
                          "(members already finished keep the results of the old one)")
    return diffs


def run(sweep, workdir, index=None, log=print, progress: bool = True,
        allow_change=()) -> list[str]:
    """Trains the members not yet finished (or only member `index`). Returns those trained.
    A workdir holding another sweep is refused unless the differing keys of the sweep config
    (e.g. budgets, base.train.lr) are named in `allow_change`."""
    all_members = members(sweep)
    if index is not None and not 0 <= index < len(all_members):
        raise ConfigError(f"--index={index}: the sweep has members 0..{len(all_members) - 1}")
    workdir = Path(workdir)
    allowed = check_workdir(sweep, workdir, allow_change)
    if allowed:
        log(f"{workdir}: sweep changed as allowed ({', '.join(allowed)}); finished members "
            "are kept as they are")
    from transformer.train import run as run_lib  # jax, flax, optax: not for --report
    from transformer.train import start
    workdir.mkdir(parents=True, exist_ok=True)
    write_atomic(workdir / "sweep.json", json.dumps(
        {"sweep": json.loads(sweep.to_json()), "members": [m.name for m in all_members]},
        indent=1))
    chosen = all_members if index is None else [all_members[index]]
    trained = []
    for m in chosen:
        run_dir = workdir / m.name
        result = _read_json(run_dir / "result.json")
        if result and result["steps"] == m.config.train.steps:
            log(f"[{m.index + 1}/{len(all_members)}] {m.name}: finished, skipped")
            continue
        if result and allowed:  # kept, as the allowed change promises: its checkpoint would
            # refuse to resume under the changed config anyway (its steps, batch, ...)
            log(f"[{m.index + 1}/{len(all_members)}] {m.name}: finished before the change "
                f"({result['steps']} steps; {m.config.train.steps} now), kept")
            continue
        log(f"[{m.index + 1}/{len(all_members)}] {m.name}: {m.config.train.steps} steps, "
            f"{m.tokens:,} tokens")
        member = start.prepare(m.config, run_dir)
        run_lib.train(member, run_lib.Options(log=log, progress=progress))
        # The run's own count (its last checkpoint's wall_s): with a resumed member, the
        # earlier invocations' seconds too, where this call's alone were reported.
        wall_s = _run_wall_s(run_dir, m.config.train.steps)
        model = ModelConfig.from_config(member.config)  # as the run resolved it: vocab 0 filled
        counts = flops.param_counts(model)
        write_atomic(run_dir / "result.json", json.dumps(dict(
            name=m.name, index=m.index, budget=m.budget, budget_value=m.value,
            n_layers=model.n_layers, d_model=model.d_model, steps=m.config.train.steps,
            tokens=m.tokens, params_total=counts["total"],
            params_non_embedding=counts["non_embedding"],
            flops=flops.train_flops_per_token(model) * m.tokens, wall_s=wall_s,
            group=m.group, seed=m.config.train.seed), indent=1))
        trained.append(m.name)
    return trained


def _run_wall_s(run_dir: Path, step: int):
    """The seconds a run took to reach `step` over all its invocations (checkpoint meta's
    wall_s), or None where its count began before wall_s was recorded."""
    from transformer import checkpoint

    try:
        ckpts = checkpoint.Checkpoints(run_dir, read_only=True)
        try:
            return ckpts.read_meta(step).get("wall_s")
        finally:
            ckpts.close()
    except checkpoint.CheckpointError:  # no checkpoint of that step: nothing to count
        return None


def write_atomic(path: Path, text: str) -> None:
    """Writes `text` to `path` so that a reader (or a kill mid-write, or a power loss) sees the
    old file or the new one, never half of it: a temporary file beside it, fsynced, then
    os.replace, then the folder fsynced (data/durable.py). The name carries the process id:
    members of one sweep may run in parallel (--index)."""
    durable.write_atomic(path, text)


def budget_label(kind: str, value: float) -> str:
    return {"tokens": f"{human(value)} tokens", "flops": f"{value:.1e} FLOPs",
            "chinchilla": f"{value:g} tokens/param"}[kind]


def _sweep_of(workdir):
    """The sweep config saved with the runs (its sizes define the ladder), or None."""
    return (_read_json(Path(workdir) / "sweep.json") or {}).get("sweep")


def _read_json(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None
