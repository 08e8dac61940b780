"""Every config field, declared once: name, base value, allowed values or check, doc, resume rule.

`config.base_config()`, `config.validate`, `config.ModelConfig` and `resume.py`'s rules are all
derived from `FIELDS`; a field added here is known everywhere, and `tests/test_fields.py`
fails when a field is declared incompletely or named somewhere it is not declared.

Two words kept apart: a field's *base value* is what `base_config()` holds, the baseline every
config file changes (GPT-2's block with AdamW); *the default* config is `configs/default.py`,
the quick start (RoPE, RMSNorm, SwiGLU, Muon), which train.py runs when given no --config.

The type of a field is the type of its base value (an int is accepted where a float is
declared).
`choices` lists the allowed values; `check` returns what is wrong with a value (a fix, as
"must be ...") or None. Checks that involve several fields live in `config/schema.py`.

Resume rules (what a changed value means for a run continuing from a checkpoint):
    FREE    changes only what is logged, evaluated, saved, sampled, where the state lives or
            how the same arithmetic is scheduled (mesh, remat): changes silently
    FIXED   changes the shape of the saved state or the meaning of its tokens: never
    CHANGE  changes what the run computes from here on: only when named in --allow_change
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

FREE, FIXED, CHANGE = "free", "fixed", "change"

DTYPES = ("float32", "bfloat16")
REMAT = ("none", "block", "dots")
POSITIONS = ("learned", "rope")
NORMS = ("layernorm", "rmsnorm")
NORM_PLACEMENTS = ("pre", "post")
MLPS = ("relu", "gelu", "swiglu", "relu2")
ATTENTION_KERNELS = ("einsum", "jax", "cudnn")
NONFINITE = ("stop", "skip")
MESH_AXES = ("data", "fsdp", "tensor")
# The matmul kernels a model can run; "auto" is resolved per machine (model/kernels/auto.py) before
# a model is built. The kernels themselves are in kernels/
MATMUL_MODES = ("plain", "fast_f32", "fast_bf16")
# The modes that compute the same float32 arithmetic (up to summation order): a resumed run
# may switch among them freely (resume.py). fast_bf16 rounds every matmul input to bfloat16.
FLOAT32_MATMULS = ("plain", "fast_f32")
MATMUL = ("auto", *MATMUL_MODES)
TOKENIZERS = ("byte", "char", "bpe")
SYNTHETIC_CORPORA = ("copy", "random")
OPTIMIZERS = ("adamw", "muon")  # train.optimizer (optimizer.py)
SCHEDULES = ("cosine", "wsd", "constant")  # learning-rate schedules (optimizer.py)
WANDB_MODES = ("off", "online", "offline")  # train.wandb (train/trackers.py)
VALUE_EMBEDS = ("none", "alternate", "ends", "all")  # model.value_embeds (model/gpt.py)
DECAY_SHAPES = ("linear", "cosine", "sqrt")  # how wsd's decay phase falls  # data.corpus values that are generated, not read


@dataclasses.dataclass(frozen=True)
class Field:
    name: str                       # "section.field"
    default: Any
    doc: str                        # one line, for error messages and docs
    resume: str                     # FREE | FIXED | CHANGE
    choices: tuple = ()
    check: Callable[[Any], str | None] | None = None

    @property
    def section(self) -> str:
        return self.name.rsplit(".", 1)[0]

    @property
    def key(self) -> str:
        return self.name.rsplit(".", 1)[1]


# The largest int32: what the device counts token ids, positions, steps and top_k in (and
# a JAX key's seed); a larger value overflowed in numpy or JAX (a traceback).
INT32_MAX = 2**31 - 1


# train.eval_tokens' default (2^18): see its declaration.
EVAL_TOKENS = 1 << 18

# Fields that were declared once and are no more: a config saved with one (a checkpoint's,
# a sweep's) drops it when read back (schema.from_dict), naming what replaced it.
RETIRED = {"train.final_eval_batches": "train.eval_tokens"}


def _positive(v):
    return None if v > 0 else "must be a positive integer"


def _int32_positive(v):
    """A length the device counts in int32 (positions, cache slots): past it (and past it in
    vocab_size), `sizes` stopped in JAX's OverflowError traceback."""
    if v > INT32_MAX:
        return "must be at most 2,147,483,647 (positions are int32 on the device)"
    return _positive(v)


def _prompt(v):
    if not v:
        return ("must not be empty: give at least one character for the sample to continue, "
                "e.g. sample.prompt='def '")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:  # $'\\xff' on the command line: the tokenizer's traceback
        return "holds bytes that are not UTF-8 text: give it as UTF-8"  # after the training
    return None


def _non_negative(v):
    if not math.isfinite(v):  # 1e400 reads as inf: a number no step survives
        return "must be a finite number >= 0"
    return None if v >= 0 else "must be >= 0"


def _finite_positive(v):
    return None if v > 0 and math.isfinite(v) else "must be a finite positive number"


def _in(lo, hi, closed_hi=False, text=None):
    def check(v):
        ok = lo <= v <= hi if closed_hi else lo <= v < hi
        return None if ok else text
    return check


def _mesh_size(v):
    return None if v > 0 or v == -1 else "must be a positive size, or -1 for all remaining devices"


def _mesh_rule(v):
    unknown = [a.strip() for a in v.split(",") if a.strip() and a.strip() not in MESH_AXES]
    return None if not unknown else (f"names mesh axes {unknown}; use a comma-separated subset "
                                     f"of {', '.join(MESH_AXES)}, or '' for not split")


def _weights(path):
    from pathlib import Path

    p = Path(path).expanduser()
    ok = not path or (p / "model.safetensors").is_file() or (p.is_file() and
                                                            p.suffix == ".safetensors")
    return None if ok else ("must be a folder holding model.safetensors, or a .safetensors "
                            "file ('' starts from random weights)")


def step_range(spec: str) -> tuple[int, int] | None:
    """train.profile's "START:STOP" -> (START, STOP), 1 <= START < STOP; "" -> None. Raises
    ValueError on anything else."""
    if not spec:
        return None
    start, sep, stop = spec.partition(":")
    if not sep:
        raise ValueError(spec)
    a, b = int(start), int(stop)
    if not 1 <= a < b:
        raise ValueError(spec)
    return a, b


def _step_range(v):
    try:
        step_range(v)
    except ValueError:
        return ("must be a step range START:STOP with 1 <= START < STOP (10:15 traces steps "
                "10..14), or '' for no trace")
    return None


def _f(name, default, doc, resume, choices=(), check=None):
    return Field(name, default, doc, resume, tuple(choices), check)


_MODEL = [
    _f("model.vocab_size", 0, "vocabulary size; 0: the tokenizer's (byte: 257, the end-of-text "
       "token included)", FIXED,
       check=lambda v: ("must be at most 2,147,483,647 (token ids are int32 on the device)"
                        if v > INT32_MAX else None if v >= 0 else
                        "must be > 0, or 0 to take it from the tokenizer")),
    # Derived where a run resolves its config (config/depth.py), never in the model: the
    # saved config holds the derived sizes, so a changed depth is a changed shape.
    _f("model.depth", 0, "0: the sizes as given | N: n_layers = N, and d_model, heads, d_ff, "
       "learning rates, batch, weight decay and steps derived from N by config/depth.py's "
       "rules, replacing the values given (the config as written is the reference they "
       "scale; train.tokens_per_param=0 keeps train.steps)", FIXED,
       check=lambda v: None if v >= 0 else "must be >= 0 (0: the sizes as given)"),
    _f("model.d_model", 128, "residual stream width", FIXED, check=_positive),
    _f("model.n_layers", 2, "transformer blocks", FIXED, check=_positive),
    _f("model.n_heads", 4, "attention (query) heads", FIXED, check=_positive),
    _f("model.d_ff", 512, "MLP hidden width (4 * d_model in GPT-2)", FIXED, check=_positive),
    _f("model.max_seq_len", 128, "context length: positions, KV-cache slots, training length",
       FIXED, check=_int32_positive),
    # Resolved at the run's start with vocab_size=0 (train/start.py): a padded vocabulary
    # rounds the tokenizer's size up, and vocab_used records where the real ids end. Resuming
    # keeps the checkpoint's vocabulary, so the multiple may change freely.
    _f("model.vocab_multiple", 1, "vocab_size=0: pad the tokenizer's vocabulary up to a multiple "
       "of this (and of the mesh's vocab split); 64 as nanoGPT", FREE, check=_positive),
    _f("model.vocab_used", 0, "ids below this are the tokenizer's; the padding ids above it get "
       "logit -inf (never sampled, no share of the softmax); 0: every id is a token", FIXED,
       check=_non_negative),
    _f("model.tie_embeddings", True, "logits = h @ E^T with the input embedding E", FIXED),
    _f("model.dtype", "float32", "compute dtype; softmax and loss always run in float32",
       CHANGE, DTYPES),
    _f("model.param_dtype", "float32",
       "dtype the matrices and embeddings are stored in (norm gains stay float32)", FIXED, DTYPES),
    _f("model.scan_layers", False, "nn.scan over blocks: stacked params, faster compile", FIXED),
    # Recomputing a value gives the same value: the same numbers, another memory/time trade.
    _f("model.remat", "none", "what the backward pass recomputes", FREE, REMAT),
    _f("model.position", "learned", "learned (a table P[t] added to x) | rope (rotary Q and K)",
       FIXED, POSITIONS),
    _f("model.norm", "layernorm", "normalisation layer", FIXED, NORMS),
    _f("model.norm_placement", "pre", "pre: x + f(norm(x)) | post: norm(x + f(x))", FIXED,
       NORM_PLACEMENTS),
    _f("model.mlp", "gelu", "MLP; swiglu is gated with hidden width 2/3 d_ff; relu2 is "
       "ReLU(x)^2", FIXED, MLPS),
    _f("model.bias", True, "biases in the dense layers and LayerNorm (False: none, as Llama "
       "and nanochat)", FIXED),
    _f("model.qk_norm", False, "RMSNorm of each head's queries and keys (learned gain over "
       "head_dim) before RoPE and the scores", FIXED),
    # An initialisation only: a resumed run is not re-initialised, but the saved config would
    # no longer say how it started (like train.seed).
    _f("model.zero_init_out", False, "attention-out and MLP-project kernels start at zero "
       "(modded-nanogpt): each block starts as the identity", CHANGE),
    _f("model.logit_softcap", 0.0, "0: off; c: logits = c * tanh(logits / c) (Gemma 2, nanochat) "
       "in training, scoring and sampling", CHANGE, check=_non_negative),
    _f("model.n_kv_heads", 0, "K/V heads: 0 = n_heads, 1 = multi-query, else grouped-query",
       FIXED),
    _f("model.sliding_window", 0, "0: full causal attention; w: attend to the last w positions",
       CHANGE, check=lambda v: None if v >= 0 else
       "must be >= 0 (0: full causal attention; w: the last w positions)"),
    # nanochat's and modded-nanogpt's pieces (docs/speedrun.md, "nanochat's pieces"); each is
    # off until a speedrun row says it wins.
    _f("model.value_embeds", "none", "none | alternate (every other block, the last included: "
       "nanochat) | ends (the first and last blocks: modded-nanogpt) | all (every block): those "
       "blocks add a table of their own, looked up by token and gated per K/V head, to "
       "attention's values (train.value_embed_lr)", FIXED, VALUE_EMBEDS),
    _f("model.smear", False, "x_t += lambda * sigmoid(x_t[:12] . w) * x_{t-1} after the "
       "embedding: a learned, gated share of the previous token's embedding (nanochat)", FIXED),
    _f("model.backout", False, "subtract lambda (learned, from 0.2) times the residual stream "
       "after block n_layers // 2 from the last block's output, before the final norm "
       "(nanochat)", FIXED),
    _f("model.x0_lambdas", False, "block i reads r_i * x + a_i * x0, x0 the embedding, r_i and "
       "a_i learned (from 1.15 and 0.2 at the first block to 1.05 and 0.05 at the last: "
       "nanochat's per-layer residual scalars)", FIXED),
    _f("model.attention_kernel", "einsum", "einsum (reference) | jax (XLA's "
       "dot_product_attention) | cudnn (cuDNN flash attention: GPU, bfloat16)", CHANGE, ATTENTION_KERNELS),
    # The same parameters in every mode, but not the same numbers: fast_bf16 rounds matmul
    # inputs to bfloat16, so switching to or from it on resume is a change to allow (auto may
    # pick another mode on another CPU); plain <-> fast_f32 is free (FLOAT32_MATMULS).
    _f("model.matmul", "auto", "matmul kernels; auto: the fastest on this machine "
       "(docs/performance.md)", CHANGE, MATMUL),
]

_DATA = [
    _f("data.corpus", "stdlib", "stdlib | copy | random | a text file or folder (prepared into "
       "the data cache on first use) | a prepared folder (python -m transformer prepare; "
       "docs/data.md)", CHANGE),
    _f("data.tokenizer", "byte", "byte | char | bpe", FIXED, TOKENIZERS),
    _f("data.bpe_vocab_size", 1024, "tokenizer=bpe: the vocabulary (end-of-text token "
       "included), merges learned on training documents only", FIXED,
       check=lambda v: None if v >= 258 else
       "must be at least 258 (the 256 byte tokens, one merge, the end-of-text token)"),
    _f("data.max_bytes", 4_000_000, "read at most this much text", CHANGE,
       check=lambda v: None if v > 0 else "must be positive"),
    _f("data.val_fraction", 0.05, "documents held out for validation, chosen by a hash of "
       "their text (a prepared folder has its own split)", CHANGE,
       check=lambda v: None if 0.0 < v < 1.0 else "must be strictly between 0 and 1"),
]

_TRAIN = [
    _f("train.seed", 0, "seed of the initialisation and the batch order", CHANGE),
    _f("train.steps", 1000, "optimizer steps in all", CHANGE, check=_positive),
    _f("train.batch_size", 16, "sequences per step", CHANGE, check=_positive),
    _f("train.tokens_per_param", 12.0, "model.depth > 0: train.steps from this many tokens "
       "per matrix parameter of the blocks (nanochat's 12; Chinchilla ~20); 0: train.steps as "
       "given (config/depth.py); unused at depth 0", CHANGE, check=_non_negative),
    # Another optimizer has another state: a checkpoint's cannot continue under it.
    _f("train.optimizer", "adamw", "adamw: AdamW for every parameter | muon: Muon for the "
       "blocks' hidden matrices, AdamW for embeddings, head, norms, biases (optimizer.py)",
       FIXED, OPTIMIZERS),
    _f("train.lr", 1e-3, "peak learning rate of AdamW (with optimizer=muon: of the parameters "
       "AdamW trains)", CHANGE, check=_finite_positive),
    _f("train.muon_lr", 0.02, "optimizer=muon: peak learning rate of the hidden matrices "
       "(same schedule shape as train.lr)", CHANGE, check=_finite_positive),
    # μP's width rule (train/width_lr.py): hidden matrices at lr·w/d_model, the rest at lr.
    _f("train.lr_base_width", 0, "0: every parameter at train.lr | w: the blocks' hidden "
       "matrices at train.lr * w / d_model (muP for AdamW: lr tuned at width w transfers)",
       CHANGE, check=_non_negative),
    _f("train.muon_momentum", 0.95, "optimizer=muon: Muon's Nesterov momentum", CHANGE,
       check=_in(0.0, 1.0, text="must be in [0, 1)")),
    # Each Newton-Schulz step is 3 matmuls per matrix: at 2K tokens a step, 5 of them cost
    # about a quarter of the model's own FLOPs (docs/speedrun.md).
    _f("train.muon_ns_steps", 5, "optimizer=muon: Newton-Schulz iterations per update", CHANGE,
       check=_positive),
    # Polar Express (Amsel et al. 2025, arXiv 2505.16932; nanochat's Muon uses it): one
    # (a, b, c) per iteration, chosen so 5 iterations come closer to the polar factor than
    # 5 of Keller Jordan's fixed quintic. Same cost a step.
    _f("train.muon_ns_coeffs", "quintic", "optimizer=muon: the orthogonalising iteration's "
       "coefficients: quintic (3.4445, -4.7750, 2.0315 every step: optax's, Jordan's) or "
       "polar_express (one triple per step, at most 5 steps; muon.py)", CHANGE,
       ("quintic", "polar_express")),
    # bfloat16 halves the Newton-Schulz matmuls' cost where the CPU multiplies bf16 natively
    # (AVX512_BF16, AMX); on AVX2-only CPUs it is converted in software and slower. auto:
    # the model's matmul input dtype (train/resolve.py; the quick start's val loss was the
    # same to 1e-4 either way on two seeds, docs/speedrun.md row 10).
    _f("train.muon_ns_dtype", "auto", "optimizer=muon: the Newton-Schulz matmuls' input "
       "dtype (float32 accumulation and iterate either way; muon.py); auto: bfloat16 where the "
       "model's matmuls take bfloat16 inputs (model.matmul, model.dtype), else float32",
       CHANGE, ("auto",) + DTYPES),
    _f("train.muon_weight_decay", 0.0, "optimizer=muon: decoupled decay of the hidden matrices "
       "(times the Muon lr)", CHANGE, check=_non_negative),
    # NorMuon (Li et al. 2025, arXiv 2510.05491), MuonEq's row equilibration and cautious
    # weight decay, as nanochat's Muon has them (muon.py).
    _f("train.muon_normuon_beta2", 0.0, "optimizer=muon: 0: off | b: NorMuon: each neuron "
       "of an orthogonalised update's longer side divided by the root of its mean square's "
       "moving average (decay b, nanochat 0.95), then rescaled to the update's Frobenius "
       "norm", CHANGE, check=_in(0.0, 1.0, text="must be in [0, 1) (0: off)")),
    _f("train.muon_eq", False, "optimizer=muon: MuonEq: before orthogonalising, each output "
       "neuron's row of the momentum rescaled to the matrix's mean row norm", CHANGE),
    _f("train.muon_cautious_wd", False, "optimizer=muon: decay a weight only where the update "
       "already moves it towards 0 (update and weight of one sign: cautious weight decay)",
       CHANGE),
    _f("train.value_embed_lr", 0.0, "model.value_embeds: AdamW's peak learning rate of the "
       "value-embedding tables; 0: train.lr", CHANGE, check=_non_negative),
    _f("train.warmup_steps", 100, "linear warm-up steps", CHANGE, check=_non_negative),
    _f("train.schedule", "cosine", "learning-rate schedule after warm-up (optimizer.py)", CHANGE,
       SCHEDULES),
    _f("train.decay_fraction", 0.2, "wsd: the last fraction of the steps decays the lr", CHANGE,
       check=lambda v: None if 0.0 < v <= 1.0 else "must be in (0, 1]"),
    _f("train.decay_shape", "linear", "wsd: how the decay phase falls", CHANGE, DECAY_SHAPES),
    _f("train.min_lr_ratio", 0.1, "the decay ends at lr * min_lr_ratio", CHANGE,
       check=_in(0.0, 1.0, closed_hi=True, text="must be in [0, 1]")),
    _f("train.weight_decay", 0.1, "AdamW decay of kernels and embeddings (not norms, biases)",
       CHANGE, check=_non_negative),
    # The same update up to float rounding, however the batch is split (like another mesh).
    _f("train.grad_accum", 1, "micro-batches per update; train.batch_size is per update", FREE,
       check=_positive),
    _f("train.b1", 0.9, "Adam beta1", CHANGE, check=_in(0.0, 1.0, text="must be in [0, 1)")),
    _f("train.b2", 0.95, "Adam beta2", CHANGE, check=_in(0.0, 1.0, text="must be in [0, 1)")),
    _f("train.z_loss", 0.0, "coefficient of the z-loss z * logsumexp(logits)^2 added to the "
       "loss descended (PaLM: 1e-4); the logged loss stays the cross-entropy", CHANGE,
       check=_non_negative),
    _f("train.grad_clip", 1.0, "global-norm clipping; 0 disables", CHANGE, check=_non_negative),
    _f("train.log_every", 10, "steps between metrics lines", FREE, check=_positive),
    _f("train.eval_every", 200, "steps between validation losses", FREE, check=_positive),
    _f("train.eval_batches", 8, "batches per validation loss", FREE, check=_positive),
    # A budget, not a share: the final evaluation costs the same on a 1 MB and a 200 MB corpus
    # (2^18 tokens: 0.8-1.7 s more than a 1 MB corpus's whole split for configs/tiny.py on a
    # busy 2-vCPU Zen 4, where 9.8M tokens took 59-84 s; docs/data.md), and it holds the quick
    # start's whole split (37,760 tokens): its published losses are over the whole split still.
    _f("train.eval_tokens", EVAL_TOKENS, "validation tokens the loss after the last step "
       "scores: that many // max_seq_len windows (at least one) evenly spaced over the split, "
       "the same in every run and seed; 0: the whole validation split, every window once",
       FREE, check=_non_negative),
    _f("train.ckpt_every", 500, "steps between checkpoints", FREE, check=_positive),
    _f("train.keep_checkpoints", 3, "checkpoints kept on disk", FREE, check=_positive),
    _f("train.nonfinite", "stop", "what a NaN/inf loss or gradient does", FREE, NONFINITE),
    # Tracing waits for steps but changes no step's numbers (train/profile.py).
    _f("train.profile", "", "steps START:STOP (1-based, STOP excluded) to trace with "
       "jax.profiler into <workdir>/plugins/profile (docs/performance.md); '' = off", FREE,
       check=_step_range),
    _f("train.wandb", "off", "also log to Weights & Biases (pip install -e .[wandb]): online, "
       "offline (files in the workdir, for wandb sync) or off", FREE, WANDB_MODES),
    _f("train.wandb_project", "transformer", "the Weights & Biases project runs log to", FREE),
    _f("train.init_from", "", "a Hugging Face GPT-2 folder or .safetensors file to start from "
       "instead of random weights (docs/huggingface.md)", CHANGE, check=_weights),
]

# The device mesh: data x fsdp x tensor must equal the device count (sharding.py). A
# checkpoint restores onto any mesh, so every mesh field is free.
_MESH = [
    _f("mesh.data", -1, "batch split, parameters copied", FREE, check=_mesh_size),
    _f("mesh.fsdp", 1, "batch split, parameters and optimizer state split too", FREE,
       check=_mesh_size),
    _f("mesh.tensor", 1, "heads, MLP width and vocabulary split", FREE, check=_mesh_size),
] + [
    # Logical axis -> mesh axes ("a,b"; "" = not split). Parameters and activations name
    # logical axes (model/gpt.py, kvcache.py); this table alone decides where they live.
    _f(f"mesh.rules.{axis}", rule, f"mesh axes the logical axis {axis!r} is split over", FREE,
       check=_mesh_rule)
    for axis, rule in (("batch", "data,fsdp"), ("length", ""), ("embed", "fsdp"),
                       ("heads", "tensor"), ("kv_heads", "tensor"), ("head_dim", ""),
                       ("mlp", "tensor"), ("vocab", "tensor"), ("layers", ""),
                       ("cache_batch", "data,fsdp"), ("cache_heads", "tensor"),
                       ("cache_length", ""), ("cache_head_dim", ""))
]

# The sample printed at the end of training; checked together by config.check_sampling.
_SAMPLE = [
    _f("sample.prompt", "def ", "text the sample continues", FREE, check=_prompt),
    _f("sample.max_new_tokens", 100, "tokens sampled; 0: no sample (nor its compile)", FREE),
    _f("sample.temperature", 0.8, "0: greedy", FREE),
    _f("sample.top_k", 40, "keep the k likeliest tokens; 0 disables", FREE),
    _f("sample.top_p", 0.95, "keep the smallest set with this probability; 1 disables", FREE),
]

# GPT-2's block (Radford et al. 2019), every model field that says what the block computes:
# what a GPT-2 checkpoint needs whatever the base values above become (configs/gpt2.py,
# configs/gpt2_small.py, hf/mapping.py's import of a GPT-2 folder). The fields left out give
# the shape or how the same arithmetic runs; tests/test_hf.py checks that split.
GPT2_BLOCK = {"position": "learned", "norm": "layernorm", "norm_placement": "pre",
              "mlp": "gelu", "bias": True, "qk_norm": False, "logit_softcap": 0.0,
              "n_kv_heads": 0, "sliding_window": 0, "tie_embeddings": True,
              "zero_init_out": False, "vocab_used": 0, "value_embeds": "none", "smear": False,
              "backout": False, "x0_lambdas": False}

FIELDS: tuple[Field, ...] = (*_MODEL, *_DATA, *_TRAIN, *_MESH, *_SAMPLE)
BY_NAME = {f.name: f for f in FIELDS}
MODEL_FIELDS = tuple(f for f in FIELDS if f.section == "model")
