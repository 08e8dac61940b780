"""Predict, then check by running it: train the compute-optimal size an IsoFLOP sweep predicts
at a budget beyond its own, next to its two ladder neighbours at the same budget, and compare.

    python -m transformer scaling --workdir=runs/isoflop --verify            # 4x its largest C
    python -m transformer scaling --workdir=runs/isoflop --verify --flops=1e13 --seeds=2

The fits are the report's (isoflop.fit_all on the finished members). The optimum at C (from
Approach 3 where it fits, else Approach 2: isoflop.optimum, gate.py) names a size of the
sweep's own ladder rule, the one nearest N_opt (`LadderCost.nearest`, the very function
--predict prints it with); its neighbours are the ladder sizes nearest half and twice that N
(`LadderCost.neighbours`: one sweep step is too close to the optimum to tell apart). Each is sized to C exactly as the sweep sizes
its members (tokens = C / its training FLOPs per token, in whole steps of the sweep's batch)
and trained with the sweep's base config, at `--seeds` seeds (train.seed, +1, ...), in
<workdir>/verify/flop<C>/: one folder per budget, so budgets are verified one after another
and a rerun skips what finished.

Two checks are printed. The loss: the predicted size's measured loss (its mean over the
seeds) against the predicted loss with its 95% bootstrap interval, in % and in half-widths:
Approach 3's L(N, D) at its N and D where Approach 3 fits, else L_opt(C) = E + A·C^(−α)
through each budget's minimum loss (chinchilla.min_loss_law, fitted to the sweep alone, never
to a verification's result). The size: the runs of one seed share data order and
validation batches, so a neighbour's loss minus the predicted size's is a paired gap; its
seed spread is the standard deviation of that gap over the seeds (not measured with one
seed). The verdict is one of three:
    confirmed     the predicted size beats both neighbours by more than each gap's spread
    refuted       a neighbour beats it by more than that gap's spread
    inconclusive  anything else: a gap within its seed spread, or one seed (no spread)
A noise-sized gap decides nothing either way.
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


def plan(workdir, flops_budget: float | None = None, n_boot: int = 100, seeds: int = 1,
         rows: list | None = None, saved: dict | None = None):
    """(the sweep to train: the predicted size and its neighbours at C, one variant per seed;
    the fits, C, the predicted optimum, the predicted size) for `workdir`, or for the
    finished members `rows` of the sweep `saved` (report rows and the sweep's dict: a sweep
    refitted from its records, transformer/lab/isoflop_refit.py, with no run folders)."""
    workdir = Path(workdir)
    rows = report.collect(workdir) if rows is None else rows
    finite = [r for r in rows if math.isfinite(r["val_loss"])]
    ok = report.best_per_size(finite)
    if not ok or ok[0]["budget"] != "flops":
        raise ConfigError(f"--verify: {workdir} holds no finished IsoFLOP runs "
                          "(sweep.budget_kind='flops'); run such a sweep first")
    saved = saved or sweep_lib._sweep_of(workdir)
    if not saved or not saved.get("base"):
        raise ConfigError(f"--verify: {workdir}/sweep.json with the sweep's base config is "
                          "missing: the run to verify is built from it")
    if any(set(v) - {"name", "group", "train.seed"} for v in saved.get("variants") or []):
        # it would train the base, which no member of the sweep is (variants that set only
        # train.seed are the base's seeds: their members are averaged before the fits)
        names = ", ".join(v.get("name", "?") for v in saved["variants"])
        raise ConfigError(f"--verify: {workdir}'s sweep has variants ({names}) and --verify "
                          "trains its base config, which none of them is: verify a sweep "
                          "without variants (for a train.lr grid, one at the best lr)")
    runs = isoflop.runs_of(ok)
    fits = isoflop.fit_all(runs, n_boot, saved, measured_noise=report.seed_noise(finite))
    C = flops_budget or FACTOR * max(r["budget"] for r in runs)
    best = isoflop.optimum(fits, C)  # Approach 3 where it fits, else Approach 2
    cost = fits["cost"]
    size, _, _ = cost.nearest(best["N"])
    lower_upper = cost.neighbours(best["N"])
    check = ml_collections.ConfigDict(saved)
    check.sizes = sorted([size, *lower_upper], key=lambda s: cost.count(s)[0])
    check.budgets, check.budget_kind = (C,), "flops"
    for key in ("window", "window_n"):  # the three sizes train wherever the window would put them
        if key in check:
            del check[key]
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


def verdict(losses: dict, predicted: str) -> tuple[str, str, dict]:
    """Whether the size `predicted` is the best of `losses` ({size: [val loss per seed]},
    seeds paired by position): "confirmed" when it beats every other size by more than the
    seed spread of that paired gap, "refuted" when another beats it by more than the spread,
    else "inconclusive" (also at one seed: no spread is measured); "no verdict" when a loss
    is not finite. Returns (verdict, one line saying why, {size: (mean gap to the predicted
    size, its seed spread or None)})."""
    mine = np.array(losses[predicted], float)
    broken = [name for name, values in losses.items() if not np.isfinite(values).all()]
    if broken:  # NaN compares as neither better nor worse
        return "no verdict", (f"no verdict: the val loss of {', '.join(broken)} is not finite "
                              "(a diverged or unevaluated run)"), {}
    gaps = {}
    for name, values in losses.items():
        if name != predicted:
            gap = np.array(values, float) - mine  # positive: the predicted size is better
            gaps[name] = (float(gap.mean()), float(np.std(gap, ddof=1)) if len(gap) > 1
                          else None)
    if not gaps:
        return "no verdict", "nothing to compare: the ladder has no neighbour of the size", {}
    if any(noise is None for _, noise in gaps.values()):
        return "inconclusive", ("inconclusive: one seed measures no seed spread, so no gap "
                                "can be told from noise (--seeds=2 or more)"), gaps
    beaten = {n: (m, s) for n, (m, s) in gaps.items() if m < 0 and -m > s}
    if beaten:
        worst = min(beaten, key=lambda n: beaten[n][0])
        mean, noise = beaten[worst]
        return "refuted", (f"refuted: {worst} is lower by {-mean:.4f}, more than the seed "
                           f"spread of that gap ({noise:.4f})"), gaps
    close = {n: (m, s) for n, (m, s) in gaps.items() if m <= s}
    if close:
        name = min(close, key=lambda n: close[n][0])
        mean, noise = close[name]
        return "inconclusive", (f"inconclusive: the gap to {name} ({mean:+.4f}) is within its "
                                f"seed spread ({noise:.4f})"), gaps
    return "confirmed", (f"confirmed: {predicted} beats every other size by more than the "
                         "seed spread of each gap"), gaps


def verify(workdir, flops_budget: float | None = None, log=print, n_boot: int = 100,
           progress: bool = True, seeds: int = 2, rows: list | None = None,
           saved: dict | None = None) -> dict:
    """Trains the predicted compute-optimal size and its neighbours; prints measured against
    predicted loss and the three-size table. `rows` and `saved`: as plan's."""
    if seeds < 1:
        raise ConfigError(f"--seeds={seeds}: must be at least 1")
    rows = report.collect(workdir) if rows is None else rows
    check, fits, C, best, size = plan(workdir, flops_budget, n_boot, seeds, rows, saved)
    members = sweep_lib.members(check)
    # members: seeds outer, sizes inner (sweep.members), so member i is size i % len(sizes)
    names = [s["name"] for s in check.sizes]
    member = members[names.index(size["name"])]  # the predicted size, first seed
    where = folder(workdir, C)
    _refuse_another_plan(check, where)
    largest = max(r["budget_value"] for r in rows)
    log(f"verify: C = {C:.3g} FLOPs ({C / largest:.3g}x the sweep's largest budget); "
        f"{best['source']}'s optimum N_opt = {human(best['N'])} compute-equivalent params, "
        f"D_opt = {human(best['D'])}; training the nearest ladder size {size['name']} "
        f"({member.config.train.steps} steps, {member.tokens:,} tokens) and the sizes nearest "
        f"half and twice its N, "
        f"{', '.join(s['name'] for s in check.sizes if s['name'] != size['name'])}, "
        f"{seeds} seed{'s' if seeds > 1 else ''} each, in {where}")
    sweep_lib.run(check, where, log=log, progress=progress, allow_change=("sizes", "variants"))
    rows = {r["name"]: r for r in report.collect(where)}
    mine = [rows[m.name] for m in members if m.index % len(names) == names.index(size["name"])]
    row = mine[0]
    N, D = row["flops"] / (6 * row["tokens"]), row["tokens"]
    measured = float(np.mean([r["val_loss"] for r in mine]))
    predicted, (lo, hi), how = predicted_loss(fits, best, N, D)
    half = (hi - lo) / 2
    error = 100 * (measured - predicted) / predicted
    widths = (measured - predicted) / half if half > 0 else math.nan
    lines = [f"verify at C = {C:.3g} FLOPs: {size['name']} ({human(N)} compute-equivalent "
             f"params, {human(D)} tokens, {row['flops']:.3g} FLOPs counted)",
             f"  predicted val loss = {predicted:.4f} [{lo:.4f}, {hi:.4f}] nats/token ({how}, "
             "95% bootstrap interval)",
             f"  measured val loss  = {measured:.4f} (mean of {len(mine)} seed"
             f"{'s' if len(mine) > 1 else ''}): {error:+.2f}% of the prediction, "
             f"{widths:+.2f} interval half-widths "
             f"({'inside' if lo <= measured <= hi else 'OUTSIDE'} the interval)"]
    said, why, table = _size_table(check, members, rows, size["name"], fits, C, seeds)
    lines += ["", *table, "", why]
    log("\n".join(lines))
    return dict(C=C, name=member.name, N=N, D=D, predicted=predicted, interval=(lo, hi),
                measured=measured, error_pct=error, error_widths=widths, folder=str(where),
                verdict=said, why=why, source=best["source"])


def predicted_loss(fits, best: dict, N: float, D: float):
    """(loss, (lo, hi), how) the trained size should reach: Approach 3's L(N, D) at its own
    N and D where Approach 3 fits, else the optimum's loss at C from E + A·C^(−α) through each
    budget's minimum loss (isoflop.optimum)."""
    if best["source"] == "Approach 3":
        lo_hi = chinchilla.interval([float(chinchilla.loss_nd(f, N, D)) for f in fits["boot3"]])
        return (float(chinchilla.loss_nd(fits["a3"], N, D)), lo_hi,
                f"Approach 3 at this N and D, {len(fits['boot3'])} resamples")
    return (best["loss"], best["loss_int"], "Approach 3 does not fit: E + A·C^(−α) through each "
            f"budget's minimum loss, {len(fits['boot2'])} resamples")


def _size_table(check, members, rows, predicted: str, fits, C: float, seeds: int):
    """(verdict, why, markdown lines): each size's val loss per seed, its mean, its paired
    gap to the predicted size with the gap's seed spread, and Approach 3's prediction."""
    by_size = {s["name"]: [rows[m.name] for m in members
                           if m.index % len(check.sizes) == i]
               for i, s in enumerate(check.sizes)}
    losses = {name: [r["val_loss"] for r in rs] for name, rs in by_size.items()}
    said, why, gaps = verdict(losses, predicted)
    seed0 = check.base.train.seed
    head = " | ".join(f"val loss, seed {seed0 + k}" for k in range(seeds))
    lines = [f"{len(by_size)} sizes at C = {C:.3g} FLOPs (the gap is paired: a size's val loss "
             "minus the predicted size's at the same seed; positive: the prediction is "
             "better):", "",
             f"| size | N (compute-equivalent) | D | tokens/param | {head} | mean "
             f"| gap to {predicted} [seed spread] | Approach 3 |",
             "|" + "---|" * (7 + seeds)]
    for name, rs in by_size.items():
        r = rs[0]
        N, D = r["flops"] / (6 * r["tokens"]), r["tokens"]
        a3 = (f"{float(chinchilla.loss_nd(fits['a3'], N, D)):.4f}" if fits["a3"] else "-") \
            + ("" if fits["gate"]["fits"] else " (does not fit)")
        if name == predicted:
            gap = "(predicted)"
        else:
            mean, noise = gaps.get(name, (math.nan, None))  # none without a verdict
            gap = f"{mean:+.4f} [{noise:.4f}]" if noise is not None else f"{mean:+.4f}"
        lines.append(f"| {name} | {human(N)} | {human(D)} | {D / N:.3g} | "
                     + " | ".join(f"{x:.4f}" for x in losses[name])
                     + f" | {np.mean(losses[name]):.4f} | {gap} | {a3} |")
    return said, why, lines
