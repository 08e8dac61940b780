"""Attention maps and the next-token distribution of a trained run, as PNG images.

    python -m transformer visualize --workdir=runs/default --prompt="def main():"

writes into --out (default: <workdir>/attention/step_<N>, N the checkpoint's step)
    attention_layer{i}.png   one heatmap per head of layer i: row = query token, column = key
                             token, colour = attention weight (rows sum to 1; masked keys are 0),
                             whitespace drawn as ↵ ␣ ⇥, a character of several byte tokens
                             labelled once; CJK needs a CJK font (apt install fonts-wqy-zenhei),
                             else its characters are labelled U+XXXX
    next_token.png           the most likely next tokens after the prompt, with probabilities
                             (a part of a character named by its bytes, `bytes:\\xd0`)

The weights come from the model itself (generate/inside.py, the pass the server's page shows
too): `GPT.apply(..., mutable=["intermediates"])` returns
what each attention layer sowed (model/gpt.py), computed by the kernels the run trained with
(`model.matmul`; on CPU by default the bfloat16-input fast path), so the picture is of the
code that trains, not of a second implementation. One exception: a model trained with
`attention_kernel=jax` is looked at through the einsum kernel, because the jax kernel never
forms the weights (the two compute the same attention). Prompts of 10-40 tokens read best.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from transformer import checkpoint, cli
from transformer.generate.decode import PromptError
from transformer.generate.inside import look_inside  # explain.py imports it from here too


def load_run(workdir, step=None):
    """(model_config, params, tokenizer, step) of a run's checkpoint (the newest good one by
    default), through the checked restore every reader of a run uses."""
    run = checkpoint.load_run(workdir, step=step)
    return run.model_config, run.params, run.tokenizer, run.step


# Whitespace drawn as a visible symbol (and in colour): a newline is where code's structure is.
WHITESPACE = {"\n": "↵", " ": "␣", "\t": "⇥", "\r": "←"}
CONTINUED = "┄"  # the 2nd, 3rd... byte of a character labelled once, on its first byte
_CJK_FONT_HINTS = ("wqy", "wenquanyi", "notosanscjk", "notoserifcjk", "sourcehan", "droidsansfallback",
                   "ukai", "uming", "ipag", "takao", "nanum", "unifont")


def token_labels(tokenizer, tokens: list[int]) -> list[str]:
    """A short printable label per token. Whitespace is a visible symbol (↵ ␣ ⇥). Tokens that
    hold part of a character (a byte tokenizer's Cyrillic or Chinese letters are 2-4 tokens
    each) are decoded together: the character labels its first token, and the others show
    that they continue it (┄), rather than each showing a replacement character."""
    labels, i = [], 0
    while i < len(tokens):
        # The shortest run of tokens from i that decodes to whole characters (up to 4).
        for n in range(1, min(4, len(tokens) - i) + 1):
            text = tokenizer.decode(tokens[i:i + n])
            if "\ufffd" not in text:
                break
        else:
            n, text = 1, tokenizer.decode(tokens[i:i + 1])
        labels.append(_printable(text))
        labels += [CONTINUED] * (n - 1)
        i += n
    return labels


def next_token_labels(tokenizer, ids) -> list[str]:
    """A label per candidate next token: its text, or a part of a character named by its
    bytes (`bytes:\\xd0`, as the server's logprobs name it); decoded alone every such byte
    was the same U+FFFD, so the candidates after half a character all looked alike."""
    from transformer.serve.tokens import TokenNames
    names = TokenNames(tokenizer)
    return [_printable(names(t)) for t in ids]


def _printable(text: str) -> str:
    text = "".join(WHITESPACE.get(ch, ch) for ch in text)
    if text and text.isprintable():
        return text
    return repr(text)[1:-1] or "?"


def _coverage(path) -> set[int]:
    """The code points a font file has glyphs for (its first face, for a collection)."""
    from fontTools.ttLib import TTFont
    try:
        font = TTFont(path, fontNumber=0, lazy=True)
    except Exception:  # noqa: BLE001 -- an unreadable font draws nothing
        return set()
    try:
        return set(font.getBestCmap() or {})
    except Exception:  # noqa: BLE001
        return set()
    finally:
        font.close()


@functools.lru_cache(maxsize=1)
def _fonts() -> tuple[list[str], set[int]]:
    """(font families for labels, the code points they can draw). A monospace font first,
    then a CJK font if the machine has one (e.g. apt install fonts-wqy-zenhei), found by
    its file even when matplotlib's font cache predates it."""
    from matplotlib import font_manager

    coverage = _coverage
    # A CJK font often has only a medium weight: matplotlib would log "Failed to find font
    # weight normal" for every label. The nearest weight is what we want; say nothing.
    logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)

    mono = font_manager.findfont(font_manager.FontProperties(family="monospace"))
    families, covered = ["monospace"], coverage(mono)
    known = {Path(f.fname).name.lower().replace("-", "").replace("_", ""): f
             for f in font_manager.fontManager.ttflist}
    files = sorted({*font_manager.findSystemFonts(), *(f.fname for f in known.values())})
    for path in files:
        name = Path(path).name.lower().replace("-", "").replace("_", "")
        if not any(h in name for h in _CJK_FONT_HINTS):
            continue
        cmap = coverage(path)
        if ord("中") in cmap:
            font_manager.fontManager.addfont(path)
            families.append(font_manager.FontProperties(fname=path).get_name())
            covered |= cmap
            break
    return families, covered


def drawable(label: str) -> str:
    """The label, with each character no font here can draw written as U+XXXX (matplotlib
    would draw an empty box and warn "Glyph missing from font")."""
    _, covered = _fonts()
    return "".join(ch if ord(ch) in covered or not ch.isprintable() else f"U+{ord(ch):04X}"
                   for ch in label)


def _style_ticks(ticks) -> None:
    """Whitespace symbols in colour; continued bytes faint."""
    for tick in ticks:
        text = tick.get_text()
        if text and all(ch in WHITESPACE.values() for ch in text):
            tick.set_color("tab:red")
            tick.set_fontweight("bold")
            tick.set_fontsize(12)
        elif text == CONTINUED:
            tick.set_color("0.55")


def plot_layer(weights_HTT, labels, title, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families, _ = _fonts()
    labels = [drawable(label) for label in labels]
    H, T = weights_HTT.shape[0], len(labels)
    cols = int(np.ceil(np.sqrt(H)))  # a square-ish grid
    rows = -(-H // cols)
    size = max(3.0, 0.24 * T)
    fig, axes = plt.subplots(rows, cols, figsize=(size * cols + 1.0, size * rows + 0.8),
                             squeeze=False, layout="constrained")
    for h, ax in enumerate(axes.flat):
        if h >= H:
            ax.axis("off")
            continue
        image = ax.imshow(weights_HTT[h], cmap="viridis", vmin=0.0, vmax=1.0)
        ax.set_title(f"head {h}", fontsize=9)
        # One character stands upright under its column; longer labels turn sideways.
        upright = all(len(label) <= 1 for label in labels)
        ax.set_xticks(range(T), labels, rotation=0 if upright else 90, fontsize=9,
                      family=families)
        ax.set_yticks(range(T), labels, fontsize=9, family=families)
        _style_ticks(ax.get_xticklabels())
        _style_ticks(ax.get_yticklabels())
        ax.set_xlabel("key (attended to)", fontsize=8)
        if h % cols == 0:
            ax.set_ylabel("query (attending)", fontsize=8)
    fig.get_layout_engine().set(hspace=0.06)  # a head's title clear of the key label above
    bar = fig.colorbar(image, ax=axes, shrink=0.6, pad=0.02)
    bar.set_label("attention weight (each row sums to 1)", fontsize=8)
    fig.suptitle(title, fontsize=11)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_next_token(logits_V, tokenizer, prompt, path, top=15):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    probs_V = np.asarray(jax.nn.softmax(jnp.asarray(logits_V, jnp.float32)))
    best = np.argsort(-probs_V)[:top]
    families, _ = _fonts()
    labels = [drawable(label) for label in next_token_labels(tokenizer, best.tolist())]
    fig, ax = plt.subplots(figsize=(6, 0.3 * top + 1.2))
    ax.barh(range(top)[::-1], probs_V[best], color="tab:blue")
    ax.set_yticks(range(top)[::-1], labels, family=families)
    _style_ticks(ax.get_yticklabels())
    for y, p in zip(range(top)[::-1], probs_V[best]):
        ax.text(p, y, f" {p:.3f}", va="center", fontsize=8)
    ax.set_xlabel("probability of the next token")
    ax.set_xlim(0, min(1.0, probs_V[best[0]] * 1.25 + 0.02))
    ax.set_title(drawable(f"after {prompt[-40:]!r}"), fontsize=10, family=families)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def visualize(workdir, prompt: str, out=None, step=None) -> list[Path]:
    """Writes the images for `prompt` into `out` (default: <workdir>/attention/step_<N>, so
    a later look at a later checkpoint keeps the earlier one); returns their paths."""
    model_config, params, tokenizer, step = load_run(workdir, step)
    out = Path(workdir) / "attention" / f"step_{step}" if out is None else out
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
    cli.check_utf8("--prompt", f.prompt)
    why = cli.cannot_write(f.out, folder=True) if f.out else None
    if why:
        cli.fail(f"--out={f.out}: cannot write there ({why}); choose another --out")
    for path in visualize(f.workdir, f.prompt, f.out, f.step):
        print(path)


if __name__ == "__main__":  # flags defined here so that explain.py can import this module
    flags.DEFINE_string("workdir", None, "A training run's workdir.", required=True)
    flags.DEFINE_string("prompt", "def main():\n    return", "Text to look at.")
    flags.DEFINE_string("out", None, "Folder for the PNG files (default: "
                        "<workdir>/attention/step_<N>).")
    flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
    cli.run(main)
