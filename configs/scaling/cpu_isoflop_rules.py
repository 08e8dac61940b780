"""IsoFLOP curves for the quick start's recipe (its block and Muon), every member at its own
batch, rates, decay and warm-up (transformer/scaling/rules.py, fed its width and real tokens).
4 layers; 6 budgets over 400x (6e10..2.4e13 FLOPs); the widths 8..128 where their tokens per
compute-equivalent parameter fall in WINDOW, the half-steps HALF_STEPS only in HALF_STEP_WINDOW,
near each optimum: 49 runs a seed, at SEEDS. cpu_isoflop.py: the same ladder on fixed settings.

    python -m transformer scaling --sweep=configs/scaling/cpu_isoflop_rules.py --workdir=runs/isoflop_rules
    python -m transformer scaling --workdir=runs/isoflop_rules --report --holdout=largest
    python -m transformer scaling --workdir=runs/isoflop_rules --verify --seeds=2
"""

from transformer.config.files import quick_start
from transformer.scaling.sweep import sweep_config

N_LAYERS = 4
WIDTHS = (8, 12, 16, 24, 32, 48, 64, 96, 128)
# Half a step between those (in N), each width a whole number of heads of at most 32.
HALF_STEPS = (10, 14, 20, 28, 40, 56, 72, 112, 168)
BUDGETS = (6e10, 2e11, 6e11, 2e12, 6e12, 2.4e13)
# Tokens per compute-equivalent parameter a member may train on: centred (in log) on the 8-10
# at which the refit of the 2026-12-06 sweep puts every budget's optimum, ~10x either side. A
# width step moves D/N by 2-3x here, so each budget keeps 5-6 sizes, two or more each side of
# its optimum: enough for a parabola, none of them a 10x-off run that only bends the fit. The
# top, 90, keeps every member of the first five budgets (79.9 the most) and leaves out d48 at
# 2.4e13 (103: 20M tokens, twice the corpus).
WINDOW = (0.75, 90)
# The half-steps, within about one width step of each optimum: with a seed noise of 0.023 nats
# the valleys' vertices, sampled a whole step (1.5-2x in N) apart, were what limited the
# exponent's interval (0.19 wide at the first five budgets with the whole steps alone).
HALF_STEP_WINDOW = (2, 35)
# The recipe's seed noise in nats per token before it was measured (0.004-0.010 on 880-step
# runs): the report uses the noise measured from the seeds below (0.023) instead.
SEED_NOISE = 0.01
# Seeds (train.seed): the first's members keep the plain names, later ones are variants named
# seed=<s> in the same group, so the report averages a size's seeds before it fits (a
# cluster per size in the bootstrap) and measures the seed noise from the paired members,
# which then replaces SEED_NOISE (report.seed_noise).
SEEDS = (0, 1)


def sizes(n_layers=N_LAYERS, widths=WIDTHS, head_dim=32, ff_ratio=2, keep_within=None):
    """The quick start's shape at other widths: heads of up to 32, d_ff twice d_model."""
    return [dict(name=f"L{n_layers}-d{d}", n_layers=n_layers, d_model=d,
                 n_heads=-(-d // head_dim), d_ff=ff_ratio * d,
                 **({"keep_within": keep_within} if keep_within else {})) for d in widths]


def get_config():
    base = quick_start()  # its batch, rates, decay and 50-step warm-up are the rules' reference
    # The recipe its records were measured on: the quick start before row 24 of docs/speedrun.md
    # (value embeddings, 835 steps) joined it; a sweep with them is another study.
    base.model.update(value_embeds="none")
    base.train.update(steps=880)
    # The whole standard library (~32 MB, ~10M tokens): no member reads it twice.
    base.data.update(max_bytes=32_000_000)
    base.train.update(eval_every=1_000_000, ckpt_every=2000, log_every=25)
    seeds = [{"name": "" if k == 0 else f"seed={s}", "group": "", "train.seed": s}
             for k, s in enumerate(SEEDS)]
    ladder = sizes() + sizes(widths=HALF_STEPS, keep_within=HALF_STEP_WINDOW)
    return sweep_config(base, ladder, budget_kind="flops", budgets=BUDGETS, window=WINDOW,
                        window_n="compute", rules=True, seed_noise=SEED_NOISE, variants=seeds)
