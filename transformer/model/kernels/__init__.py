"""The kernel seam: which dense layers and attention the model runs, chosen once per config.

    ops = kernels.for_model(config)
    y_BTF = ops.dense(F, name="expand", kernel_init=..., bias_init=...)(x_BTD)
    logits_BTV = ops.head(h_BTD, w_DV)       # or ops.head(h_BTD, embedding_VD, tied=True)
    out_BHTK, weights_BHTT = ops.self_attention(q_BHTK, k_BGTK, v_BGTK, mask_11TT)
    out_BHTK, weights_BHTS = ops.cached_attention(q_BHTK, k_BGSK, v_BGSK, mask_B1TS)
    config, params = kernels.decode_setup(config, params, batch)   # before a decode loop

    dense.py           a dense layer with a hand-written backward pass (the CPU fast path)
    attention_vjp.py   attention with a hand-written backward pass (the CPU fast path)
    auto.py            what `model.matmul=auto` means on this machine, and why

`model.matmul` picks how the matmuls are computed (the parameters are the same in every mode,
so a checkpoint trained in one mode loads in another):
    plain      flax's nn.Dense / nn.DenseGeneral and autodiff (the fast path on GPU/TPU)
    fast_f32   hand-written backward passes for XLA-CPU (dense.py, attention_vjp.py),
               float32: the same numbers as `plain` up to summation order
    fast_bf16  the same with bfloat16 matmul inputs and float32 accumulation (mixed
               precision): parameters, activations between layers, softmax and loss stay
               float32
`model.attention_kernel` picks the attention: `einsum` (attention.py's arithmetic, which
returns the weights), `jax` (`jax.nn.dot_product_attention`, XLA's version) or `cudnn` (the
same asking for cuDNN flash attention for training and scoring; decoding, one query against a
partly filled cache, stays with XLA's). Neither forms the weights: they are None, and a model
that uses them has no attention maps to look at.

This is the only module that reads those two fields: model/gpt.py and generate/decode.py ask it for their
layers and never branch on how the matmuls are computed.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.config import fields
from transformer.model import attention
from transformer.model.kernels import attention_vjp, auto, dense

MODES = fields.MATMUL_MODES  # declared with model.matmul
_COMPUTE_DTYPE = {"fast_f32": "float32", "fast_bf16": "bfloat16"}


@dataclasses.dataclass(frozen=True)
class Kernels:
    """What the model computes with. Attention functions take (q_BHTK, k_BGSK, v_BGSK,
    mask_BHTS) and return (out_BHTK, weights_BHTS or None)."""

    dense: Callable[..., nn.Module]  # (features, axis=-1, name=, kernel_init=, bias_init=)
    head: Callable  # (h_BTD, w, tied) -> float32 logits_BTV: h w (w [D, V]), or h wᵀ (tied: w [V, D])
    self_attention: Callable  # training and scoring: queries and keys at the same positions
    cached_attention: Callable  # decoding: queries over the KV cache's slots


def matmul_mode(config) -> str:
    """The concrete mode of a ModelConfig. The run and sampler set-up resolve `auto` for their
    target and record it (parallel/target.py's resolve_matmul); a config that reaches the
    model unresolved runs `plain`, whatever machine builds it: the model reads no host."""
    return "plain" if config.matmul == "auto" else config.matmul


def for_model(config) -> Kernels:
    """The dense layer and attention for a ModelConfig."""
    return Kernels(_dense(config), _head(config), *_attention(config))


def _dense(config) -> Callable[..., nn.Module]:
    mode = matmul_mode(config)
    if mode == "plain":
        return functools.partial(_flax_dense, dtype=config.dtype, param_dtype=config.param_dtype)
    return functools.partial(dense.DenseGeneral, compute_dtype=_COMPUTE_DTYPE[mode],
                             dtype=config.dtype, param_dtype=config.param_dtype)


def _head(config) -> Callable:
    """The logits, h_BTD @ w_DV summed in float32 (a bfloat16 sum would round every logit
    before the softmax sees it); `tied=True` takes the embedding's [V, D] instead. `plain`
    multiplies in the model's dtype with autodiff's backward; the fast modes through
    dense.matmul, as every other dense layer: with a vocabulary of a few thousand the head is
    a step's largest matmul, and in `fast_bf16` it takes bfloat16 inputs like the rest
    instead of running in float32. The embedding is laid out as [D, V] first (dense.transposed:
    a transpose between reshapes): a `.T` folded into a bfloat16 dot is XLA-CPU's slow kernel."""
    mode = matmul_mode(config)
    if mode == "plain":
        def head(h_BTD, w, tied=False):
            h_BTD, w = nn.dtypes.promote_dtype(h_BTD, w, dtype=config.dtype)
            return jnp.dot(h_BTD, w.T if tied else w, preferred_element_type=jnp.float32)
        return head
    compute = _COMPUTE_DTYPE[mode]

    def head(h_BTD, w, tied=False):
        return dense.matmul(h_BTD, dense.transposed(w) if tied else w, compute)
    return head


def _flax_dense(features, axis=-1, **kwargs) -> nn.Module:
    """nn.Dense for one input and one output axis, nn.DenseGeneral for more."""
    if isinstance(features, int) and axis == -1:
        return nn.Dense(features, **kwargs)
    return nn.DenseGeneral(features, axis=axis, **kwargs)


def _attention(config) -> tuple[Callable, Callable]:
    """(self_attention, cached_attention)."""
    if config.attention_kernel in ("jax", "cudnn"):
        fused = "cudnn" if config.attention_kernel == "cudnn" else None

        def causal_kernel(q_BHTK, k_BGTK, v_BGTK, mask_11TT):
            # Training and scoring: the mask is the model's causal one (causal_mask(T, w)),
            # so the kernel is told so instead of reading it (no dense mask, no bias).
            del mask_11TT
            return attention.jax_causal_attention(q_BHTK, k_BGTK, v_BGTK,
                                                  config.sliding_window, fused), None

        def cached_kernel(q_BHTK, k_BGSK, v_BGSK, mask_BHTS):
            # Decoding: queries against a partly filled (or ring) cache need the explicit mask.
            return attention.jax_attention(q_BHTK, k_BGSK, v_BGSK, mask_BHTS), None
        return causal_kernel, cached_kernel
    mode = matmul_mode(config)
    if mode == "plain":
        return attention.causal_attention, attention.dot_product_attention
    # Decoding reads the cache with the forward pass only: no backward pass to replace.
    attend = functools.partial(attention_vjp.dot_product_attention,
                               compute_dtype=_COMPUTE_DTYPE[mode])
    return functools.partial(attention.causal_attention, attend=attend), (
        attention.dot_product_attention)


def forming_weights(config):
    """`config`, or the same model with an attention kernel that forms the weights (and so
    sows them): `jax` never does, `einsum` computes the same attention and does."""
    if config.attention_kernel in ("jax", "cudnn"):
        return dataclasses.replace(config, attention_kernel="einsum")
    return config


def compute_dtype(config) -> str:
    """The dtype the model's matmuls take their inputs in ("float32" or "bfloat16"): which
    matmul peak MFU divides by, and which rounding a reproduction of the arithmetic needs."""
    if matmul_mode(config) == "fast_bf16" or config.dtype == "bfloat16":
        return "bfloat16"
    return "float32"


def train_settings(precision: str, platform: str) -> dict:
    """The model fields that train in `precision` ("float32", or "bfloat16": bfloat16 matmul
    inputs with float32 accumulation) the fastest known way on `platform` ("cpu", "gpu", ...):
    the hand-written backward passes on CPU, XLA's own kernels and autodiff elsewhere (with
    bfloat16 activations for mixed precision)."""
    if platform == "cpu":
        return {"matmul": "fast_bf16" if precision == "bfloat16" else "fast_f32"}
    if precision == "bfloat16":
        return {"matmul": "plain", "dtype": "bfloat16"}
    return {"matmul": "plain"}


def decode_setup(config, params, batch: int):
    """(config, params) for a decode loop over `batch` rows.

    In `fast_bf16` mode the dense kernels are cast to bfloat16 once, before the token loop
    (each step would otherwise read the float32 weights and write bf16 copies). Every batch
    size keeps the mode it was given: a single row in `fast_f32` would be a little faster on
    XLA-CPU (bound by reading the weights, and its float32 matrix-vector product beat the
    bfloat16 one), but then sample 0 of `--num_samples=1` would be computed in another
    precision than sample 0 of `--num_samples=2`, and differ from it.
    """
    if matmul_mode(config) != "fast_bf16":
        return config, params
    return config, jax.tree_util.tree_map_with_path(
        lambda path, x: x.astype(jnp.bfloat16) if getattr(path[-1], "key", None) == "kernel"
        else x, params)


def decode_matmul(config, batch: int) -> str:
    """The matmul mode a decode loop over `batch` rows runs in (after `decode_setup`)."""
    return matmul_mode(decode_setup(config, {}, batch)[0])
