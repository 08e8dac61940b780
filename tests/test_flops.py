"""Parameter and FLOP arithmetic (flops.py) against the real model and against hand counts."""

import json
from pathlib import Path

import jax
import pytest

from transformer.config import ModelConfig
from transformer.model import flops, sizes
from transformer.model.gpt import count_params, init_params

ROOT = Path(__file__).resolve().parents[1]

SMALL = ModelConfig(vocab_size=256, d_model=64, n_layers=2, n_heads=4, d_ff=256, max_seq_len=64)


@pytest.mark.parametrize("config", [
    SMALL,
    ModelConfig(vocab_size=100, d_model=48, n_layers=3, n_heads=2, d_ff=80, max_seq_len=20,
                tie_embeddings=False),
    ModelConfig(vocab_size=300, d_model=32, n_layers=4, n_heads=8, d_ff=128, max_seq_len=16,
                scan_layers=True),
    ModelConfig(vocab_size=50, d_model=16, n_layers=1, n_heads=1, d_ff=16, max_seq_len=8,
                tie_embeddings=False, scan_layers=True, remat="block"),
    ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=96, max_seq_len=16,
                position="rope", norm="rmsnorm", mlp="swiglu", n_kv_heads=2),
    ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=16,
                norm_placement="post", mlp="relu", n_kv_heads=1, tie_embeddings=False),
    ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=16,
                position="rope", norm="rmsnorm", mlp="relu2", qk_norm=True, bias=False,
                tie_embeddings=False, n_kv_heads=2),
    ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=96, max_seq_len=16,
                mlp="swiglu", qk_norm=True, bias=False, scan_layers=True),
], ids=["tied", "untied", "scanned", "untied-scanned-remat", "rope-rms-swiglu-gqa",
        "post-relu-mqa-untied", "qknorm-relu2-nobias", "layernorm-nobias-qknorm-swiglu"])
def test_counts_equal_the_initialised_parameters(config):
    real = count_params(init_params(config, jax.random.key(0)))
    assert flops.param_counts(config)["total"] == real
    assert sizes.real_param_count(config) == real  # eval_shape: same count, no memory


def test_components_by_hand_for_a_small_config():
    # V=256, D=64, L=2, H=4 (K=16), F=256, T=64, tied.
    c = flops.param_counts(SMALL)
    assert c["token_embedding"] == 256 * 64 and c["position_embedding"] == 64 * 64
    assert c["attention_q"] == c["attention_o"] == 2 * (64 * 64 + 64)
    assert c["mlp"] == 2 * (64 * 256 + 256 + 256 * 64 + 64)
    assert c["norms"] == 2 * 4 * 64 + 2 * 64 and c["head"] == 0
    assert c["non_embedding"] == c["total"] - 256 * 64 - 64 * 64 == 100_096


def test_flops_by_hand_for_a_small_config():
    # Matmul weights: per block 4·D² (Q, K, V, O) + 2·D·F; plus the V·D head.
    weights = 2 * (4 * 64 * 64 + 2 * 64 * 256) + 256 * 64
    assert flops.matmul_weights(SMALL) == weights == 114_688
    # Causal attention: L · 2 matmuls · 2 FLOPs · D · (T+1)/2 average keys.
    attention = 2 * 2 * 2 * 64 * 65 / 2
    assert flops.attention_flops_per_token(SMALL) == attention == 16_640
    assert flops.forward_flops_per_token(SMALL) == 2 * weights + attention
    assert flops.train_flops_per_token(SMALL) == 6 * weights + 3 * attention == 738_048
    # A full (non-causal) count would be 2·L·2·D·T; we count the triangle, about half.
    assert attention < 2 * 2 * 2 * 64 * 64


def test_kv_cache_and_activation_bytes():
    assert flops.kv_cache_bytes_per_token(SMALL) == 2 * 2 * 4 * 16 * 4  # K,V × L × H × K × f32
    assert flops.kv_cache_bytes_per_token(SMALL, "bfloat16") == 2 * 2 * 4 * 16 * 2
    assert flops.kv_cache_bytes(SMALL, batch=3) == 3 * 64 * flops.kv_cache_bytes_per_token(SMALL)
    full = flops.activation_bytes(SMALL, batch=8)
    assert 0 < flops.activation_bytes(SMALL, batch=8, remat="block") < full
    assert flops.activation_bytes(SMALL, batch=16) == pytest.approx(2 * full)


def test_gpt3_175b_from_the_command_line():
    from tests.conftest import fork_run
    out = fork_run("-m", "transformer", "sizes", "--config=configs/gpt3_175b.py", "--json",
                   cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert abs(report["params_total"] / 175e9 - 1) < 0.01
    assert report["params_non_embedding"] < report["params_total"]
    # 6N dominates: the attention term at context 2048 adds about 1.4%.
    assert 1.0 < report["train_flops_per_token"] / (6 * report["params_total"]) < 1.03
    # K and V: 2 × 96 layers × 12288 × 2 bytes (bfloat16) per token.
    assert report["kv_cache_bytes_per_token"] == 2 * 96 * 12288 * 2


def test_sizes_text_and_errors():
    from tests.conftest import fork_run
    text = fork_run("-m", "transformer", "sizes", "--config=configs/tiny.py", cwd=ROOT,
                    timeout=300)
    assert text.returncode == 0 and "non-embedding" in text.stdout and "KV cache" in text.stdout
    missing = fork_run("-m", "transformer", "sizes", cwd=ROOT, timeout=300)
    assert missing.returncode == 2 and missing.stderr.startswith("error: --config")


@pytest.mark.parametrize("batch", ["0", "-3"])
def test_sizes_refuses_a_batch_that_is_not_positive(batch):
    # --batch=0 is no batch at all: refused, not read as "the config's batch size"
    from tests.conftest import fork_run
    result = fork_run("-m", "transformer", "sizes", "--config=configs/tiny.py",
                      f"--batch={batch}", cwd=ROOT, timeout=300)
    assert result.returncode == 2, result.stdout
    assert result.stderr.startswith(f"error: --batch={batch}")
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("mlp,kv_heads", [("gelu", 0), ("swiglu", 2)])
def test_remat_dots_keeps_the_projection_outputs_jax_saves(mlp, kv_heads):
    """remat=dots keeps, per layer and token, the outputs of Q (H·K), K and V (G·K each),
    W_O (D) and the MLP's expansion (F; SwiGLU: gate too) on top of what remat=block keeps:
    a hand count, and the bytes JAX itself saves for the backward pass (when its
    saved_residuals is importable)."""
    import dataclasses

    import jax.numpy as jnp
    import numpy as np

    from transformer.model.gpt import GPT
    base = ModelConfig(vocab_size=256, d_model=64, n_layers=2, n_heads=4, d_ff=256,
                       max_seq_len=64, matmul="plain", mlp=mlp, n_kv_heads=kv_heads)
    F = base.mlp_hidden
    per_token = 4 * 16 + 2 * base.kv_heads * 16 + 64 + (2 if mlp == "swiglu" else 1) * F
    extra = {r: flops.activation_bytes(base, 8, remat=r) for r in ("block", "dots")}
    assert extra["dots"] - extra["block"] == 2 * 8 * 64 * per_token * 4  # L·B·T·kept·f32
    try:
        from jax._src.ad_checkpoint import saved_residuals
    except ImportError:
        return
    params, tokens = init_params(base, jax.random.key(0)), jnp.zeros((8, 64), jnp.int32)
    saved = {}
    for remat in ("block", "dots"):
        c = dataclasses.replace(base, remat=remat)
        res = saved_residuals(lambda p, c=c: GPT(c).apply({"params": p}, tokens).sum(), params)
        saved[remat] = sum(int(np.prod(a.shape)) * a.dtype.itemsize for a, _ in res)
    assert saved["dots"] - saved["block"] == extra["dots"] - extra["block"]


def test_remat_recompute_flops_are_what_the_policy_repeats():
    """block: every block's forward again (not the head); dots: attention's score matmuls
    only; none: nothing. MFU leaves these out; compile's roofline spends them."""
    import dataclasses

    from transformer.config import ModelConfig
    from transformer.model import flops
    c = ModelConfig(vocab_size=512, d_model=64, n_layers=3, n_heads=4, d_ff=256, max_seq_len=32)
    assert flops.recompute_flops_per_token(dataclasses.replace(c, remat="none")) == 0
    dots = dataclasses.replace(c, remat="dots")
    assert flops.recompute_flops_per_token(dots) == flops.attention_flops_per_token(dots)
    block = dataclasses.replace(c, remat="block")
    assert flops.recompute_flops_per_token(block) == pytest.approx(
        flops.forward_flops_per_token(block) - 2 * 512 * 64)
