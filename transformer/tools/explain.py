"""The attention computation for one head of a short sequence, step by step, with real numbers.

    python -m transformer explain                          # a small random model, text "hello"
    python -m transformer explain --text="def f" --layer=0 --head=1
    python -m transformer explain --workdir=runs/default   # a trained model's numbers

Prints, for one head: Q, K, V → scores Q Kᵀ → ÷ √d_k → causal mask → softmax →
weights · V. The model runs as it trains, in its `kernels.compute_dtype`: a trained run in the
mode it recorded; the small random model in what `model.matmul=auto` picks on this machine
(model/kernels/auto.py: bfloat16 matmul inputs with float32 accumulation on CPUs that multiply
bfloat16 natively, AMX or AVX512_BF16; float32 on the others, e.g. AVX2-only CPUs). Q, K and V are the ones the model computed
(sown by model/gpt.py); the weights and the output come from the project's own
`attention.dot_product_attention` in the model's compute dtype, and the model's own sown
weights are compared too; every step is then recomputed in plain NumPy (float64, with the
matmul inputs rounded to the compute dtype as the model rounds them), and the largest
difference is printed (and must be < 1e-5).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from transformer import cli
from transformer.config import ModelConfig, base_config, validate
from transformer.data import tokenizers
from transformer.generate.decode import PromptError
from transformer.model import attention, kernels
from transformer.model.gpt import init_params
from transformer.tools.visualize import load_run, look_inside, token_labels

TOLERANCE = 1e-5


def small_model(seed: int = 0):
    """A randomly initialised model with head dim 8, so that Q, K and V fit on a line."""
    c = base_config()
    c.model.update(vocab_size=256, d_model=32, n_layers=2, n_heads=4, d_ff=128, max_seq_len=32)
    c.sample.max_new_tokens = 16
    config = ModelConfig.from_config(validate(c))
    return config, init_params(config, jax.random.key(seed)), tokenizers.ByteTokenizer()


def project_steps(q_TK, k_TK, v_TK, window: int = 0, compute_dtype: str = "float32") -> dict:
    """The project's attention on one head: its weights and output (numpy)."""
    T = q_TK.shape[0]
    out, weights = attention.dot_product_attention(q_TK[None, None], k_TK[None, None],
                                                   v_TK[None, None],
                                                   attention.causal_mask(T, window),
                                                   compute_dtype)
    return {"weights": np.asarray(weights[0, 0]), "out": np.asarray(out[0, 0])}


def rounded(x, compute_dtype: str) -> np.ndarray:
    """x as a matmul in `compute_dtype` reads it (bfloat16 keeps 8 bits of mantissa), float64."""
    x_c = jnp.asarray(x, jnp.float32).astype(compute_dtype)
    return np.asarray(x_c.astype(jnp.float32), np.float64)


def numpy_steps(q_TK, k_TK, v_TK, window: int = 0, compute_dtype: str = "float32") -> dict:
    """The same arithmetic written out in NumPy (float64), one named step at a time; the
    matmul inputs are rounded to `compute_dtype` first, as the model's matmuls round them."""
    q, k, v = (rounded(x, compute_dtype) for x in (q_TK, k_TK, v_TK))
    T, d_k = q.shape
    scores = q @ k.T                                       # how well query i matches key j
    scaled = scores / np.sqrt(d_k)                         # keeps the softmax out of saturation
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    visible = (j <= i) & ((i - j < window) if window else True)
    masked = np.where(visible, scaled, -np.inf)            # no looking at the future
    e = np.exp(masked - masked.max(axis=1, keepdims=True))
    weights = e / e.sum(axis=1, keepdims=True)             # each row sums to 1
    out = rounded(weights, compute_dtype) @ v              # rows of V, mixed by the weights
    return {"q": q, "k": k, "v": v, "scores": scores, "scaled": scaled, "masked": masked,
            "weights": weights, "out": out}


def explain(model_config: ModelConfig, params, tokens: list[int], layer: int = 0,
            head: int = 0) -> tuple[dict, dict]:
    """(numpy steps, the project's steps) for one head of one layer on `tokens`."""
    _, _, layers = look_inside(model_config, params, tokens)
    sown = layers[layer]
    g = head // (model_config.n_heads // model_config.kv_heads)  # the K/V head it reads
    q, k, v = sown["queries"][head], sown["keys"][g], sown["values"][g]
    dtype = kernels.compute_dtype(model_config)
    ref = numpy_steps(q, k, v, model_config.sliding_window, dtype)
    ours = project_steps(q, k, v, model_config.sliding_window, dtype)
    ours["model_weights"] = sown["attention_weights"][head]  # what the full model computed
    return ref, ours


def max_difference(ref: dict, ours: dict) -> float:
    """The largest |difference|; NaN if any number is NaN (np.max keeps it, Python's max
    would drop a NaN that is not first)."""
    return float(np.max([np.abs(ours["weights"] - ref["weights"]).max(),
                         np.abs(ours["model_weights"] - ref["weights"]).max(),
                         np.abs(ours["out"] - ref["out"]).max()]))


def agrees(ref: dict, ours: dict) -> bool:
    """The check: every difference within TOLERANCE (a NaN anywhere is a disagreement)."""
    return max_difference(ref, ours) <= TOLERANCE


def _matrix(name, x, rows, cols=None):
    lines = [name]
    width = max(len(r) for r in rows)
    if cols is not None:
        lines.append(" " * (width + 2) + "".join(f"{c:>8}" for c in cols))
    for label, row in zip(rows, x):
        cells = "".join("    -inf" if np.isneginf(v) else f"{v:8.3f}" for v in row)
        lines.append(f"  {label:<{width}}{cells}")
    return "\n".join(lines)


def report(ref: dict, ours: dict, labels: list[str], layer: int, head: int,
           model_config: ModelConfig, max_dims: int = 8) -> str:
    """The steps as text. Q, K, V and the output show their first `max_dims` dimensions; the
    scores use all of them."""
    d_k = ref["q"].shape[1]
    rows = [f"{t} {s}" for t, s in enumerate(labels)]
    shown = min(d_k, max_dims)
    dims = [f"d{i}" for i in range(shown)]
    difference = max_difference(ref, ours)
    ref = {**ref, **{k: ref[k][:, :shown] for k in ("q", "k", "v", "out")}}
    rope = " (already rotated by RoPE)" if model_config.position == "rope" else ""
    window = model_config.sliding_window
    dtype = kernels.compute_dtype(model_config)
    rounding = ("" if dtype == "float32" else
                f"\nThe model's matmuls read {dtype} inputs (float32 accumulation): Q, K, V and "
                f"the weights below are rounded to {dtype} before each product, as it does.")
    parts = [
        f"layer {layer}, head {head}: d_k = {d_k}, T = {len(labels)} tokens{rope}"
        + (f" (Q, K, V shown: dims 0..{shown - 1} of {d_k})" if shown < d_k else "") + rounding,
        _matrix("1. Q = x W_Q: what each position looks for", ref["q"], rows, dims),
        _matrix("2. K = x W_K: what each position offers to be found by", ref["k"], rows, dims),
        _matrix("3. V = x W_V: what each position passes on when attended to", ref["v"], rows,
                dims),
        _matrix("4. scores = Q Kᵀ (row: query, column: key)", ref["scores"], rows, labels),
        _matrix(f"5. scaled = scores / √d_k = scores / {np.sqrt(d_k):.3f}", ref["scaled"], rows,
                labels),
        _matrix("6. causal mask: a query may not see later keys"
                + (f" nor keys {window} or more back" if window else "") + " (-inf)",
                ref["masked"], rows, labels),
        _matrix("7. weights = softmax(row) = exp(x - max) / Σ exp(x - max); rows sum to 1",
                ref["weights"], rows, labels),
        _matrix("8. output = weights V: each row a weighted average of the rows of V",
                ref["out"], rows, dims),
        "The heads' outputs are then concatenated and multiplied by W_O (model/gpt.py).",
        f"check: attention.dot_product_attention and the model's sown weights vs this NumPy "
        f"arithmetic: max |difference| = {difference:.2e} "
        f"(tolerance {TOLERANCE:.0e})",
    ]
    return "\n\n".join(parts)


def main(argv):
    if len(argv) > 1:
        cli.fail(f"unexpected arguments {argv[1:]}: flags look like --name=value")
    f = flags.FLAGS
    if f.dims < 1:
        cli.fail(f"--dims={f.dims}: must be at least 1")
    cli.check_utf8("--text", f.text)
    if f.workdir:
        model_config, params, tokenizer, _ = load_run(f.workdir)
    else:
        model_config, params, tokenizer = None, None, tokenizers.ByteTokenizer()
    tokens = tokenizer.encode(f.text)
    if model_config is None:
        model_config, params, tokenizer = small_model()
    # At most 16 (it is printed as T x T tables), and never past the model's context: past it
    # a learned position table has no row (NaN everywhere) and RoPE was never trained.
    most = min(16, model_config.max_seq_len)
    if not 0 < len(tokens) <= most:
        raise PromptError(f"--text is {len(tokens)} tokens: give 1 to {most} (it is printed as "
                          f"T x T tables; the model's context is {model_config.max_seq_len})")
    if not 0 <= f.layer < model_config.n_layers:
        cli.fail(f"--layer={f.layer}: the model has layers 0..{model_config.n_layers - 1}")
    if not 0 <= f.head < model_config.n_heads:
        cli.fail(f"--head={f.head}: the model has heads 0..{model_config.n_heads - 1}")
    ref, ours = explain(model_config, params, tokens, f.layer, f.head)
    print(report(ref, ours, token_labels(tokenizer, tokens), f.layer, f.head, model_config,
                 f.dims))
    if not agrees(ref, ours):
        cli.fail("the project's attention disagrees with the NumPy arithmetic", status=1)


if __name__ == "__main__":
    flags.DEFINE_string("workdir", None, "A trained run (default: a small random model).")
    flags.DEFINE_string("text", "hello", "A short text (a handful of tokens).")
    flags.DEFINE_integer("layer", 0, "Which layer.")
    flags.DEFINE_integer("head", 0, "Which head.")
    flags.DEFINE_integer("dims", 8, "How many dimensions of Q, K, V to print.")
    cli.run(main)
