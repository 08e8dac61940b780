"""Attention maps and the next-token distribution of a trained run, as PNG images.

    python -m transformer visualize --workdir=runs/default --prompt="def main():" --out=attn/

writes into --out
    attention_layer{i}.png   one heatmap per head of layer i: row = query token, column = key
                             token, colour = attention weight (rows sum to 1; masked keys are 0)
    next_token.png           the most likely next tokens after the prompt, with probabilities

The weights come from the model itself (generate/inside.py, the pass the server's page shows
too): `GPT.apply(..., mutable=["intermediates"])` returns
what each attention layer sowed (model/gpt.py), computed by the kernels the run trained with
(`model.matmul`; on CPU by default the bfloat16-input fast path), so the picture is of the
code that trains, not of a second implementation. One exception: a model trained with
`attention_kernel=jax` is looked at through the einsum kernel, because the jax kernel never
forms the weights (the two compute the same attention). Prompts of 10-40 tokens read best.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from transformer import cli
from transformer import config as config_lib
from transformer.config import ModelConfig
from transformer.data import tokenizers
from transformer.generate.decode import PromptError
from transformer.generate.inside import look_inside  # explain.py imports it from here too
from transformer.model.gpt import init_params
from transformer.train import checkpoint


def load_run(workdir, step=None):
    """(model_config, params, tokenizer, step) of a run's checkpoint (the latest by default)."""
    ckpts = checkpoint.Checkpoints(workdir, read_only=True)
    step = ckpts.latest_step() if step is None else step
    if step is None:
        raise checkpoint.CheckpointError(f"{workdir}: no checkpoint yet; train first")
    meta = ckpts.read_meta(step)
    model_config = ModelConfig.from_config(config_lib.from_dict(meta["config"]))
    # Onto one device, whatever mesh wrote the checkpoint: the target names the placement.
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=one),
                            jax.eval_shape(lambda: init_params(model_config, jax.random.key(0))))
    params, _ = ckpts.restore(step, abstract)
    return model_config, params, tokenizers.from_json(meta["tokenizer"]), step


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
