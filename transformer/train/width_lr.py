"""Learning rates that transfer across widths: μP's AdamW rule for the hidden matrices.

    multiplier(t, d_model)                 # lr_base_width / d_model, or 1.0 when the rule is off
    is_hidden_matrix(path)                 # a kernel of a block's attention or MLP
    scale_hidden_matrices(adamw, m)        # AdamW whose hidden matrices step at m · lr

`train.lr_base_width = w` (0: off) trains the blocks' hidden matrices (attention's
query/key/value/out kernels, the MLP's kernels) at

    lr_matrix = train.lr · w / d_model

and everything else (the token embedding, which is also the tied output head, the position
table, an untied head, norm scales, every bias) at `train.lr`. So `train.lr` means "the rate
tuned at width w", and a ladder tuned once at one width keeps its optimum at the others.

Why: with Adam the update of a weight is of order lr whatever its gradient's size, so a
matrix with fan-in n moves its output by about lr · n per step (n coordinates adding up
coherently). Keeping that change of a hidden layer's output constant as width grows needs
lr ∝ 1/n; vector-like parameters (embeddings, gains, biases: one width-sized axis) need a
constant lr. That is the Adam column of μP's table (Yang et al. 2022, "Tensor Programs V:
Tuning Large Neural Networks via Zero-Shot Hyperparameter Transfer", Table 3; the `mup`
package's MuAdam divides a matrix's lr by its fan-in's width multiplier the same way).
Here every hidden fan-in is d_model, H·K or d_ff, and the ladders hold H·K = d_model and
d_ff = 4·d_model, so one ratio w / d_model is μP's 1/fan-in ratio for all of them.

What this is not, on purpose: μP also scales the output logits by w / d_model and the init
of the hidden matrices by 1/sqrt(fan_in); this project keeps GPT-2's fixed N(0, 0.02) init
and tied embeddings (the head is the embedding, so its rate stays lr). The ladders also grow
depth with width; this rule corrects width only. docs/scaling.md shows what it does there.

AdamW's decay is multiplied by the lr (optax's decoupled form: p -= lr·(adam + wd·p)), so a
hidden matrix's per-step shrink lr·wd scales with the rule too, as it does in mup's MuAdam.
With `train.optimizer=muon` (branch optim) the hidden matrices are Muon's, whose update is
already normalised by shape; the rule scales only what AdamW trains, which then holds no
hidden matrix, so it changes nothing there.

The wrapped optimizer keeps AdamW's state exactly (same tree), so a checkpoint restores with
the rule on or off; at w == d_model the multiplier is 1.0 and the updates are bitwise equal.
"""

from __future__ import annotations

import jax
import optax

# The blocks' hidden matrices, by module names (never by shape: the untied head is a 2-D
# kernel too, and the scanned layout gives every block parameter a leading layer axis).
HIDDEN = {"attn": ("query", "key", "value", "out"), "mlp": ("expand", "gate", "project")}


def is_hidden_matrix(path) -> bool:
    keys = [str(getattr(k, "key", k)) for k in path]
    return len(keys) >= 3 and keys[-1] == "kernel" and keys[-2] in HIDDEN.get(keys[-3], ())


def multiplier(t, d_model: int) -> float:
    """The hidden matrices' lr over `train.lr`: lr_base_width / d_model (1.0 when off)."""
    return t.lr_base_width / d_model if t.lr_base_width else 1.0


def multipliers(params, m: float):
    """{path: the factor on train.lr of that parameter}: m for hidden matrices, else 1."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: m if is_hidden_matrix(path) else 1.0, params)


def scale_hidden_matrices(inner: optax.GradientTransformation,
                          m: float) -> optax.GradientTransformation:
    """`inner` (AdamW, whose updates are already -lr·(...)) with the updates of the hidden
    matrices times m. Its state is inner's own, untouched: the rule adds nothing to save."""

    def update(updates, state, params=None):
        updates, state = inner.update(updates, state, params)
        updates = jax.tree_util.tree_map_with_path(
            lambda path, u: u * m if is_hidden_matrix(path) else u, updates)
        return updates, state

    return optax.GradientTransformation(inner.init, update)
