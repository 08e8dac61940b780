"""visualize.py: the weights it plots are the model's own, and the CLI writes the images."""

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import checkpoint
from transformer import config as config_lib
from transformer.config import ModelConfig, base_config
from transformer.data import tokenizers
from transformer.model.gpt import init_params, stack_layers
from transformer.parallel import target as target_lib
from transformer.tools.visualize import load_run, look_inside, token_labels

ROOT = Path(__file__).resolve().parents[1]
SMALL = ModelConfig(vocab_size=256, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=32,
                    matmul="plain")  # float32 reference arithmetic, as the NumPy check


@pytest.mark.parametrize("kw", [{}, dict(sliding_window=3, n_kv_heads=2, position="rope",
                                          attention_kernel="jax"),
                                dict(matmul="fast_bf16"), dict(matmul="fast_f32", n_kv_heads=1)])
def test_weights_sum_to_one_over_visible_keys_and_are_zero_on_masked(kw):
    config = dataclasses.replace(SMALL, **kw)
    params = init_params(config, jax.random.key(0))
    tokens = list(range(40, 52))
    weights_LHTT, logits_TV, _ = look_inside(config, params, tokens)
    T = len(tokens)
    assert weights_LHTT.shape == (config.n_layers, config.n_heads, T, T)
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    visible = (j <= i) & ((i - j < config.sliding_window) if config.sliding_window else True)
    np.testing.assert_allclose(weights_LHTT.sum(-1), 1.0, atol=1e-5)
    assert np.all(weights_LHTT[..., ~visible] == 0.0)
    assert np.all(weights_LHTT[..., visible] > 0.0)
    assert logits_TV.shape == (T, config.vocab_size)


def test_scanned_params_give_the_same_maps():
    params = init_params(SMALL, jax.random.key(0))
    scanned = dataclasses.replace(SMALL, scan_layers=True)
    a, _, _ = look_inside(SMALL, params, [1, 2, 3, 4])
    b, _, _ = look_inside(scanned, stack_layers(params, SMALL.n_layers), [1, 2, 3, 4])
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_token_labels_are_printable():
    labels = token_labels(tokenizers.ByteTokenizer(), list(b"a b\n\t\x00"))
    assert all(label and label.isprintable() for label in labels)
    assert labels[:5] == ["a", "␣", "b", "↵", "⇥"]  # whitespace as a visible symbol


def test_a_character_of_several_byte_tokens_is_labelled_once():
    from transformer.tools.visualize import CONTINUED
    byte = tokenizers.ByteTokenizer()
    assert token_labels(byte, byte.encode("中a я")) == ["中", CONTINUED, CONTINUED, "a", "␣", "я",
                                                        CONTINUED]
    char = tokenizers.CharTokenizer("中я a")
    assert token_labels(char, char.encode("中a я")) == ["中", "a", "␣", "я"]
    broken = token_labels(byte, [0xE4, 0x41])  # a lead byte without its continuation
    assert broken[1] == "A" and broken[0] and broken[0].isprintable()


def test_maps_of_chinese_and_russian_draw_without_glyph_warnings(tmp_path, monkeypatch, caplog):
    """With a CJK font on the machine the characters are drawn; without one each is written
    U+XXXX. Either way matplotlib never warns of a missing glyph, and there is a colour bar."""
    import warnings

    from transformer.tools import visualize
    byte = tokenizers.ByteTokenizer()
    labels = token_labels(byte, byte.encode("注意力 внимание\n"))
    weights = np.tril(np.ones((2, len(labels), len(labels)), np.float32))
    weights /= weights.sum(-1, keepdims=True)
    from matplotlib import font_manager
    families, _ = visualize._fonts()
    mono = font_manager.findfont(font_manager.FontProperties(family="monospace"))
    without_cjk = (families[:1], visualize._coverage(mono))
    for fonts in (visualize._fonts(), without_cjk):
        monkeypatch.setattr(visualize, "_fonts", lambda fonts=fonts: fonts)
        if fonts is without_cjk:
            assert visualize.drawable("注意") == "U+6CE8U+610F"
            assert visualize.drawable("внимание ↵␣⇥┄") == "внимание ↵␣⇥┄"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            visualize.plot_layer(weights, labels, "layer 0", tmp_path / "map.png")
        assert not [str(w.message) for w in caught]
        assert not [r.getMessage() for r in caplog.records if r.levelno >= 30]
        assert (tmp_path / "map.png").stat().st_size > 5000


def _fake_run(workdir: Path, max_seq_len: int = 32):
    """A checkpoint as training writes it (untrained params), without running training."""
    c = base_config()
    c.model.update(vocab_size=256, d_model=32, n_layers=2, n_heads=4, d_ff=64,
                   max_seq_len=max_seq_len)
    c.sample.max_new_tokens = 8
    c, _ = target_lib.resolve_matmul(c)  # a run saves the mode it trained in
    model_config = ModelConfig.from_config(c)
    ckpts = checkpoint.Checkpoints(workdir)
    ckpts.save(1, init_params(model_config, jax.random.key(0)),
               {"step": jnp.int32(1), "opt_state": jnp.zeros(2)},
               {"config": config_lib.to_dict(c), "step": 1,
                "tokenizer": tokenizers.ByteTokenizer().to_json()})
    ckpts.wait()
    ckpts.close()
    return model_config


def _run(*args):
    from tests.conftest import fork_run
    return fork_run("-m", "transformer", "visualize", *args, cwd=ROOT, timeout=300)


def test_a_run_is_looked_at_with_the_kernels_it_trained_with(tmp_path):
    config = _fake_run(tmp_path / "run")
    loaded, _, _, step = load_run(tmp_path / "run")
    assert loaded == config and step == 1  # matmul as trained, not swapped for another mode


def test_cli_writes_one_image_per_layer_and_the_next_token_chart(tmp_path):
    config = _fake_run(tmp_path / "run")
    out = tmp_path / "images"
    result = _run(f"--workdir={tmp_path / 'run'}", "--prompt=def f(x):", f"--out={out}")
    assert result.returncode == 0, result.stderr
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted([f"attention_layer{i}.png" for i in range(config.n_layers)]
                           + ["next_token.png"])
    for path in out.iterdir():
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_cli_writes_into_the_run_folder_per_step_by_default(tmp_path):
    _fake_run(tmp_path / "run")
    from tests.conftest import fork_run  # a child of the fork server, run from tmp_path
    result = fork_run("-m", "transformer", "visualize", f"--workdir={tmp_path / 'run'}",
                      "--prompt=ab", cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "run" / "attention" / "step_1" / "attention_layer0.png").is_file()
    assert not (tmp_path / "attention").exists()  # nothing in the current folder


def test_cli_without_checkpoint_is_one_error_line(tmp_path):
    result = _run(f"--workdir={tmp_path}", f"--out={tmp_path / 'x'}")
    assert result.returncode == 2
    assert result.stderr.startswith("error:") and len(result.stderr.strip().splitlines()) == 1


def test_cli_with_an_out_that_cannot_be_a_folder_is_one_error_line(tmp_path):
    _fake_run(tmp_path / "run")
    (tmp_path / "file").write_text("x")
    for out in (tmp_path / "file", tmp_path / "file" / "images"):
        result = _run(f"--workdir={tmp_path / 'run'}", f"--out={out}")
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("error: --out=") and "is a file" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


def test_cli_with_a_prompt_that_is_not_utf8_is_one_error_line(tmp_path):
    """$'\\xed\\xa0\\x80' (a lone surrogate's UTF-8) was a UnicodeEncodeError traceback."""
    _fake_run(tmp_path / "run")
    result = _run(f"--workdir={tmp_path / 'run'}", "--prompt=a\udced\udca0\udc80",
                  f"--out={tmp_path / 'x'}")
    assert result.returncode == 2, result.stderr[-500:]
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: --prompt holds bytes that are not UTF-8 text")
    assert not (tmp_path / "x").exists()


def test_next_token_candidates_that_are_parts_of_a_character_look_different():
    from transformer.data import tokenizers
    tokenizer = tokenizers.ByteTokenizer()
    ids = [0xD0, 0xD1, ord("a"), ord("\n")]  # the first bytes of two Cyrillic letters
    from transformer.tools import visualize
    labels = visualize.next_token_labels(tokenizer, ids)
    assert len(set(labels)) == 4 and "\ufffd" not in "".join(labels)
    assert labels[2:] == ["a", "↵"]
