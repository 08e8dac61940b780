"""Dense layers with a hand-written backward pass: the fast path for XLA's CPU backend.

    y = x W + b                     forward: one matmul, float32 accumulation
    dx = dy W^T                     backward, written out by hand (jax.custom_vjp)
    dW = X^T dy                     X^T materialised as x.transpose(..).reshape(I, N)

Why: left to autodiff, XLA-CPU folds the transposes of the backward into `a.T @ b` dots that
run through a slow fallback (~120 GFLOP/s against ~200 for `a @ b` in float32), and a bfloat16
forward does not help because the backward dots stay slow. Writing the backward by hand with
an explicitly laid out X^T keeps every matmul on the fast kernel (see docs/README-performance.md
for the measurements). On GPU/TPU autodiff is already fast: use `model.matmul = "plain"`.

`model.matmul` picks the layer (the parameters are the same in every mode, so a checkpoint
trained in one mode loads in another):
    plain      flax.linen.DenseGeneral, autodiff backward
    fast_f32   this layer, float32 inputs: the same numbers as `plain` up to summation order
    fast_bf16  this layer, bfloat16 matmul inputs with float32 accumulation (mixed precision):
               parameters, activations between layers, softmax and loss stay float32

    dense = fastdense.factory(config, nn.Dense)   # nn.Dense in plain mode, else this layer
    y_BTF = dense(F, name="expand", kernel_init=..., bias_init=...)(x_BTD)
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

MATMUL_MODES = ("plain", "fast_f32", "fast_bf16")
_COMPUTE_DTYPE = {"fast_f32": "float32", "fast_bf16": "bfloat16"}


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def matmul(x_BTI, w_IO, compute_dtype):
    """x_BTI @ w_IO (any number of leading dims) with inputs cast to compute_dtype (a name) and a
    float32 result."""
    return jnp.dot(x_BTI.astype(compute_dtype), w_IO.astype(compute_dtype),
                   preferred_element_type=jnp.float32)


def _matmul_fwd(x_BTI, w_IO, compute_dtype):
    x_c, w_c = x_BTI.astype(compute_dtype), w_IO.astype(compute_dtype)
    y_BTO = jnp.dot(x_c, w_c, preferred_element_type=jnp.float32)
    # Keep X^T [I, B*T] for the weight gradient, transposed before the reshape: XLA folds a
    # plain `.T` into the dot (the slow `a.T @ b` kernel) but not a transpose+reshape.
    xT_IN = jnp.moveaxis(x_c, -1, 0).reshape(x_c.shape[-1], -1)
    # Residuals must be arrays: empty ones carry the primal dtypes to the backward pass.
    return y_BTO, (xT_IN, w_c, jnp.empty((0,), x_BTI.dtype), jnp.empty((0,), w_IO.dtype))


def _matmul_bwd(compute_dtype, residuals, dy_BTO):
    xT_IN, w_c, x_tag, w_tag = residuals
    dy_c = dy_BTO.astype(compute_dtype)
    dx_BTI = jnp.dot(dy_c, _transpose(w_c), preferred_element_type=jnp.float32)
    dw_IO = jnp.dot(xT_IN, dy_c.reshape(-1, dy_c.shape[-1]), preferred_element_type=jnp.float32)
    return dx_BTI.astype(x_tag.dtype), dw_IO.astype(w_tag.dtype)


matmul.defvjp(_matmul_fwd, _matmul_bwd)


def _transpose(w_IO):
    """W^T as an array of its own. `dy @ w.T` gets folded into a dot that reads W transposed,
    which in bfloat16 ran at ~120 GFLOP/s against ~760 for this (docs/README-performance.md);
    a transpose between two reshapes is not folded."""
    I, O = w_IO.shape
    if O % 2:
        return w_IO.T
    return w_IO.reshape(I, 2, O // 2).transpose(1, 2, 0).reshape(O, I)


class DenseGeneral(nn.Module):
    """`nn.DenseGeneral` over the trailing `axis` dims, computed by `matmul` above.

    Same parameter names, shapes and initialisers as flax's DenseGeneral (kernel
    [*in_dims, *features], bias [*features]), so `plain` and `fast_*` share checkpoints.
    """

    features: int | tuple[int, ...]
    axis: int | tuple[int, ...] = -1
    use_bias: bool = True
    mode: str = "fast_f32"
    dtype: Any = None  # the output dtype (model.dtype); None: the input's
    param_dtype: Any = jnp.float32
    kernel_init: Callable = nn.initializers.lecun_normal()
    bias_init: Callable = nn.initializers.zeros

    @nn.compact
    def __call__(self, x):
        features = tuple(self.features) if isinstance(self.features, (tuple, list)) else (
            self.features,)
        n_in = len(self.axis) if isinstance(self.axis, (tuple, list)) else 1
        axes = tuple(self.axis) if isinstance(self.axis, (tuple, list)) else (self.axis,)
        if sorted(a % x.ndim for a in axes) != list(range(x.ndim - n_in, x.ndim)):
            raise ValueError(f"fastdense.DenseGeneral contracts trailing axes only, got {axes}")
        in_dims = x.shape[-n_in:]
        kernel = self.param("kernel", self.kernel_init, in_dims + features, self.param_dtype)
        lead = x.shape[:-n_in]
        y_BTO = matmul(x.reshape(lead + (math.prod(in_dims),)),
                       kernel.reshape(math.prod(in_dims), math.prod(features)),
                       _COMPUTE_DTYPE[self.mode])
        y = y_BTO.reshape(lead + features)
        if self.use_bias:
            y = y + self.param("bias", self.bias_init, features, self.param_dtype)
        return y.astype(self.dtype or x.dtype)


def attention_inputs(config, *qkv):
    """Q, K, V as attention's matmuls should take them: bfloat16 in `fast_bf16` mode (scores
    still accumulate and softmax in float32, see attention.py), unchanged otherwise. Used on
    the training path only: a decode step would cast the whole cache every token."""
    if config.matmul != "fast_bf16":
        return qkv
    return tuple(a.astype(jnp.bfloat16) for a in qkv)


def decode_params(config, params):
    """For decoding in `fast_bf16` mode: the dense kernels cast to bfloat16 once, before the
    token loop (each step would otherwise read the float32 weights and write bf16 copies)."""
    if config.matmul != "fast_bf16":
        return params
    return jax.tree_util.tree_map_with_path(
        lambda path, x: x.astype(jnp.bfloat16) if getattr(path[-1], "key", None) == "kernel"
        else x, params)


def factory(config, plain=nn.DenseGeneral) -> Callable[..., nn.Module]:
    """The dense-layer constructor the model should use for `config.matmul`: `plain` (flax's
    nn.Dense or nn.DenseGeneral, unchanged) or this module's DenseGeneral, called alike."""
    if config.matmul == "plain":
        return functools.partial(plain, dtype=config.dtype, param_dtype=config.param_dtype)
    return functools.partial(DenseGeneral, mode=config.matmul, dtype=config.dtype,
                             param_dtype=config.param_dtype)
