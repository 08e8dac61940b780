"""Predict, then check by running it: train the compute-optimal size an IsoFLOP sweep predicts
at a budget beyond its own, next to its two ladder neighbours at the same budget, and compare.

    python -m transformer scaling --workdir=runs/isoflop --verify            # 4x its largest C
    python -m transformer scaling --workdir=runs/isoflop --verify --flops=1e13 --seeds=2

The fits are the report's (isoflop.fit_all on the finished members). Approach 3's optimum at
C names a size of the sweep's own ladder rule, the one nearest N_opt (`LadderCost.nearest`,
the very function --predict prints it with); its neighbours are the ladder sizes one sweep
step below and above (`LadderCost.neighbours`). Each is sized to C exactly as the sweep sizes
its members (tokens = C / its training FLOPs per token, in whole steps of the sweep's batch)
and trained with the sweep's base config, at `--seeds` seeds (train.seed, +1, ...), in
<workdir>/verify/flop<C>/: one folder per budget, so budgets are verified one after another
and a rerun skips what finished.

Two checks are printed. The loss: the predicted size's measured loss (first seed) against
Approach 3's L(N, D) at its N and D, with its 95% bootstrap interval, in % and in half-widths.
The size: the runs of one seed share data order and validation batches, so a neighbour's
loss minus the predicted size's is a paired gap; its seed noise is the standard deviation
of that gap over the seeds (not measured with one seed). The prediction is confirmed when
neither neighbour beats the predicted size by more than that noise (by anything at one seed).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import ml_collections
import numpy as np

from transformer.config import ConfigError
from transformer.model.sizes import human
from transformer.scaling import chinchilla, isoflop, report
from transformer.scaling import sweep as sweep_lib

FACTOR = 4.0  # the default budget: this many times the sweep's largest


def folder(workdir, C: float) -> Path:
    """Where the verification at budget C lives: one folder per budget (6 digits of C)."""
    return Path(workdir) / "verify" / ("flop" + f"{C:.6g}".replace("e+", "e"))


def plan(workdir, flops_budget: float | None = None, n_boot: int = 100, seeds: int = 1):
    """(the sweep to train: the predicted size and its neighbours at C, one variant per seed;
    the fits, C, the predicted optimum, the predicted size) for `workdir`."""
    workdir = Path(workdir)
    ok = report.best_per_size([r for r in report.collect(workdir)
                                  if math.isfinite(r["val_loss"])])
    if not ok or ok[0]["budget"] != "flops":
        raise ConfigError(f"--verify: {workdir} holds no finished IsoFLOP runs "
                          "(sweep.budget_kind='flops'); run such a sweep first")
    saved = sweep_lib._sweep_of(workdir)
    if not saved or not saved.get("base"):
        raise ConfigError(f"--verify: {workdir}/sweep.json with the sweep's base config is "
                          "missing: the run to verify is built from it")
    if saved.get("variants"):  # it would train the base, which no member of the sweep is
        names = ", ".join(v.get("name", "?") for v in saved["variants"])
        raise ConfigError(f"--verify: {workdir}'s sweep has variants ({names}) and --verify "
                          "trains its base config, which none of them is: verify a sweep "
                          "without variants (for a train.lr grid, one at the best lr)")
    runs = isoflop.runs_of(ok)
    fits = isoflop.fit_all(runs, n_boot, saved)
    if fits["a3"] is None:
        raise ConfigError("--verify: Approach 3 could not be fitted (needs >= 6 finished runs "
                          "with 3 sizes and 3 token counts)")
    C = flops_budget or FACTOR * max(r["budget"] for r in runs)
    best = isoflop.optimum(fits, C)
    cost = fits["cost"]
    size, _, _ = cost.nearest(best["N"])
    lower_upper = cost.neighbours(best["N"])
    check = ml_collections.ConfigDict(saved)
    check.sizes = sorted([size, *lower_upper], key=lambda s: cost.count(s)[0])
    check.budgets, check.budget_kind = (C,), "flops"
    if "window" in check:  # the three sizes train wherever the sweep's window would put them
        del check["window"]
    seed = check.base.train.seed
    # The first seed's members keep the plain names (<size>_flop<C>); later seeds are
    # variants named seed=<s>, so raising --seeds later adds members and keeps the rest.
    check.variants = [] if seeds == 1 else [
        {"name": "" if k == 0 else f"seed={seed + k}", "group": "", "train.seed": seed + k}
        for k in range(seeds)]
    return check, fits, C, best, size


def _refuse_another_plan(check, where: Path) -> None:
    """A budget's folder may gain sizes (a refit moved the optimum) and seeds; anything else
    differing means it was verified from another sweep, and its runs would not compare."""
    saved = sweep_lib._sweep_of(where)
    if saved is None:
        return
    diffs = {k: v for k, v in sweep_lib.differences(saved, json.loads(check.to_json())).items()
             if k not in ("sizes", "variants") and not sweep_lib.free_in_a_sweep(k)}
    if diffs:
        raise ConfigError(f"--verify: {where} holds a verification made from another sweep "
                          f"config ({', '.join(diffs)} differ): move that folder away to verify "
                          "this budget again")


def verdict(losses: dict, predicted: str) -> tuple[bool, str, dict]:
    """Whether the size `predicted` is the best of `losses` ({size: [val loss per seed]},
    seeds paired by position), within the seed noise of each paired gap. Returns (confirmed,
    one line saying why, {size: (mean gap to the predicted size, its seed noise or None)})."""
    mine = np.array(losses[predicted], float)
    broken = [name for name, values in losses.items() if not np.isfinite(values).all()]
    if broken:  # NaN compares as neither better nor worse: it would pass as "confirmed"
        return False, (f"no verdict: the val loss of {', '.join(broken)} is not finite (a "
                       "diverged or unevaluated run)"), {}
    gaps, beaten = {}, []
    for name, values in losses.items():
        if name == predicted:
            continue
        gap = np.array(values, float) - mine  # positive: the predicted size is better
        noise = float(np.std(gap, ddof=1)) if len(gap) > 1 else None
        gaps[name] = (float(gap.mean()), noise)
        if gap.mean() < 0:
            beaten.append(name)
    if not gaps:
        return False, "nothing to compare: the ladder has no neighbour of the predicted size", {}
    if not beaten:
        return True, (f"confirmed: {predicted} has the lowest val loss of the "
                      f"{len(losses)} sizes"), gaps
    worst = min(beaten, key=lambda n: gaps[n][0])
    mean, noise = gaps[worst]
    if noise is not None and -mean <= noise:
        return True, (f"confirmed within seed noise: {worst} is lower by {-mean:.4f}, less "
                      f"than the seed noise of that gap ({noise:.4f})"), gaps
    why = (f"more than the seed noise of that gap ({noise:.4f})" if noise is not None
           else "seed noise not measured (--seeds=1)")
    return False, f"NOT confirmed: {worst} is lower by {-mean:.4f}, {why}", gaps


def verify(workdir, flops_budget: float | None = None, log=print, n_boot: int = 100,
           progress: bool = True, seeds: int = 2) -> dict:
    """Trains the predicted compute-optimal size and its neighbours; prints measured against
    predicted loss and the three-size table."""
    if seeds < 1:
        raise ConfigError(f"--seeds={seeds}: must be at least 1")
    check, fits, C, best, size = plan(workdir, flops_budget, n_boot, seeds)
    members = sweep_lib.members(check)
    # members: seeds outer, sizes inner (sweep.members), so member i is size i % len(sizes)
    names = [s["name"] for s in check.sizes]
    member = members[names.index(size["name"])]  # the predicted size, first seed
    where = folder(workdir, C)
    _refuse_another_plan(check, where)
    largest = max(r["budget_value"] for r in report.collect(workdir))
    log(f"verify: C = {C:.3g} FLOPs ({C / largest:.3g}x the sweep's largest budget); "
        f"Approach 3's optimum N_opt = {human(best['N'])}, D_opt = {human(best['D'])}; "
        f"training the nearest ladder size {size['name']} ({member.config.train.steps} steps, "
        f"{member.tokens:,} tokens) and its neighbours "
        f"{', '.join(s['name'] for s in check.sizes if s['name'] != size['name'])}, "
        f"{seeds} seed{'s' if seeds > 1 else ''} each, in {where}")
    sweep_lib.run(check, where, log=log, progress=progress, allow_change=("sizes", "variants"))
    rows = {r["name"]: r for r in report.collect(where)}
    row = rows[member.name]
    N, D, measured = row["params_non_embedding"], row["tokens"], row["val_loss"]
    predicted = float(chinchilla.loss_nd(fits["a3"], N, D))
    lo, hi = chinchilla.interval([float(chinchilla.loss_nd(f, N, D)) for f in fits["boot3"]])
    half = (hi - lo) / 2
    error = 100 * (measured - predicted) / predicted
    widths = (measured - predicted) / half if half > 0 else math.nan
    lines = [f"verify at C = {C:.3g} FLOPs: {member.name} ({human(N)} non-embedding params, "
             f"{human(D)} tokens, {row['flops']:.3g} FLOPs counted)",
             f"  predicted val loss = {predicted:.4f} [{lo:.4f}, {hi:.4f}] nats/token "
             f"(Approach 3 at this N and D, 95% bootstrap interval, {len(fits['boot3'])} "
             "resamples)",
             f"  measured val loss  = {measured:.4f}: {error:+.2f}% of the prediction, "
             f"{widths:+.2f} interval half-widths "
             f"({'inside' if lo <= measured <= hi else 'OUTSIDE'} the interval)"]
    confirmed, why, table = _size_table(check, members, rows, size["name"], fits, C, seeds)
    lines += ["", *table, "", why]
    log("\n".join(lines))
    return dict(C=C, name=member.name, N=N, D=D, predicted=predicted, interval=(lo, hi),
                measured=measured, error_pct=error, error_widths=widths, folder=str(where),
                confirmed=confirmed, verdict=why)


def _size_table(check, members, rows, predicted: str, fits, C: float, seeds: int):
    """(confirmed, why, markdown lines): each size's val loss per seed, its mean, its paired
    gap to the predicted size with the gap's seed noise, and Approach 3's prediction."""
    by_size = {s["name"]: [rows[m.name] for m in members
                           if m.index % len(check.sizes) == i]
               for i, s in enumerate(check.sizes)}
    losses = {name: [r["val_loss"] for r in rs] for name, rs in by_size.items()}
    confirmed, why, gaps = verdict(losses, predicted)
    seed0 = check.base.train.seed
    head = " | ".join(f"val loss, seed {seed0 + k}" for k in range(seeds))
    lines = [f"{len(by_size)} sizes at C = {C:.3g} FLOPs (the gap is paired: a size's val loss "
             "minus the predicted size's at the same seed; positive: the prediction is "
             "better):", "",
             f"| size | N | D | tokens/param | {head} | mean | gap to {predicted} "
             "[seed noise] | Approach 3 |",
             "|" + "---|" * (7 + seeds)]
    for name, rs in by_size.items():
        r = rs[0]
        N, D = r["params_non_embedding"], r["tokens"]
        if name == predicted:
            gap = "(predicted)"
        else:
            mean, noise = gaps.get(name, (math.nan, None))  # none without a verdict
            gap = f"{mean:+.4f} [{noise:.4f}]" if noise is not None else f"{mean:+.4f}"
        lines.append(f"| {name} | {human(N)} | {human(D)} | {D / N:.3g} | "
                     + " | ".join(f"{x:.4f}" for x in losses[name])
                     + f" | {np.mean(losses[name]):.4f} | {gap} "
                     f"| {float(chinchilla.loss_nd(fits['a3'], N, D)):.4f} |")
    return confirmed, why, lines
