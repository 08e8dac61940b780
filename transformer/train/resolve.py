"""A config file's config -> the concrete run's config: the one way every tool does it.

    config, matmul = resolve(config)                              on this host
    config, matmul = resolve(config, platform=target.platform)    for a compile target
    config, _ = resolve(config, tokenizer=tok, mesh=mesh)         vocab_size=0 filled in too
    config, _ = resolve(config, platform=None)                    no machine: sizes, sweeps

The steps, each applied only where its input is given, always in this order (resolving a
resolved config gives it back unchanged, so a run's start may resolve before its tokenizer is
known and again after):

    1. validated (config/schema.py), unless the caller says it did
    2. model.depth's sizes, rates, batch and horizon written in (config/depth.py), validated
    3. `auto` made concrete for `platform` (default: the mesh's devices, else this host's
       backend): model.matmul (parallel/target.py reads the target's facts, model/kernels/
       auto.py decides from them), then train.muon_ns_dtype after it; a
       fused cuDNN attention refused off a GPU. platform=None leaves them `auto` (parameter
       counts and FLOPs do not depend on them) and imports no JAX.
    4. with `tokenizer`: model.vocab_size=0 from it, padded for model.vocab_multiple and the
       pieces `mesh` splits the vocabulary into; a resumed run keeps its checkpoint's (`saved`,
       the config it was saved with).

train/start.py (a run's start), sample.py's --hf, sizes, compile, bench, a scaling sweep's
members and the lab's instruments call `resolve`; nothing else chains these steps.
"""

from __future__ import annotations

import math

from transformer import config as config_lib
from transformer.config import ConfigError, depth

HOST = "host"  # platform=HOST: the mesh's devices when a mesh is given, else this host's backend


def resolve(config, *, platform: str | None = HOST, tokenizer=None, mesh=None, saved=None,
            validated: bool = False):
    """(the concrete run's config, the auto.Choice saying what model.matmul is and why, or None
    with platform=None); the caller's config is left as it is. The module docstring lists the
    steps."""
    config = config if validated else config_lib.validate(config)
    derived = depth.derive(config)
    if derived is not config:
        config = config_lib.validate(derived)
    choice = None
    if platform is not None:
        config, choice = _concrete(config, _platform(platform, mesh))
    if tokenizer is not None:
        config = _vocab(config, tokenizer, mesh, saved)
    return config, choice


def _platform(platform: str, mesh) -> str:
    if platform != HOST:
        return platform
    if mesh is not None:
        from transformer.parallel import sharding
        return sharding.platform(mesh)
    import jax
    return jax.default_backend()


def _concrete(config, platform: str):
    """`auto` fields concrete for `platform` (the program's devices, which may be a TPU or GPU
    topology compiled on a CPU host)."""
    from transformer.model import kernels
    from transformer.parallel import target
    if config.model.attention_kernel == "cudnn" and platform not in ("gpu", "cuda"):
        raise ConfigError(f"model.attention_kernel=cudnn: cuDNN flash attention needs an NVIDIA "
                          f"GPU, this run is on {platform}; use attention_kernel=jax")
    config, choice = target.resolve_matmul(config_lib.replace(config), platform)
    if config.train.muon_ns_dtype == "auto":
        config = config_lib.replace(config, **{"train.muon_ns_dtype":
                                               kernels.compute_dtype(config.model)})
    return config, choice


def _vocab(config, tokenizer, mesh=None, saved=None):
    """The vocabulary size from the tokenizer when it is 0, padded up to a multiple of
    model.vocab_multiple and of the pieces `mesh` splits the vocabulary into (so that
    mesh.tensor=2 needs no hand-padding); a resumed run keeps its checkpoint's (`saved`),
    whatever mesh it resumes on."""
    from transformer import data
    if config.model.vocab_size == 0:
        saved = (saved or {}).get("model", {})
        if saved.get("vocab_size", 0) >= tokenizer.vocab_size:
            return config_lib.replace(config, **{"model.vocab_size": saved["vocab_size"],
                                                 "model.vocab_used": saved.get("vocab_used", 0)})
        multiple = config.model.vocab_multiple
        if mesh is not None:
            from transformer.parallel import sharding
            multiple = math.lcm(multiple, sharding.shards(mesh, sharding.axis_rules(config),
                                                          "vocab"))
        return config_lib.replace(config, **config_lib.padded_vocab(tokenizer.vocab_size,
                                                                    multiple))
    if config.data.corpus in data.SYNTHETIC:  # synthetic tasks draw below vocab_size: no padding
        return config
    if config.model.vocab_size < tokenizer.vocab_size:
        raise ConfigError(f"model.vocab_size={config.model.vocab_size}: the {tokenizer.kind} "
                          f"tokenizer has {tokenizer.vocab_size} tokens; set at least that, "
                          "or 0 to take it from the tokenizer")
    if config.model.vocab_size > tokenizer.vocab_size and not config.model.vocab_used:
        # Padded by hand: those ids are padding too, never sampled.
        return config_lib.replace(config, **{"model.vocab_used": tokenizer.vocab_size})
    return config
