"""Every sweep member at its own settings: batch, each group's learning rate, weight decay and
warm-up from written rules of the member's width and its real token budget.

    settings(reference, d_model=64, tokens=3e6)   # {"train.batch_size": 16, "train.lr": ...}

A sweep with `rules=True` (sweep.sweep_config) applies them to every member. Without them a
member trains on its base config's batch, rates, decay and warm-up whatever its size and
budget: the IsoFLOP sweep of 2026-12-06 ran 83 to 14,303 steps on settings tuned for 880, with
a 20-step warm-up (24% of its shortest run) and Muon's decay timescale 1/(ηλ) = 500 steps (6×
its shortest run, 3.5% of its longest), which offsets whole budgets (docs/scaling.md).

The reference is the sweep's base config, taken as tuned at its own width d₀ = model.d_model
for its own horizon D₀ = train.steps × train.batch_size × model.max_seq_len tokens, batch B₀
and warm-up w₀ (for configs/default.py: d128, 1.8M tokens, batch 16, 50 of 880 steps). A
member of width d trained on D tokens gets (the rules of config/depth.py, fed D itself where
the depth dial assumes D ∝ N):

1. Batch (Power Lines, Bergsma et al. 2025: the optimal batch grows as D^0.383):
       B = B₀ · 2^round(log2((D/D₀)^0.383)),   steps S = round(D / (B·T)).
2. Rates (nanochat's η ∝ √(B/B₀) for every group; AdamW's groups ∝ 1/√d at width d):
       optimizer=muon:  muon_lr = muon_lr₀ · √(B/B₀),  lr = lr₀ · √(B/B₀) · √(d₀/d)
       optimizer=adamw: lr = lr₀ · √(B/B₀), hidden matrices by the width rule (lr_base_width d₀)
3. Weight decay, each group a constant fraction of its run: the decay timescale 1/(η·λ)
   in steps grows with the steps (Wang & Aitchison 2024, "How to set AdamW's weight decay as
   you scale model and dataset size"):  λ = λ₀ · (η₀/η) · (S₀/S), for train.weight_decay
   (with the AdamW rate) and train.muon_weight_decay (with Muon's).
4. Warm-up, a constant fraction of the steps: w = round(w₀/S₀ · S), at least 1 (0 stays 0).

A multiplier on the reference's rates (a sweep variant setting train.lr and train.muon_lr)
carries through rule 2 unchanged: configs/scaling/cpu_rate_check.py measures whether ×1 stays
best at the two corners of an IsoFLOP sweep.
"""

from __future__ import annotations

import math

from transformer.config import depth


def reference_tokens(reference) -> int:
    """D₀: the tokens the reference config trains on."""
    return reference.train.steps * reference.train.batch_size * reference.model.max_seq_len


def settings(reference, d_model: int, tokens: float) -> dict:
    """{dotted field: value} for a member of width `d_model` trained on `tokens` tokens, by
    the rules above from `reference` (the sweep's base config, a variant's changes applied)."""
    t, m = reference.train, reference.model
    d0, b0, s0, seq = m.d_model, t.batch_size, t.steps, m.max_seq_len
    horizon = tokens / reference_tokens(reference)
    batch = max(1, round(b0 * 2.0 ** round(math.log2(horizon ** depth.BATCH_EXPONENT))))
    steps = max(1, round(tokens / (batch * seq)))
    root = math.sqrt(batch / b0)
    out = {"train.batch_size": batch, "train.steps": steps,
           "train.warmup_steps": max(1, round(t.warmup_steps / s0 * steps))
           if t.warmup_steps else 0}
    if t.optimizer == "muon":
        out["train.muon_lr"] = t.muon_lr * root
        out["train.lr"] = t.lr * root * math.sqrt(d0 / d_model)
        out["train.muon_weight_decay"] = t.muon_weight_decay / root * s0 / steps
    else:
        out["train.lr"] = t.lr * root
        out["train.lr_base_width"] = t.lr_base_width or d0
    out["train.weight_decay"] = t.weight_decay * (t.lr / out["train.lr"]) * s0 / steps
    if t.grad_accum > 1 and batch % t.grad_accum:
        out["train.grad_accum"] = math.gcd(batch, t.grad_accum)
    return out


def describe(config) -> str:
    """One line: what a member trains with (the rules' outputs), for the sweep's log."""
    t = config.train
    rates = (f"muon_lr {t.muon_lr:.4g}, lr {t.lr:.4g}, decay {t.muon_weight_decay:.3g}/"
             f"{t.weight_decay:.3g}" if t.optimizer == "muon" else
             f"lr {t.lr:.4g}, decay {t.weight_decay:.3g}")
    return f"batch {t.batch_size}, warm-up {t.warmup_steps} of {t.steps} steps, {rates}"
