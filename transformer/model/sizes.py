"""Sizes of any config without allocating it: parameters, FLOPs, KV cache, activation memory.

    print(summary(ModelConfig.from_config(config), batch=8))    # what `sizes` prints
    report(model_config)                                          # the figures as a dict

The arithmetic lives in `flops.py`; here the real parameter tree is built with
`jax.eval_shape` (shapes only, no memory) and its count must equal the arithmetic, so the two
can never silently drift apart. `train.py` prints the same summary at start-up.
"""

from __future__ import annotations

import dataclasses

import jax

from transformer.config import ConfigError, ModelConfig, padded_vocab
from transformer.config.fields import SYNTHETIC_CORPORA
from transformer.model import flops


def model_config_of(config) -> ModelConfig:
    """The model of a config file, with vocab_size=0 resolved where no corpus is needed
    (`config` itself is left as it is)."""
    model = ModelConfig.from_config(config)
    if model.vocab_size == 0:
        tokenizer = config.data.tokenizer
        if tokenizer == "char":
            raise ConfigError("model.vocab_size=0: the char tokenizer's size comes from the "
                              "corpus; pass --config.model.vocab_size=N to inspect it")
        # Text ends each document with an end-of-text token (byte: 256 + 1); the synthetic
        # tasks draw plain bytes.
        vocab = (config.data.bpe_vocab_size if tokenizer == "bpe" else
                 256 if config.data.corpus in SYNTHETIC_CORPORA else 257)
        padded = padded_vocab(vocab, model.vocab_multiple)  # as the run's start pads it
        model = dataclasses.replace(model, **{k.split(".")[1]: v for k, v in padded.items()})
    return model


def real_param_count(c: ModelConfig) -> int:
    """The number of parameters `model.init_params` creates, from shapes alone."""
    from transformer.model.gpt import init_params  # imports flax; kept out of flops.py
    shapes = jax.eval_shape(lambda key: init_params(c, key), jax.random.key(0))
    return sum(x.size for x in jax.tree.leaves(shapes))


def report(c: ModelConfig, batch: int = 1, kv_dtype: str | None = None, check: bool = True):
    """Every figure as a flat dict (what --json prints)."""
    counts = flops.param_counts(c)
    if check:
        real = real_param_count(c)
        if real != counts["total"]:
            raise AssertionError(f"flops.py counts {counts['total']:,} parameters, the model "
                                 f"has {real:,}: update flops.param_counts")
    kv_dtype = kv_dtype or c.dtype
    return {
        "params_total": counts["total"],
        "params_non_embedding": counts["non_embedding"],
        "params_by_component": {k: v for k, v in counts.items()
                                if k not in ("total", "non_embedding")},
        "train_flops_per_token": flops.train_flops_per_token(c),
        "forward_flops_per_token": flops.forward_flops_per_token(c),
        "attention_train_flops_per_token": 3 * flops.attention_flops_per_token(c),
        "kv_cache_dtype": kv_dtype,
        "kv_cache_bytes_per_token": flops.kv_cache_bytes_per_token(c, kv_dtype),
        "batch": batch,
        "kv_cache_bytes_full_context": flops.kv_cache_bytes(c, batch, kv_dtype),
        "activation_bytes_per_step": flops.activation_bytes(c, batch),
    }


def activations_per_chip(c: ModelConfig, batch: int, grad_accum: int, batch_shards: int,
                         length_shards: int) -> float:
    """flops.activation_bytes for the rows one chip holds of one micro-batch, split further
    only by the pieces the length axis is cut into (sequence parallelism): the residual
    stream a block keeps is [batch, length, embed], whole across the tensor axis otherwise.
    The per-chip estimate `python -m transformer compile` puts beside XLA's peak."""
    rows = max(1, batch // grad_accum // batch_shards)
    return flops.activation_bytes(c, rows) / length_shards


def human(n: float, unit: str = "") -> str:
    """1234567 -> '1.23M'; bytes with unit='B' use powers of 1024 ('1.5 GiB')."""
    if unit == "B":
        for suffix, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if n >= scale:
                return f"{n / scale:.3g} {suffix}"
        return f"{int(n)} B"
    for suffix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.4g}{suffix}"
    return f"{n:.4g}"


# How close the estimate comes: its per-chip form (activations_per_chip plus the state) beside
# XLA's compiled peak, docs/records/compile.jsonl; `python -m transformer sizes` prints it.
CALIBRATION = ("  against XLA's compiled peak per chip (python -m transformer compile): 0.8-1.8x of "
               "the estimate for the 1.3B-175B configs on TPU and H100 targets, 0.4-0.7x for "
               "GPT-2 small's (XLA keeps fewer activations; docs/accelerators.md)")


def summary(c: ModelConfig, batch: int = 1, kv_dtype: str | None = None,
            check: bool = True) -> str:
    """The plain-text report."""
    r = report(c, batch, kv_dtype, check)
    total = r["params_total"]
    tied = "tied" if c.tie_embeddings else "untied"
    lines = [
        f"model: {c.n_layers} layers, d_model {c.d_model}, {c.n_heads} heads (head dim "
        f"{c.head_dim}), d_ff {c.d_ff}, context {c.max_seq_len}, vocab {c.vocab_size}, "
        f"{tied} embeddings",
        f"params: {total:,} total ({human(total)}), {r['params_non_embedding']:,} "
        f"non-embedding ({human(r['params_non_embedding'])})",
    ]
    for name, n in r["params_by_component"].items():
        if n:
            lines.append(f"  {name:<20}{n:>18,}  {100 * n / total:5.1f}%")
    att = r["attention_train_flops_per_token"]
    lines += [
        f"FLOPs/token: train {r['train_flops_per_token']:.4g} (attention {att:.3g}, causal), "
        f"forward {r['forward_flops_per_token']:.4g}",
        f"KV cache: {human(r['kv_cache_bytes_per_token'], 'B')}/token ({r['kv_cache_dtype']}); "
        f"{c.max_seq_len} tokens x batch {batch} = "
        f"{human(r['kv_cache_bytes_full_context'], 'B')}",
        f"activations: ~{human(r['activation_bytes_per_step'], 'B')} per training step at "
        f"batch {batch} (remat {c.remat}; rough)",
    ]
    return "\n".join(lines)
