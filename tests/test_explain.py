"""explain.py: its numbers are the project's attention, and they match NumPy's arithmetic."""

import dataclasses
from pathlib import Path

import jax
import numpy as np
import pytest

from transformer.config import ModelConfig
from transformer.model.gpt import init_params
from transformer.tools import explain

ROOT = Path(__file__).resolve().parents[1]
SMALL = ModelConfig(vocab_size=256, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=32,
                    matmul="plain")  # float32 reference arithmetic, as the NumPy check


@pytest.mark.parametrize("kw,layer,head", [
    ({}, 0, 0),
    (dict(position="rope", n_kv_heads=2, sliding_window=3, norm_placement="post"), 1, 3),
    (dict(matmul="fast_bf16"), 1, 2),  # the CPU default: bf16 matmul inputs
    (dict(matmul="fast_f32", n_kv_heads=1), 0, 1),
])
def test_project_attention_matches_numpy(kw, layer, head):
    config = dataclasses.replace(SMALL, **kw)
    params = init_params(config, jax.random.key(0))
    ref, ours = explain.explain(config, params, list(b"hello!"), layer, head)
    assert explain.max_difference(ref, ours) < explain.TOLERANCE
    np.testing.assert_allclose(ref["weights"].sum(1), 1.0)
    np.testing.assert_allclose(ref["scaled"], ref["scores"] / np.sqrt(config.head_dim))
    assert np.isneginf(ref["masked"][0, 1:]).all()


def test_the_check_sees_the_compute_dtype_the_model_ran():
    """Under fast_bf16 the model's own weights come from bf16-rounded Q and K: NumPy without
    that rounding disagrees beyond the tolerance, so the check looks at the trained path."""
    config = dataclasses.replace(SMALL, matmul="fast_bf16")
    params = init_params(config, jax.random.key(0))
    ref, ours = explain.explain(config, params, list(b"hello!"), 1, 2)
    sown = explain.look_inside(config, params, list(b"hello!"))[2][1]
    unrounded = explain.numpy_steps(sown["queries"][2], sown["keys"][2], sown["values"][2])
    assert explain.max_difference(ref, ours) < explain.TOLERANCE
    assert explain.max_difference(unrounded, ours) > explain.TOLERANCE


def test_numpy_steps_against_hand_computed_numbers():
    """Two positions, d_k = 4: the second query sees both keys with softmax([0, 1]) weights."""
    q = np.array([[0.0, 0, 0, 0], [2.0, 0, 0, 0]])
    k = np.array([[0.0, 0, 0, 0], [1.0, 0, 0, 0]])
    v = np.array([[1.0, 0, 0, 0], [0.0, 1, 0, 0]])
    ref = explain.numpy_steps(q, k, v)
    w = np.exp(1.0) / (1 + np.exp(1.0))  # scaled score 2·1/√4 = 1
    np.testing.assert_allclose(ref["weights"], [[1, 0], [1 - w, w]])
    np.testing.assert_allclose(ref["out"][1], [1 - w, w, 0, 0])
    ours = explain.project_steps(q.astype(np.float32), k.astype(np.float32),
                                 v.astype(np.float32))
    np.testing.assert_allclose(ours["weights"], ref["weights"], atol=1e-6)


def test_cli_prints_every_step_and_the_check():
    from tests.conftest import fork_run
    result = fork_run("-m", "transformer", "explain", "--text=abc", "--head=2", cwd=ROOT,
                      timeout=300)
    assert result.returncode == 0, result.stderr
    for step in ("1. Q", "2. K", "3. V", "4. scores", "5. scaled", "6. causal mask",
                 "7. weights", "8. output", "max |difference|"):
        assert step in result.stdout
    diff = float(result.stdout.split("max |difference| = ")[1].split()[0])
    assert diff < explain.TOLERANCE


def test_cli_refuses_a_long_text():
    from tests.conftest import fork_run
    result = fork_run("-m", "transformer", "explain", "--text=" + "x" * 40, cwd=ROOT, timeout=300)
    assert result.returncode == 2 and result.stderr.startswith("error:")


def test_a_text_longer_than_the_context_is_refused_not_printed_as_nan(tmp_path):
    # A run whose context (8) is shorter than the text (12 tokens, within explain's 16):
    # past the context a learned position has no row, every number would be NaN.
    from tests.conftest import fork_run
    from tests.test_visualize import _fake_run
    _fake_run(tmp_path / "run", max_seq_len=8)
    result = fork_run("-m", "transformer", "explain", f"--workdir={tmp_path / 'run'}",
                      "--text=hello world!", cwd=ROOT, timeout=300)
    assert result.returncode == 2, result.stdout[-500:]
    assert result.stderr.startswith("error:") and len(result.stderr.strip().splitlines()) == 1
    assert "nan" not in result.stdout


def test_look_inside_refuses_tokens_past_the_context():
    from transformer.generate.decode import PromptError
    from transformer.generate.inside import look_inside
    config = dataclasses.replace(SMALL, max_seq_len=8)
    with pytest.raises(PromptError):
        look_inside(config, init_params(config, jax.random.key(0)), list(range(9)))


def test_a_nan_anywhere_fails_the_check():
    ref = {"weights": np.eye(2), "out": np.eye(2)}
    ours = {"weights": np.eye(2), "model_weights": np.eye(2), "out": np.full((2, 2), np.nan)}
    assert not explain.agrees(ref, ours)
    assert explain.agrees(ref, {**ours, "out": np.eye(2)})


@pytest.mark.parametrize("dims", ["0", "-2"])
def test_cli_refuses_dims_below_one(dims):
    # -2 printed 6 of 8 dimensions headed "dims 0..-3"; 0 printed empty tables
    from tests.conftest import fork_run
    result = fork_run("-m", "transformer", "explain", "--text=ab", f"--dims={dims}", cwd=ROOT,
                      timeout=300)
    assert result.returncode == 2 and result.stderr.startswith(f"error: --dims={dims}")
    assert len(result.stderr.strip().splitlines()) == 1


def test_cli_refuses_a_text_that_is_not_utf8():
    # $'ab\xff' reaches Python as a surrogate: the byte tokenizer's UnicodeEncodeError traceback
    from tests.conftest import fork_run
    result = fork_run("-m", "transformer", "explain", "--text=ab\udcff", cwd=ROOT, timeout=300)
    assert result.returncode == 2, result.stderr[-500:]
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: --text holds bytes that are not UTF-8 text (b'\\xff'")
