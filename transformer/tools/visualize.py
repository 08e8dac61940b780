"""Attention maps and the next-token distribution of a trained run, as PNG images.

    python -m transformer visualize --workdir=runs/default --prompt="def main():" --out=attn/

writes into --out
    attention_layer{i}.png   one heatmap per head of layer i: row = query token, column = key
                             token, colour = attention weight (rows sum to 1; masked keys are 0)
    next_token.png           the most likely next tokens after the prompt, with probabilities

The weights come from the model itself: `GPT.apply(..., mutable=["intermediates"])` returns
what each attention layer sowed (model/gpt.py), computed by the kernels the run trained with
(`model.matmul`; on CPU by default the bfloat16-input fast path), so the picture is of the
code that trains, not of a second implementation. One exception: a model trained with
`attention_kernel=jax` is looked at through the einsum kernel, because the jax kernel never
forms the weights (the two compute the same attention). Prompts of 10-40 tokens read best.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from transformer import checkpoint, cli
from transformer.config import ModelConfig
from transformer.generate.decode import PromptError
from transformer.model import kernels
from transformer.model.gpt import GPT, unstack_layers


def load_run(workdir, step=None):
    """(model_config, params, tokenizer, step) of a run's checkpoint (the newest good one by
    default), through the checked restore every reader of a run uses."""
    run = checkpoint.load_run(workdir, step=step)
    return run.model_config, run.params, run.tokenizer, run.step


def look_inside(model_config: ModelConfig, params, tokens: list[int]):
    """One forward pass that also returns what the blocks sowed.

    Returns (weights_LHTT, logits_TV, intermediates): attention weights per layer (numpy,
    float32), the logits, and the raw per-layer intermediates (queries, keys, values, ...).
    The einsum kernel is used because it forms the weights; the jax kernel never does, and
    computes the same attention (tests/test_attention.py).
    """
    config = kernels.forming_weights(dataclasses.replace(model_config, scan_layers=False))
    params = unstack_layers(params, config.n_layers)
    tokens_1T = jnp.asarray([tokens], jnp.int32)
    logits_1TV, state = GPT(config).apply({"params": params}, tokens_1T,
                                          mutable=["intermediates"])
    layers = [jax.tree.map(lambda x: np.asarray(x[0])[0] if isinstance(x, tuple) else x,
                           state["intermediates"][f"block_{i}"]["attn"],
                           is_leaf=lambda x: isinstance(x, tuple))
              for i in range(config.n_layers)]
    weights_LHTT = np.stack([layer["attention_weights"] for layer in layers])
    return weights_LHTT, np.asarray(logits_1TV[0]), layers


def token_labels(tokenizer, tokens: list[int]) -> list[str]:
    """A short printable label per token (newline as ⏎, space as ·, others repr-escaped)."""
    labels = []
    for t in tokens:
        text = tokenizer.decode([t]).replace("\n", "⏎").replace(" ", "·").replace("\t", "⇥")
        labels.append(text if text.isprintable() and text else repr(text)[1:-1] or "?")
    return labels


def plot_layer(weights_HTT, labels, title, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    H, T = weights_HTT.shape[0], len(labels)
    cols = int(np.ceil(np.sqrt(H)))  # a square-ish grid
    rows = -(-H // cols)
    size = max(3.0, 0.22 * T)
    fig, axes = plt.subplots(rows, cols, figsize=(size * cols, size * rows + 0.6), squeeze=False)
    for h, ax in enumerate(axes.flat):
        if h >= H:
            ax.axis("off")
            continue
        ax.imshow(weights_HTT[h], cmap="viridis", vmin=0.0, vmax=1.0)
        ax.set_title(f"head {h}", fontsize=9)
        ax.set_xticks(range(T), labels, rotation=90, fontsize=7, family="monospace")
        ax.set_yticks(range(T), labels, fontsize=7, family="monospace")
        ax.set_xlabel("key (attended to)", fontsize=8)
        if h % cols == 0:
            ax.set_ylabel("query (attending)", fontsize=8)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_next_token(logits_V, tokenizer, prompt, path, top=15):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    probs_V = np.asarray(jax.nn.softmax(jnp.asarray(logits_V, jnp.float32)))
    best = np.argsort(-probs_V)[:top]
    labels = token_labels(tokenizer, best.tolist())
    fig, ax = plt.subplots(figsize=(6, 0.3 * top + 1.2))
    ax.barh(range(top)[::-1], probs_V[best], color="tab:blue")
    ax.set_yticks(range(top)[::-1], labels, family="monospace")
    for y, p in zip(range(top)[::-1], probs_V[best]):
        ax.text(p, y, f" {p:.3f}", va="center", fontsize=8)
    ax.set_xlabel("probability of the next token")
    ax.set_xlim(0, min(1.0, probs_V[best[0]] * 1.25 + 0.02))
    ax.set_title(f"after {prompt[-40:]!r}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def visualize(workdir, prompt: str, out, step=None) -> list[Path]:
    """Writes the images for `prompt` into `out`; returns their paths."""
    model_config, params, tokenizer, step = load_run(workdir, step)
    tokens = tokenizer.encode(prompt)
    if not tokens:
        raise PromptError("the prompt is empty: give at least one token")
    if len(tokens) > model_config.max_seq_len:
        raise PromptError(f"the prompt has {len(tokens)} tokens but the context holds "
                          f"{model_config.max_seq_len}: shorten it")
    weights_LHTT, logits_TV, _ = look_inside(model_config, params, tokens)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    labels = token_labels(tokenizer, tokens)
    paths = []
    for i, weights_HTT in enumerate(weights_LHTT):
        path = out / f"attention_layer{i}.png"
        plot_layer(weights_HTT, labels, f"layer {i} attention (step {step})", path)
        paths.append(path)
    path = out / "next_token.png"
    plot_next_token(logits_TV[-1], tokenizer, prompt, path)
    return paths + [path]


def main(argv):
    if len(argv) > 1:
        cli.fail(f"unexpected arguments {argv[1:]}: flags look like --name=value")
    f = flags.FLAGS
    for path in visualize(f.workdir, f.prompt, f.out, f.step):
        print(path)


if __name__ == "__main__":  # flags defined here so that explain.py can import this module
    flags.DEFINE_string("workdir", None, "A training run's workdir.", required=True)
    flags.DEFINE_string("prompt", "def main():\n    return", "Text to look at.")
    flags.DEFINE_string("out", "attention", "Folder for the PNG files.")
    flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
    cli.run(main)
