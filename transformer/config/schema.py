"""The configuration schema, checked once at start-up.

Config files under `configs/` are data: each `get_config()` starts from `base_config()`
and changes a few fields. Every field a run can use is declared once in `config/fields.py` with its
base value, type, allowed values, doc and resume rule; this module derives base_config(), the
checks and the model's hashable config from that table, so an unknown key or a value of the
wrong type is caught before anything runs, and every error names the field and the fix.

    from transformer.config import base_config, validate
    config = base_config()
    config.model.d_model = 384
    config = validate(config)   # raises ConfigError("model.d_model=...: ...")

A validated config is not changed afterwards: code that derives a value (the vocabulary size
from the tokenizer, the matmul mode `auto` picks at the run's start) returns a new config with
`replace`. Nothing here reads the machine: `auto` is resolved at the edge (model/kernels/auto.py). The
ConfigDict type stays (not FrozenConfigDict), because callers build variants by copying a
config and setting fields before they validate it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from typing import Any

import ml_collections

from transformer.config import fields


class ConfigError(ValueError):
    """A config value that cannot work; the message names the field and the fix."""


def base_config() -> ml_collections.ConfigDict:
    """Every field a run understands, with its base value (fields.FIELDS: GPT-2's block with
    AdamW, not configs/default.py's quick start). Config files override these."""
    c = ml_collections.ConfigDict()
    for field in fields.FIELDS:
        section = c
        for part in field.section.split("."):
            if part not in section:
                section[part] = ml_collections.ConfigDict()
            section = section[part]
        section[field.key] = field.default
    return c


def replace(config: ml_collections.ConfigDict, **changes) -> ml_collections.ConfigDict:
    """A copy of `config` with dotted fields changed: replace(c, **{"model.vocab_size": 65}).
    The original is left as it is."""
    new = config.copy_and_resolve_references()
    for name, value in changes.items():
        section, key = name.rsplit(".", 1)
        node = new
        for part in section.split("."):
            node = node[part]
        node[key] = value
    return new


def padded_vocab(size: int, multiple: int = 1) -> dict:
    """The model fields for a tokenizer of `size` ids when model.vocab_size=0: the vocabulary
    rounded up to a multiple of `multiple` (nanoGPT pads GPT-2's 50,257 to 50,304 = 786·64:
    rows a tensor-parallel mesh splits evenly, and matmul widths that tile well), and where the
    tokenizer's ids end when rows were added ({"model.vocab_used": size}; 0: none added)."""
    padded = -(-size // multiple) * multiple
    return {"model.vocab_size": padded, "model.vocab_used": size if padded > size else 0}


def _head_dim(self) -> int:
    return self.d_model // self.n_heads


def _kv_heads(self) -> int:
    """How many K/V heads attention (and the KV cache) has; n_kv_heads=0 means n_heads."""
    return self.n_kv_heads or self.n_heads


def _mlp_hidden(self) -> int:
    """The MLP's hidden width. SwiGLU has three matrices (gate, up, down) instead of two, so
    it gets 2/3 of d_ff, rounded to a multiple of 8: 3·D·(2F/3) = 2·D·F parameters, as
    many as the GELU and ReLU MLPs have."""
    if self.mlp == "swiglu":
        return max(8, 8 * round(2 * self.d_ff / 3 / 8))
    return self.d_ff


def _from_config(cls, config: ml_collections.ConfigDict):
    """The model section of a (validated) config."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in config.model.items() if k in names})


# The model's shape as a hashable value (a static argument of jitted functions): one field per
# `model.*` declaration, with the same defaults as base_config(). Plain data: `matmul` may be
# "auto", which the kernel seam (model/kernels/) resolves; constructing one reads no machine.
ModelConfig = dataclasses.make_dataclass(
    "ModelConfig",
    [(f.key, type(f.default), dataclasses.field(default=f.default)) for f in fields.MODEL_FIELDS],
    frozen=True,
    namespace={"head_dim": property(_head_dim), "kv_heads": property(_kv_heads),
               "mlp_hidden": property(_mlp_hidden),
               "from_config": classmethod(_from_config),
               "__module__": __name__})


def _fail(field: str, value: Any, fix: str):
    raise ConfigError(f"{field}={value!r}: {fix}")


def _check_keys(config, schema, prefix=""):
    """Unknown keys and values of the wrong type, section by section."""
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


def _value(config, name: str):
    node = config
    for part in name.split("."):
        node = node[part]
    return node


def _check_fields(config) -> None:
    """Each field on its own: its declared choices and check."""
    for field in fields.FIELDS:
        value = _value(config, field.name)
        if field.choices and value not in field.choices:
            _fail(field.name, value, f"must be one of {', '.join(field.choices)}")
        fix = field.check(value) if field.check else None
        if fix:
            _fail(field.name, value, fix)


def _check_model(m) -> None:
    """Model fields that must agree with each other."""
    if m.d_model % m.n_heads:
        step = m.n_heads * (2 if m.position == "rope" else 1)  # rope: an even head dim too
        _fail("model.d_model", m.d_model,
              f"must be divisible by model.n_heads={m.n_heads}; "
              f"try d_model={step * max(1, round(m.d_model / step))}")
    if m.n_kv_heads < 0 or (m.n_kv_heads and m.n_heads % m.n_kv_heads):
        divisors = [k for k in range(1, m.n_heads + 1) if m.n_heads % k == 0]
        _fail("model.n_kv_heads", m.n_kv_heads,
              f"must divide model.n_heads={m.n_heads}: one of {divisors}, or 0 for n_heads")
    if m.position == "rope" and (m.d_model // m.n_heads) % 2:
        _fail("model.position", m.position,
              f"rope rotates pairs of dimensions, so the head dim d_model/n_heads="
              f"{m.d_model // m.n_heads} must be even: change model.d_model or model.n_heads")
    if m.vocab_used and m.vocab_size and m.vocab_used > m.vocab_size:
        _fail("model.vocab_used", m.vocab_used, f"must be at most model.vocab_size="
              f"{m.vocab_size} (ids from vocab_used up are padding), or 0 for none")
    for name in ("value_embeds", "backout", "x0_lambdas"):  # per-block pieces: the scanned body is one
        if m.scan_layers and m[name] not in ("none", False):
            _fail(f"model.{name}", m[name], "is per block, and model.scan_layers=True runs one "
                  "block body for all: set model.scan_layers=False")
    if m.attention_kernel == "cudnn" and m.dtype != "bfloat16":
        _fail("model.attention_kernel", m.attention_kernel, "cuDNN flash attention takes "
              "bfloat16 inputs: also set model.dtype=bfloat16, or use attention_kernel=jax")


def _check_train(t) -> None:
    if t.batch_size % t.grad_accum:
        _fail("train.grad_accum", t.grad_accum,
              f"must divide train.batch_size={t.batch_size} (the batch of one update is split "
              "into grad_accum micro-batches)")
    if t.muon_ns_coeffs == "polar_express" and t.muon_ns_steps > 5:
        _fail("train.muon_ns_steps", t.muon_ns_steps, "train.muon_ns_coeffs=polar_express has "
              "one triple for each of 5 steps: use at most 5, or muon_ns_coeffs=quintic")
    span = fields.step_range(t.profile)
    if span and span[1] - 1 > t.steps:
        _fail("train.profile", t.profile, f"the run has train.steps={t.steps}: the range must "
              f"end by step {t.steps} (STOP <= {t.steps + 1})")


def _check_data(d) -> None:
    if d.corpus in fields.SYNTHETIC_CORPORA and d.tokenizer != "byte":
        _fail("data.tokenizer", d.tokenizer, f"synthetic corpus {d.corpus!r} needs tokenizer=byte")


def validate(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Refuses a config that cannot work, with a message naming the field. Returns it."""
    if "base" in config and "sizes" in config:  # scaling.sweep's sweep_config(...)
        raise ConfigError("this is a sweep config (base, sizes, budgets), not a run config: run "
                          "it with python -m transformer scaling --sweep=FILE --workdir=DIR")
    _check_keys(config, base_config())
    _check_fields(config)
    _check_model(config.model)
    _check_data(config.data)
    _check_train(config.train)
    s = config.sample
    check_sampling(s.temperature, s.top_k, s.top_p, s.max_new_tokens, prefix="sample.",
                   fewest=0)  # 0: no sample at the end of training
    return config


INT32_MAX = fields.INT32_MAX
FLOAT32_MAX = 3.4028234663852886e38  # np.finfo(np.float32).max


def check_sampling(temperature, top_k, top_p, max_new_tokens, prefix="", error=ConfigError,
                   fewest=1):
    """The one check of sampling values: the config's sample section, sample.py's flags and
    generate/decode.py's arguments all go through it (`error`: the exception to raise;
    `fewest`: the fewest new tokens allowed, 0 only for the end-of-training sample, which
    then is not made)."""
    def fail(name, value, fix):
        raise error(f"{prefix}{name}={value!r}: {fix}")

    if not isinstance(temperature, numbers.Real) or not math.isfinite(temperature) \
            or temperature < 0:
        fail("temperature", temperature, "must be >= 0 (0 means greedy)")
    if top_k < 0:
        fail("top_k", top_k, "must be >= 0 (0 disables top-k)")
    if not 0.0 < top_p <= 1.0:
        fail("top_p", top_p, "must be in (0, 1] (1 disables top-p)")
    # Any length: generation goes on past the context (generate/decode.py).
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral) \
            or max_new_tokens < fewest:
        fail("max_new_tokens", max_new_tokens, f"must be an integer >= {fewest}"
             + (" (0: no sample at the end of training)" if fewest == 0 else ""))
    # The device takes the temperature as a float32, top_k and the token count as int32s:
    # past them numpy raised OverflowError inside generate (a traceback; for the sample at
    # the end of training, once the whole run had trained), and the temperature became inf.
    if temperature > FLOAT32_MAX:
        fail("temperature", temperature, f"must be at most {FLOAT32_MAX:.4g} (a float32)")
    if top_k > INT32_MAX:
        fail("top_k", top_k, f"must be at most {INT32_MAX:,} (any k past the vocabulary "
             "keeps every token)")
    if max_new_tokens > INT32_MAX:
        fail("max_new_tokens", max_new_tokens, f"must be at most {INT32_MAX:,}")


def to_dict(config: ml_collections.ConfigDict) -> dict:
    """A plain JSON-able dict (what travels with a checkpoint)."""
    return json.loads(config.to_json())


def from_dict(values: dict) -> ml_collections.ConfigDict:
    """Rebuilds a config saved with `to_dict`, on top of today's defaults."""
    config = base_config()
    flat = {k: v for k, v in flatten(values).items() if k not in fields.RETIRED}
    config.update_from_flattened_dict(flat)
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
