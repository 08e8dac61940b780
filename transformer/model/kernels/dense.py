"""A dense layer with a hand-written backward pass: the CPU fast path's matmuls.

    y  = x W + b                    forward: one matmul, float32 accumulation
    dx = dy W^T                     backward, written out by hand (jax.custom_vjp)
    dW = X^T dy                     bf16: X^T materialised as x.transpose(..).reshape(I, N)

Why: left to autodiff, XLA-CPU folds the transposes of the backward into `a.T @ b` dots. In
bfloat16 those run ~3-5x slower than `a @ b`, so the bf16 backward keeps an explicitly
laid-out X^T. In float32 the folded dot is almost as fast and the explicit transpose is not
(XLA fused the GELU into it), so the float32 backward lets XLA fold (docs/performance.md).
On GPU/TPU autodiff is already fast and the seam (kernels/__init__.py) picks flax's own
layers there.

`DenseGeneral` has flax's parameter names, shapes and initialisers, so a checkpoint trained
with it loads into `flax.linen.DenseGeneral` and back.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def matmul(x_BTI, w_IO, compute_dtype):
    """x_BTI @ w_IO (any number of leading dims) with inputs cast to compute_dtype (a name) and a
    float32 result."""
    return jnp.dot(x_BTI.astype(compute_dtype), w_IO.astype(compute_dtype),
                   preferred_element_type=jnp.float32)


def _matmul_fwd(x_BTI, w_IO, compute_dtype):
    x_c, w_c = x_BTI.astype(compute_dtype), w_IO.astype(compute_dtype)
    y_BTO = jnp.dot(x_c, w_c, preferred_element_type=jnp.float32)
    if compute_dtype == "bfloat16":
        # Keep X^T [I, B*T] for the weight gradient, transposed before the reshape: XLA folds
        # a plain `.T` into the dot (the slow `a.T @ b` kernel) but not a transpose+reshape.
        x_saved = jnp.moveaxis(x_c, -1, 0).reshape(x_c.shape[-1], -1)
    else:
        # In float32 the folded dot is nearly as fast, and the explicit transpose is not
        # cheap: XLA fused the GELU into it, and it cost more than the fold it avoided.
        x_saved = x_c.reshape(-1, x_c.shape[-1])
    # Residuals must be arrays: empty ones carry the primal dtypes to the backward pass.
    return y_BTO, (x_saved, w_c, jnp.empty((0,), x_BTI.dtype), jnp.empty((0,), w_IO.dtype))


def _matmul_bwd(compute_dtype, residuals, dy_BTO):
    x_saved, w_c, x_tag, w_tag = residuals
    dy_c = dy_BTO.astype(compute_dtype)
    dy_NO = dy_c.reshape(-1, dy_c.shape[-1])
    if compute_dtype == "bfloat16":
        dx_BTI = jnp.dot(dy_c, transposed(w_c), preferred_element_type=jnp.float32)
        dw_IO = jnp.dot(x_saved, dy_NO, preferred_element_type=jnp.float32)  # X^T [I, N] @ dy
    else:
        dx_BTI = jnp.dot(dy_c, w_c.T, preferred_element_type=jnp.float32)
        dw_IO = jax.lax.dot_general(x_saved, dy_NO, (((0,), (0,)), ((), ())),
                                    preferred_element_type=jnp.float32)  # X [N, I] . dy over N
    return dx_BTI.astype(x_tag.dtype), dw_IO.astype(w_tag.dtype)


matmul.defvjp(_matmul_fwd, _matmul_bwd)


def transposed(w_IO):
    """W^T as an array of its own. `dy @ w.T` gets folded into a dot that reads W transposed,
    which in bfloat16 ran several times slower than this layout (docs/performance.md); a
    transpose between two reshapes is not folded. An odd O cannot be split so: there the
    barrier keeps the `.T` out of the dot; folded, a bfloat16 dot with a float32 result is
    one XLA-CPU's DotThunk cannot run at all (a tied head at an odd d_model crashed)."""
    I, O = w_IO.shape
    if O % 2:
        return jax.lax.optimization_barrier(w_IO.T)
    return w_IO.reshape(I, 2, O // 2).transpose(1, 2, 0).reshape(O, I)


class DenseGeneral(nn.Module):
    """`nn.DenseGeneral` over the trailing `axis` dims, computed by `matmul` above.

    Same parameter names, shapes and initialisers as flax's DenseGeneral (kernel
    [*in_dims, *features], bias [*features]), so both layers share checkpoints.
    """

    features: int | tuple[int, ...]
    axis: int | tuple[int, ...] = -1
    use_bias: bool = True
    compute_dtype: str = "float32"  # the matmul's input dtype; it accumulates in float32
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
            raise ValueError(f"kernels.dense.DenseGeneral contracts trailing axes only, got {axes}")
        in_dims = x.shape[-n_in:]
        kernel = self.param("kernel", self.kernel_init, in_dims + features, self.param_dtype)
        lead = x.shape[:-n_in]
        y_BTO = matmul(x.reshape(lead + (math.prod(in_dims),)),
                       kernel.reshape(math.prod(in_dims), math.prod(features)),
                       self.compute_dtype)
        y = y_BTO.reshape(lead + features)
        if self.use_bias:
            y = y + self.param("bias", self.bias_init, features, self.param_dtype)
        return y.astype(self.dtype or x.dtype)
