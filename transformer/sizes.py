"""Sizes of any config without allocating it: parameters, FLOPs, KV cache, activation memory.

    python -m transformer.sizes --config=configs/gpt3_175b.py          # ~175B params, instantly
    python -m transformer.sizes --config=configs/tiny.py --json
    python -m transformer.sizes --config=configs/default.py --batch=8 --kv_dtype=bfloat16

The arithmetic lives in `flops.py`; here the real parameter tree is built with
`jax.eval_shape` (shapes only, no memory) and its count must equal the arithmetic, so the two
can never silently drift apart. `train.py` prints the same summary at start-up.
"""

from __future__ import annotations

import dataclasses
import json

import jax
from absl import flags
from ml_collections import config_flags

from transformer import cli, flops
from transformer.config import ConfigError, ModelConfig, validate


def model_config_of(config) -> ModelConfig:
    """The model of a config file, with vocab_size=0 resolved where no corpus is needed
    (`config` itself is left as it is)."""
    model = ModelConfig.from_config(config)
    if model.vocab_size == 0:
        tokenizer = config.data.tokenizer
        if tokenizer == "char":
            raise ConfigError("model.vocab_size=0: the char tokenizer's size comes from the "
                              "corpus; pass --config.model.vocab_size=N to inspect it")
        vocab = 256 if tokenizer == "byte" else config.data.bpe_vocab_size
        model = dataclasses.replace(model, vocab_size=vocab)
    return model


def real_param_count(c: ModelConfig) -> int:
    """The number of parameters `model.init_params` creates, from shapes alone."""
    from transformer.model import init_params  # imports flax; kept out of flops.py
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


def _main():
    # Flags are defined only when run as a program: train.py imports this module and has its
    # own --config.
    config_flag = config_flags.DEFINE_config_file("config", None,
                                                  "A config file (Python, get_config()).")
    json_flag = flags.DEFINE_bool("json", False, "Print one JSON object instead of text.")
    batch_flag = flags.DEFINE_integer("batch", None, "Batch size for the KV-cache and "
                                      "activation figures (default: train.batch_size).")
    kv_flag = flags.DEFINE_enum("kv_dtype", None, list(flops.BYTES),
                                "KV-cache dtype (default: model.dtype).")

    def main(argv):
        if len(argv) > 1:
            cli.fail(f"unexpected arguments {argv[1:]}: flags look like --name=value")
        if flags.FLAGS["config"].value is None:
            cli.fail("--config=PATH is required, e.g. --config=configs/gpt3_175b.py")
        config = validate(cli.config_value(config_flag))
        c = model_config_of(config)
        batch = batch_flag.value or config.train.batch_size
        if batch <= 0:
            cli.fail(f"--batch={batch}: must be a positive integer")
        if json_flag.value:
            print(json.dumps(report(c, batch, kv_flag.value), indent=2))
        else:
            print(summary(c, batch, kv_flag.value))

    cli.run(main)


if __name__ == "__main__":
    _main()
