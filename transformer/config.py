"""The configuration schema, checked once at start-up.

Config files under `configs/` are data: each `get_config()` starts from `base_config()`
and changes a few fields. Every field a run can use is declared here with its default and
type, so an unknown key or a value of the wrong type is caught before anything runs, and
every error names the field and what would be valid.

    from transformer.config import base_config, validate
    config = base_config()
    config.model.d_model = 384
    validate(config)            # raises ConfigError("model.d_model=...: ...")
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import ml_collections

DTYPES = ("float32", "bfloat16")
REMAT = ("none", "block", "dots")
POSITIONS = ("learned", "rope")
NORMS = ("layernorm", "rmsnorm")
NORM_PLACEMENTS = ("pre", "post")
MLPS = ("relu", "gelu", "swiglu")
ATTENTION_KERNELS = ("einsum", "jax")
NONFINITE = ("stop", "skip")
MESH_AXES = ("data", "fsdp", "tensor")
MATMUL = ("auto", "plain", "fast_f32", "fast_bf16")  # see transformer/kernels/


class ConfigError(ValueError):
    """A config value that cannot work; the message names the field and the fix."""


def base_config() -> ml_collections.ConfigDict:
    """Every field a run understands, with its default. Config files override these."""
    c = ml_collections.ConfigDict()

    c.model = ml_collections.ConfigDict()
    c.model.vocab_size = 256        # 0: take it from the tokenizer
    c.model.d_model = 128
    c.model.n_layers = 2
    c.model.n_heads = 4
    c.model.d_ff = 512              # MLP hidden width (4 * d_model in GPT-2)
    c.model.max_seq_len = 128       # context length: positions, KV-cache slots, training length
    c.model.tie_embeddings = True   # logits = h @ E^T with the input embedding E
    c.model.dtype = "float32"       # compute dtype; softmax and loss always run in float32
    c.model.param_dtype = "float32"
    c.model.scan_layers = False     # nn.scan over blocks: stacked params, faster compile
    c.model.remat = "none"          # none | block | dots: what the backward pass recomputes
    # Architecture variants (docs/README-inside.md); the defaults are GPT-2's design.
    c.model.position = "learned"    # learned (a table P[t] added to x) | rope (rotary Q and K)
    c.model.norm = "layernorm"      # layernorm | rmsnorm
    c.model.norm_placement = "pre"  # pre: x + f(norm(x)) | post: norm(x + f(x)), the original
    c.model.mlp = "gelu"            # relu | gelu | swiglu (gated; hidden 2/3 d_ff, see mlp_hidden)
    c.model.n_kv_heads = 0          # K/V heads: 0 = n_heads (multi-head), 1 = multi-query,
                                    # else grouped-query (must divide n_heads)
    c.model.sliding_window = 0      # 0: full causal attention; w: attend to the last w positions
    c.model.attention_kernel = "einsum"  # einsum (reference) | jax (jax.nn.dot_product_attention)
    c.model.matmul = "auto"         # auto | plain | fast_f32 | fast_bf16 (see kernels/);
                                    # auto: fast_bf16 on CPU, plain on GPU/TPU

    c.data = ml_collections.ConfigDict()
    c.data.corpus = "stdlib"        # stdlib | copy | random | a path to a text file or folder
    c.data.tokenizer = "byte"       # byte | char | bpe
    c.data.bpe_vocab_size = 1024    # tokenizer=bpe: merges learned on the training text
    c.data.max_bytes = 4_000_000    # read at most this much text
    c.data.val_fraction = 0.05      # the tail of the corpus is held out for validation

    c.train = ml_collections.ConfigDict()
    c.train.seed = 0
    c.train.steps = 1000
    c.train.batch_size = 16
    c.train.lr = 1e-3
    c.train.warmup_steps = 100
    c.train.min_lr_ratio = 0.1      # cosine decay ends at lr * min_lr_ratio
    c.train.weight_decay = 0.1      # applied to matrices only
    c.train.b1 = 0.9
    c.train.b2 = 0.95
    c.train.grad_clip = 1.0         # global-norm clipping; 0 disables
    c.train.log_every = 10
    c.train.eval_every = 200
    c.train.eval_batches = 8
    c.train.ckpt_every = 500
    c.train.keep_checkpoints = 3
    c.train.nonfinite = "stop"      # stop | skip: what a NaN/inf loss or gradient does
    c.train.init_from = ""          # a Hugging Face GPT-2 folder or .safetensors file to start
                                    # from instead of random weights (docs/huggingface.md)

    # The device mesh: sizes of its three axes, -1 = all remaining devices (see sharding.py).
    # data x fsdp x tensor must equal the device count; the default puts every device on data.
    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = -1                # batch split, parameters copied
    c.mesh.fsdp = 1                 # batch split, parameters and optimizer state split too
    c.mesh.tensor = 1               # heads, MLP width and vocabulary split
    # Logical axis -> mesh axes ("a,b"; "" = not split). Parameters and activations name
    # logical axes (model.py, kvcache.py); this table alone decides where they live.
    c.mesh.rules = ml_collections.ConfigDict()
    c.mesh.rules.batch = "data,fsdp"
    c.mesh.rules.length = ""
    c.mesh.rules.embed = "fsdp"
    c.mesh.rules.heads = "tensor"
    c.mesh.rules.kv_heads = "tensor"
    c.mesh.rules.head_dim = ""
    c.mesh.rules.mlp = "tensor"
    c.mesh.rules.vocab = "tensor"
    c.mesh.rules.layers = ""
    c.mesh.rules.cache_batch = "data,fsdp"
    c.mesh.rules.cache_heads = "tensor"
    c.mesh.rules.cache_length = ""
    c.mesh.rules.cache_head_dim = ""

    c.sample = ml_collections.ConfigDict()  # the sample printed at the end of training
    c.sample.prompt = "def "
    c.sample.max_new_tokens = 100
    c.sample.temperature = 0.8
    c.sample.top_k = 40
    c.sample.top_p = 0.95
    return c


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The model's shape as a hashable value (a static argument of jitted functions)."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    max_seq_len: int
    tie_embeddings: bool = True
    dtype: str = "float32"
    param_dtype: str = "float32"
    scan_layers: bool = False
    remat: str = "none"
    position: str = "learned"
    norm: str = "layernorm"
    norm_placement: str = "pre"
    mlp: str = "gelu"
    n_kv_heads: int = 0
    sliding_window: int = 0
    attention_kernel: str = "einsum"
    matmul: str = "plain"

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """How many K/V heads attention (and the KV cache) has; n_kv_heads=0 means n_heads."""
        return self.n_kv_heads or self.n_heads

    @property
    def mlp_hidden(self) -> int:
        """The MLP's hidden width. SwiGLU has three matrices (gate, up, down) instead of two, so
        it gets 2/3 of d_ff, rounded to a multiple of 8: 3·D·(2F/3) = 2·D·F parameters, as
        many as the GELU and ReLU MLPs have."""
        if self.mlp == "swiglu":
            return max(8, 8 * round(2 * self.d_ff / 3 / 8))
        return self.d_ff

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> "ModelConfig":
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in config.model.items() if k in fields}
        if values.get("matmul") == "auto":
            values["matmul"] = resolve_matmul()
        return cls(**values)


def resolve_matmul() -> str:
    """What `model.matmul = "auto"` means on this machine: the bf16-input fast path on CPU
    (measured ~1.5x faster than float32, same loss; docs/README-performance.md), plain
    autodiff on GPU/TPU, where XLA's own backward is already fast."""
    import jax

    return "fast_bf16" if jax.default_backend() == "cpu" else "plain"


def _fail(field: str, value: Any, fix: str):
    raise ConfigError(f"{field}={value!r}: {fix}")


def _check_keys(config, schema, prefix=""):
    for key in config.keys():
        name = f"{prefix}{key}"
        if key not in schema:
            known = ", ".join(sorted(schema.keys()))
            raise ConfigError(f"{name}: unknown config key; known keys here: {known}")
        value, default = config[key], schema[key]
        if isinstance(default, ml_collections.ConfigDict):
            if not isinstance(value, ml_collections.ConfigDict):
                _fail(name, value, "must be a section, not a value")
            _check_keys(value, default, name + ".")
        elif type(value) is not type(default) and not (
            isinstance(default, float) and type(value) is int
        ):
            _fail(name, value, f"must be of type {type(default).__name__}")


def validate(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Refuses a config that cannot work, with a message naming the field. Returns it."""
    _check_keys(config, base_config())
    m, d, t, s = config.model, config.data, config.train, config.sample

    for field in ("d_model", "n_layers", "n_heads", "d_ff", "max_seq_len"):
        if m[field] <= 0:
            _fail(f"model.{field}", m[field], "must be a positive integer")
    if m.vocab_size < 0:
        _fail("model.vocab_size", m.vocab_size, "must be > 0, or 0 to take it from the tokenizer")
    if m.d_model % m.n_heads:
        _fail("model.d_model", m.d_model,
              f"must be divisible by model.n_heads={m.n_heads}; "
              f"try d_model={m.n_heads * max(1, round(m.d_model / m.n_heads))}")
    for field in ("dtype", "param_dtype"):
        if m[field] not in DTYPES:
            _fail(f"model.{field}", m[field], f"must be one of {', '.join(DTYPES)}")
    if m.remat not in REMAT:
        _fail("model.remat", m.remat, f"must be one of {', '.join(REMAT)}")
    for field, choices in (("position", POSITIONS), ("norm", NORMS),
                           ("norm_placement", NORM_PLACEMENTS), ("mlp", MLPS),
                           ("attention_kernel", ATTENTION_KERNELS)):
        if m[field] not in choices:
            _fail(f"model.{field}", m[field], f"must be one of {', '.join(choices)}")
    if m.n_kv_heads < 0 or (m.n_kv_heads and m.n_heads % m.n_kv_heads):
        divisors = [k for k in range(1, m.n_heads + 1) if m.n_heads % k == 0]
        _fail("model.n_kv_heads", m.n_kv_heads,
              f"must divide model.n_heads={m.n_heads}: one of {divisors}, or 0 for n_heads")
    if m.sliding_window < 0:
        _fail("model.sliding_window", m.sliding_window,
              "must be >= 0 (0: full causal attention; w: the last w positions)")
    if m.position == "rope" and (m.d_model // m.n_heads) % 2:
        _fail("model.position", m.position,
              f"rope rotates pairs of dimensions, so the head dim d_model/n_heads="
              f"{m.d_model // m.n_heads} must be even: change model.d_model or model.n_heads")
    if m.matmul not in MATMUL:
        _fail("model.matmul", m.matmul, f"must be one of {', '.join(MATMUL)}")

    if d.tokenizer not in ("byte", "char", "bpe"):
        _fail("data.tokenizer", d.tokenizer, "must be byte, char or bpe")
    if d.bpe_vocab_size < 257:
        _fail("data.bpe_vocab_size", d.bpe_vocab_size,
              "must be at least 257 (the 256 byte tokens plus one merge)")
    if d.corpus in ("copy", "random") and d.tokenizer != "byte":
        _fail("data.tokenizer", d.tokenizer, f"synthetic corpus {d.corpus!r} needs tokenizer=byte")
    if d.max_bytes <= 0:
        _fail("data.max_bytes", d.max_bytes, "must be positive")
    if not 0.0 < d.val_fraction < 1.0:
        _fail("data.val_fraction", d.val_fraction, "must be strictly between 0 and 1")

    for field in ("steps", "batch_size", "log_every", "eval_every", "eval_batches",
                  "ckpt_every", "keep_checkpoints"):
        if t[field] <= 0:
            _fail(f"train.{field}", t[field], "must be a positive integer")
    if t.nonfinite not in NONFINITE:
        _fail("train.nonfinite", t.nonfinite, f"must be one of {', '.join(NONFINITE)}")
    if t.init_from and not _is_weights(t.init_from):
        _fail("train.init_from", t.init_from, "must be a folder holding model.safetensors, "
              "or a .safetensors file ('' starts from random weights)")
    if t.warmup_steps < 0:
        _fail("train.warmup_steps", t.warmup_steps, "must be >= 0")
    if t.lr <= 0:
        _fail("train.lr", t.lr, "must be positive")
    if not 0.0 <= t.min_lr_ratio <= 1.0:
        _fail("train.min_lr_ratio", t.min_lr_ratio, "must be in [0, 1]")
    for field in ("b1", "b2"):
        if not 0.0 <= t[field] < 1.0:
            _fail(f"train.{field}", t[field], "must be in [0, 1)")
    if t.weight_decay < 0 or t.grad_clip < 0:
        field = "weight_decay" if t.weight_decay < 0 else "grad_clip"
        _fail(f"train.{field}", t[field], "must be >= 0")

    for axis in MESH_AXES:
        if config.mesh[axis] == 0 or config.mesh[axis] < -1:
            _fail(f"mesh.{axis}", config.mesh[axis], "must be a positive size, or -1 for all "
                  "remaining devices")
    for name, value in config.mesh.rules.items():
        unknown = [a for a in value.split(",") if a.strip() and a.strip() not in MESH_AXES]
        if unknown:
            _fail(f"mesh.rules.{name}", value, f"names mesh axes {unknown}; use a comma-"
                  f"separated subset of {', '.join(MESH_AXES)}, or '' for not split")

    check_sampling(s.temperature, s.top_k, s.top_p, s.max_new_tokens, m.max_seq_len,
                   prefix="sample.")
    return config


def _is_weights(path: str) -> bool:
    from pathlib import Path
    p = Path(path).expanduser()
    return (p / "model.safetensors").is_file() or (p.is_file() and p.suffix == ".safetensors")


def check_sampling(temperature, top_k, top_p, max_new_tokens, max_seq_len, prefix=""):
    """Sampling values that make sense; shared by the config and sample.py's flags."""
    if temperature < 0:
        _fail(f"{prefix}temperature", temperature, "must be >= 0 (0 means greedy)")
    if top_k < 0:
        _fail(f"{prefix}top_k", top_k, "must be >= 0 (0 disables top-k)")
    if not 0.0 < top_p <= 1.0:
        _fail(f"{prefix}top_p", top_p, "must be in (0, 1] (1 disables top-p)")
    if not 0 < max_new_tokens < max_seq_len:
        _fail(f"{prefix}max_new_tokens", max_new_tokens,
              f"must be in [1, {max_seq_len - 1}] (the context is {max_seq_len} tokens)")


def to_dict(config: ml_collections.ConfigDict) -> dict:
    """A plain JSON-able dict (what travels with a checkpoint)."""
    return json.loads(config.to_json())


def from_dict(values: dict) -> ml_collections.ConfigDict:
    """Rebuilds a config saved with `to_dict`, on top of today's defaults."""
    config = base_config()
    config.update_from_flattened_dict(flatten(values))
    return config


def flatten(values: dict, prefix: str = "") -> dict:
    """{'model': {'d_model': 64}} → {'model.d_model': 64}."""
    flat = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
