"""Predict, then check by running it: train the compute-optimal run an IsoFLOP sweep predicts
at a budget beyond its own, and compare the measured loss with the prediction.

    python -m transformer scaling --workdir=runs/isoflop --verify            # 4x its largest C
    python -m transformer scaling --workdir=runs/isoflop --verify --flops=1e13

The fits are the report's (isoflop.fit_all on the finished members). Approach 3's optimum at
C names a size of the sweep's own ladder rule (the one nearest N_opt); that size is then sized
to C exactly as the sweep sizes its members (tokens = C / its training FLOPs per token, in
whole steps of the sweep's batch) and trained with the sweep's base config in
<workdir>/verify/. The prediction compared is Approach 3's L(N, D) at that run's N and D, with
its 95% bootstrap interval; the error is given in % and in half-widths of that interval
(within ±1: inside it).
"""

from __future__ import annotations

import math
from pathlib import Path

import ml_collections

from transformer.config import ConfigError
from transformer.model.sizes import human
from transformer.scaling import chinchilla, isoflop, report
from transformer.scaling import sweep as sweep_lib

FACTOR = 4.0  # the default budget: this many times the sweep's largest


def plan(workdir, flops_budget: float | None = None, n_boot: int = 100):
    """(the one-member sweep to train, the fits, C, the predicted optimum) for `workdir`."""
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
    runs = isoflop.runs_of(ok)
    fits = isoflop.fit_all(runs, n_boot, saved)
    if fits["a3"] is None:
        raise ConfigError("--verify: Approach 3 could not be fitted (needs >= 6 finished runs "
                          "with 2 sizes and 2 token counts)")
    C = flops_budget or FACTOR * max(r["budget"] for r in runs)
    best = isoflop.optimum(fits, C)
    size, _, _ = fits["cost"].nearest(best["N"])
    check = ml_collections.ConfigDict(saved)
    check.sizes, check.budgets, check.budget_kind = [size], (C,), "flops"
    check.variants = []
    return check, fits, C, best


def verify(workdir, flops_budget: float | None = None, log=print, n_boot: int = 100,
           progress: bool = True) -> dict:
    """Trains the predicted compute-optimal run and prints measured against predicted loss."""
    check, fits, C, best = plan(workdir, flops_budget, n_boot)
    [member] = sweep_lib.members(check)
    largest = max(r["budget_value"] for r in report.collect(workdir))
    log(f"verify: C = {C:.3g} FLOPs ({C / largest:.3g}x the sweep's largest budget); "
        f"Approach 3's optimum N_opt = {human(best['N'])}, D_opt = {human(best['D'])}; "
        f"training the nearest ladder size {member.name}: {member.config.train.steps} steps, "
        f"{member.tokens:,} tokens")
    sweep_lib.run(check, Path(workdir) / "verify", log=log, progress=progress)
    [row] = [r for r in report.collect(Path(workdir) / "verify") if r["name"] == member.name]
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
    log("\n".join(lines))
    return dict(C=C, name=member.name, N=N, D=D, predicted=predicted, interval=(lo, hi),
                measured=measured, error_pct=error, error_widths=widths)
