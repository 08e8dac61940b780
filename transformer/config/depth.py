"""One depth dial: `model.depth = N` (0: off) derives the rest of a run from N by written rules.

    config = depth.derive(config)     # a new config; the identity when model.depth is 0
    print(depth.describe(config))     # what the depth derived, for `sizes` and the data line

The config as written is the *reference*: its own sizes, learning rates, batch and weight
decays are taken as tuned at its own depth L₀ = model.n_layers, and depth N scales them by
the rules below (so `--config.model.depth=4` on the quick start, whose n_layers is 4, keeps its
sizes, rates and batch; only the horizon follows the rule). A derived config is its own
reference, so deriving twice changes nothing: a resumed run, or `sizes` on a saved config,
derives the same values again. Derived where every tool resolves its config
(train/resolve.py: a run's start, `sizes`, `compile`, a sweep's members): the model only
ever sees explicit sizes.

The rules (reference values with a 0; N the blocks' matrix parameters, D the token horizon,
B the tokens a step, d the width):

1. Shape (nanochat's `--aspect-ratio` and `--head-dim`, scripts/base_train.py; this project's
   ladders, scaling/sweep.ladder): a fixed aspect ratio d₀/L₀ and head width d₀/H₀:
       d_model = d₀/L₀ · N rounded up to a multiple of the head width,
       n_heads = d_model / head width, d_ff = d_model · d_ff₀/d₀, K/V heads in the same groups.
2. Horizon (nanochat's `--target-param-data-ratio`, 12 there; Chinchilla's ~20):
       D = train.tokens_per_param · N,   N = the blocks' attention and MLP matrices.
   The ratio cancels in D/D₀ = N/N₀, which is all the batch and decay rules read: with
   tokens_per_param = 0 the steps are train.steps as given (a sweep's budget) and every
   other rule is the same.
   nanochat counts its output head in N too (its dev/LOG.md, 2026-01-27); here N leaves it
   out, so the rules are a function of the config alone (the vocabulary is the tokenizer's,
   known only once the data is read).
3. Batch ("Power Lines", Bergsma et al. 2025, as nanochat uses it: B ∝ D^0.383):
       B = B₀ · 2^round(log2((D/D₀)^0.383))   (the reference's batch times a power of two).
4. Learning rates (nanochat: η ∝ √(B/B₀) for every group, Muon included, "not studied
   carefully" there; AdamW's groups ∝ 1/√d at width d):
       optimizer=muon:  muon_lr = muon_lr₀ · √(B/B₀)
                        lr      = lr₀ · √(B/B₀) · √(d₀/d)    (embedding, head, norms: AdamW)
       optimizer=adamw: lr = lr₀ · √(B/B₀), and the hidden matrices by this project's width
                        rule (μP for AdamW, train/width_lr.py): lr_base_width = d₀ unless set.
5. Weight decay (the T_epoch = B/(η·λ·D) of Wang & Aitchison 2024, "How to set AdamW's weight
   decay as you scale model and dataset size", held fixed with η ∝ √B, as nanochat does):
       λ = λ₀ · √(B/B₀) · D₀/D, for train.weight_decay and train.muon_weight_decay.
6. Steps: train.steps = round(D / B), at least 1 (tokens_per_param > 0).

Measured (rule 4, with 1-3 and 5 beneath it): configs/scaling/depth_lr_transfer.py swept one
multiplier on both rates at depths 2, 3, 4 (one seed, 4 tokens per parameter); the best was
x2, x1, x2, with x1 and x2 within 0.0065 nats per byte at every depth (docs/scaling.md, "One
depth dial"). The optimum does not drift over 8x in N; depths above 4, other horizons and
more seeds are not measured.
"""

from __future__ import annotations

import math
from fractions import Fraction

from transformer.config.schema import ConfigError, replace

BATCH_EXPONENT = 0.383  # Power Lines: the optimal batch grows as D^0.383


def matrices(d_model: int, n_layers: int, n_heads: int, n_kv_heads: int, d_ff: int,
             mlp: str) -> int:
    """N: the blocks' attention (Q, K, V, out) and MLP matrices, no embedding or head."""
    head = d_model // n_heads
    kv = n_kv_heads or n_heads
    hidden = max(8, 8 * round(2 * d_ff / 3 / 8)) if mlp == "swiglu" else d_ff  # schema's
    mlp_weights = (3 if mlp == "swiglu" else 2) * d_model * hidden
    return n_layers * (2 * d_model * n_heads * head + 2 * d_model * kv * head + mlp_weights)


def _n(m) -> int:
    return matrices(m.d_model, m.n_layers, m.n_heads, m.n_kv_heads, m.d_ff, m.mlp)


def derived(config) -> dict:
    """{dotted field: value} that depth `config.model.depth` sets (empty when it is 0)."""
    m, t = config.model, config.train
    depth = m.depth
    if not depth:
        return {}
    head = m.d_model // m.n_heads
    d = math.ceil(Fraction(m.d_model, m.n_layers) * depth / head) * head
    heads = d // head
    group = m.n_heads // (m.n_kv_heads or m.n_heads)
    if heads % group:
        raise ConfigError(f"model.depth={depth}: {heads} heads cannot keep K/V groups of "
                          f"{group} (model.n_heads={m.n_heads}, n_kv_heads={m.n_kv_heads}); "
                          "set n_kv_heads=0 or a depth whose heads it divides")
    d_ff = max(1, round(m.d_ff * d / m.d_model))
    kv = 0 if not m.n_kv_heads else heads // group
    n0, n = _n(m), matrices(d, depth, heads, kv, d_ff, m.mlp)
    horizon = n / n0  # D/D₀: the same ratio of tokens per parameter at both depths
    doublings = round(math.log2(horizon ** BATCH_EXPONENT))
    batch = max(1, round(t.batch_size * 2.0 ** doublings))
    b_ratio = batch / t.batch_size  # B/B₀ (a power of two; the context is fixed)
    lr_scale = math.sqrt(b_ratio)
    wd_scale = math.sqrt(b_ratio) / horizon
    out = {"model.n_layers": depth, "model.d_model": d, "model.n_heads": heads,
           "model.d_ff": d_ff, "model.n_kv_heads": kv,
           "train.batch_size": batch,
           "train.weight_decay": t.weight_decay * wd_scale,
           "train.muon_weight_decay": t.muon_weight_decay * wd_scale}
    if t.tokens_per_param:
        out["train.steps"] = max(1, round(t.tokens_per_param * n / (batch * m.max_seq_len)))
    if t.optimizer == "muon":
        out["train.muon_lr"] = t.muon_lr * lr_scale
        out["train.lr"] = t.lr * lr_scale * math.sqrt(m.d_model / d)
    else:
        out["train.lr"] = t.lr * lr_scale
        out["train.lr_base_width"] = t.lr_base_width or m.d_model
    if t.grad_accum > 1 and batch % t.grad_accum:
        out["train.grad_accum"] = math.gcd(batch, t.grad_accum)
    return out


def derive(config):
    """`config` with what model.depth derives written into its fields (a new config; the same
    one when depth is 0). Deriving a derived config gives it back unchanged."""
    changes = derived(config)
    if not changes:
        return config
    return replace(config, **changes)


def describe(config) -> str | None:
    """One line: the depth, what it derived and by which rules (None when depth is 0)."""
    m, t = config.model, config.train
    if not m.depth:
        return None
    n = _n(m)
    tokens = t.steps * t.batch_size * m.max_seq_len
    horizon = (f"{n:,} matrix params x {t.tokens_per_param:g} = {tokens:,} tokens" if
               t.tokens_per_param else f"{n:,} matrix params; {tokens:,} tokens as given")
    rates = (f"muon_lr {t.muon_lr:.4g}, lr {t.lr:.4g}" if t.optimizer == "muon" else
             f"lr {t.lr:.4g} (hidden matrices x {t.lr_base_width}/{m.d_model})")
    return (f"depth {m.depth} derives (config/depth.py): d_model {m.d_model}, {m.n_heads} heads, "
            f"d_ff {m.d_ff}; {horizon} in {t.steps:,} steps of {t.batch_size} x {m.max_seq_len}; {rates}; weight decay "
            f"{t.weight_decay:.4g}, muon {t.muon_weight_decay:.4g}")

