"""Do the member rules hold where most stretched? Both learning rates x0.5 / x1 / x2 on a small
member of a small budget of cpu_isoflop_rules.py (d8 at 6e10 FLOPs, its corner) and a large
one of a large budget (d96 at 2e12), with the rules (scaling/rules.py) or fixed (the base's
batch, rates, decay, 20-step warm-up, as cpu_isoflop.py). `,seeds=3` adds seeds.

    python -m transformer scaling --sweep=configs/scaling/cpu_rate_check.py:small,rules --workdir=runs/rate_small_rules
    python -m transformer scaling --sweep=configs/scaling/cpu_rate_check.py:small,fixed --workdir=runs/rate_small_fixed
    python -m transformer scaling --sweep=configs/scaling/cpu_rate_check.py:large,rules --workdir=runs/rate_large_rules
    python -m transformer scaling --sweep=configs/scaling/cpu_rate_check.py:large,fixed --workdir=runs/rate_large_fixed
"""

from transformer.config.files import quick_start
from transformer.scaling.sweep import sweep_config

CORNERS = {"small": (8, 6e10), "large": (96, 2e12)}  # (width, budget)
MULTIPLIERS = (0.5, 1.0, 2.0)


def get_config(arg="small,rules"):
    parts = dict(p.split("=") if "=" in p else (p, True) for p in arg.split(","))
    width, budget = CORNERS["large" if "large" in parts else "small"]
    rules = "fixed" not in parts
    base = quick_start()
    # The recipe its records were measured on: the quick start before row 24 of docs/speedrun.md
    # (value embeddings, 835 steps) joined it; a sweep with them is another study.
    base.model.update(value_embeds="none")
    base.train.update(steps=880)
    base.data.update(max_bytes=32_000_000)
    base.train.update(eval_every=1_000_000, ckpt_every=2000, log_every=25)
    if not rules:  # the fixed settings the 2026-12-06 sweep trained every member on
        base.train.update(warmup_steps=20)
    t = base.train
    variants = [{"name": f"x{m:g}" + (f"_seed{s}" if s else ""), "group": f"x{m:g}_seed{s}",
                 "train.lr": t.lr * m, "train.muon_lr": t.muon_lr * m, "train.seed": s}
                for s in range(int(parts.get("seeds", 1))) for m in MULTIPLIERS]
    size = dict(name=f"L4-d{width}", n_layers=4, d_model=width, n_heads=-(-width // 32),
                d_ff=2 * width)
    return sweep_config(base, [size], budget_kind="flops", budgets=(budget,),
                        variants=variants, rules=rules)
