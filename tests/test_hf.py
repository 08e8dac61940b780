"""Hugging Face interchange: exported runs compute in `transformers` what they compute here,
imported GPT-2s compute here what they compute in `transformers`, and what cannot map is
refused in one line with nothing written. Everything stays offline (local folders only)."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # from_pretrained on a local path; never the network

import dataclasses
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import run_cli, train_quietly

from transformer import checkpoint
from transformer import config as config_lib
from transformer.config import ModelConfig
from transformer.data import tokenizers
from transformer.generate import decode
from transformer.hf import export
from transformer.hf import load as hf_import
from transformer.hf import mapping as hf
from transformer.hf import weights as hf_weights
from transformer.model.gpt import GPT, init_params, unstack_layers
from transformer.train import start
from transformer.train import trainer as training

# torch and transformers (~3.6 s to import) come in the functions that use them: every pytest
# process collects this module (both xdist workers, device_check's), one runs it.
TOL = 1e-4
# matmul=plain: float32 arithmetic, compared with transformers to 1e-4
# GPT-2's block spelled out (GPT2_BLOCK), so that these tests keep meaning GPT-2 whatever the
# field defaults and configs/default.py become; variants override it.
BASE = dict(vocab_size=256, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=128,
            matmul="plain", **config_lib.GPT2_BLOCK)
LLAMA = dict(position="rope", norm="rmsnorm", mlp="swiglu")
CLASSES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}
VARIANTS = {
    "gpt2_tied": {},
    "gpt2_untied": dict(tie_embeddings=False),
    "gpt2_relu": dict(mlp="relu"),
    "gpt2_scanned": dict(scan_layers=True),
    "llama_gqa_untied": dict(position="rope", norm="rmsnorm", mlp="swiglu", n_kv_heads=2,
                             tie_embeddings=False),
    "llama_tied": dict(position="rope", norm="rmsnorm", mlp="swiglu"),
    "llama_nobias": dict(**LLAMA, bias=False),
    "qwen3_qknorm_gqa_untied": dict(**LLAMA, qk_norm=True, bias=False, n_kv_heads=2,
                                    tie_embeddings=False),
    "qwen3_qknorm_tied_scanned": dict(**LLAMA, qk_norm=True, bias=False, scan_layers=True),
}


def model_config(**fields):
    return ModelConfig(**{**BASE, **fields})


def random_params(mc, seed=0, scale=0.3):
    """Init params with every leaf moved by noise: biases and norm gains away from 0 and 1,
    so a bias or gain mapped to the wrong place cannot hide."""
    params = init_params(mc, jax.random.key(seed))
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    return jax.tree.unflatten(tree, [x + scale * jax.random.normal(k, x.shape) / (
        x.shape[-1] ** 0.5 if x.ndim > 1 else 3) for x, k in zip(leaves, keys)])


def our_logits(mc, params, tokens):
    forward = jax.jit(lambda p, x: GPT(mc).apply({"params": p}, x))  # one program, not each op
    return np.asarray(forward(params, jnp.asarray(tokens)))


def need_torch():
    """torch, or this test skipped: the test extra installs it on Python 3.11 only (its Linux
    wheels on PyPI are CUDA builds; docs/testing.md)."""
    return pytest.importorskip("torch", reason="torch is not installed (the test extra has it "
                               "on Python 3.11 only: docs/testing.md)")


def hf_model(path):
    """transformers' model of the folder at `path` (PyTorch: skipped without torch)."""
    need_torch()
    import transformers
    return transformers.AutoModelForCausalLM.from_pretrained(path)


def hf_logits(model, tokens):
    torch = need_torch()
    with torch.no_grad():
        return model(torch.tensor(np.asarray(tokens), dtype=torch.long)).logits.numpy()


def tokens(mc, T=40, B=2, seed=0):
    return np.random.default_rng(seed).integers(0, mc.vocab_size, (B, T))


# One variant for each class transformers loads, and scanned layers, in the default run; the
# other five with -m slow.
EXPORT_DEFAULT_RUN = ("gpt2_tied", "gpt2_scanned", "llama_gqa_untied", "qwen3_qknorm_gqa_untied")


@pytest.mark.parametrize("name", [n if n in EXPORT_DEFAULT_RUN else
                                  pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(VARIANTS)])
def test_export_loads_in_transformers_with_equal_logits(name, tmp_path):
    mc = model_config(**VARIANTS[name])
    params = random_params(mc)
    out = export.write_folder(mc, params, tokenizers.ByteTokenizer(), tmp_path / "hf")
    model = hf_model(out).eval()
    assert type(model).__name__ == CLASSES[name.split("_")[0]]
    x = tokens(mc)
    np.testing.assert_allclose(hf_logits(model, x), our_logits(mc, params, x), atol=TOL, rtol=0)
    # ... and importing the export gives back exactly the parameters that went in.
    mc_back, params_back, _ = hf_import.load_pretrained(out)
    assert mc_back.mlp_hidden == mc.mlp_hidden  # swiglu's d_ff is known only through it
    assert dataclasses.replace(mc_back, d_ff=mc.d_ff) == dataclasses.replace(mc, scan_layers=False)
    params = unstack_layers(params, mc.n_layers)
    assert jax.tree.structure(params_back) == jax.tree.structure(params)
    for leaf, back in zip(jax.tree.leaves(params), jax.tree.leaves(params_back)):
        np.testing.assert_array_equal(back, np.asarray(leaf))


def hf_gpt2(tmp_path, tie=True, seed=0):
    """A random GPT2LMHeadModel saved locally, with its biases and norm gains randomised."""
    torch = need_torch()
    import transformers
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=320, n_embd=32, n_layer=2, n_head=4, n_inner=48,
                                  n_positions=64, tie_word_embeddings=tie, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(0.3 * torch.randn_like(p))
    model.save_pretrained(tmp_path / "gpt2")
    return model, tmp_path / "gpt2"


@pytest.mark.parametrize("tie", [True, False])
def test_imported_gpt2_gives_hf_logits(tie, tmp_path):
    model, folder = hf_gpt2(tmp_path, tie)
    mc, params, tok = hf_import.load_pretrained(folder)
    assert (mc.vocab_size, mc.d_ff, mc.tie_embeddings) == (320, 48, tie)
    x = tokens(mc, T=64)
    np.testing.assert_allclose(our_logits(mc, params, x), hf_logits(model, x), atol=TOL, rtol=0)


def test_greedy_sample_equals_hf_generate(tmp_path):
    """sample.py --hf (temperature 0) and HF generate(do_sample=False): the same 100 tokens."""
    torch = need_torch()
    mc = model_config()
    out = export.write_folder(mc, random_params(mc, scale=1.0), tokenizers.ByteTokenizer(),
                              tmp_path / "hf")
    prompt = "def main():"
    model = hf_model(out).eval()
    with torch.no_grad():
        ids = model.generate(torch.tensor([list(prompt.encode())]), do_sample=False,
                             max_new_tokens=100, min_new_tokens=100, pad_token_id=0)
    theirs = ids[0, len(prompt):].tolist()
    mc2, params, tok = hf_import.load_pretrained(out)
    ours = decode.generate(mc2, params, [tok.encode(prompt)], max_new_tokens=100,
                           temperature=0.0)[0]
    assert ours == theirs
    result = run_cli("sample.py", f"--hf={out}", f"--prompt={prompt}", "--temperature=0",
                     "--max_new_tokens=100")
    assert result.returncode == 0, result.stderr
    assert tokenizers.ByteTokenizer().decode(theirs) in result.stdout


@pytest.mark.parametrize("kind", ["byte", "char", "bpe"])
def test_exported_tokenizer_encodes_like_ours(kind, tmp_path):
    import transformers
    text = "def f(x):\n    return x  # héllo, 世界\n" * 20
    tok = tokenizers.build(kind, text, 300)
    mc = model_config(vocab_size=max(256, tok.vocab_size))
    out = export.write_folder(mc, init_params(mc, jax.random.key(0)), tok, tmp_path / "hf")
    theirs = transformers.AutoTokenizer.from_pretrained(out)
    sample = "return f(x)  # 世界\n"
    assert theirs.encode(sample) == tok.encode(sample)
    assert theirs.decode(tok.encode(sample)) == sample


def test_an_exported_char_tokenizer_refuses_a_character_it_never_saw(tmp_path):
    """Ours refuses a character outside a char run's vocabulary (naming it); the exported
    tokenizer must not drop it silently (ids whose text is not the text given): it refuses
    too, and still encodes every known character as ours does."""
    import transformers
    char = tokenizers.CharTokenizer.from_text("abc\n", eot=True)
    mc = model_config(vocab_size=256)
    out = export.write_folder(mc, init_params(mc, jax.random.key(0)), char, tmp_path / "c")
    theirs = transformers.AutoTokenizer.from_pretrained(out)
    assert theirs.encode("cab\n") == char.encode("cab\n")
    with pytest.raises(tokenizers.TokenizerError, match="'x' is not in"):
        char.encode("abxc")
    with pytest.raises(Exception, match="not found in the vocabulary"):
        theirs.encode("abxc")
    assert hf_import.tokenizer(out).to_json() == char.to_json()  # still read back as char


@pytest.mark.parametrize("kind", ["byte", "char", "bpe"])
def test_exported_tokenizer_reads_the_end_of_text_spelled_in_text_as_text(kind, tmp_path):
    """Ours never parses <|endoftext|> from text (each document's end is placed): the
    exported tokenizer encodes those 13 characters as ours does, not as the end token."""
    import transformers
    text = "def f(x):\n    return x  # <|endoftext|> héllo\n" * 20
    tok = {"byte": lambda: tokenizers.ByteTokenizer(eot=True),
           "char": lambda: tokenizers.CharTokenizer.from_text(text, eot=True),
           "bpe": lambda: tokenizers.BPETokenizer.train(text, 300, eot=True)}[kind]()
    assert tok.eot is not None
    mc = model_config(vocab_size=max(257, tok.vocab_size))
    out = export.write_folder(mc, init_params(mc, jax.random.key(0)), tok, tmp_path / "hf")
    theirs = transformers.AutoTokenizer.from_pretrained(out)
    sample = "x<|endoftext|>return f(x)\n"
    assert tok.eot not in tok.encode(sample)
    assert theirs.encode(sample) == tok.encode(sample)
    assert theirs.eos_token_id == tok.eot  # still generate's end


def test_an_exported_bpe_adds_no_bos_its_template_would_as_ours_adds_none(tmp_path):
    """A corpus prepared with a tokenizer.json whose post-processor adds a BOS (Llama 3's
    does) was trained without it (docs/data.md): the export encodes as training did."""
    import transformers
    from tokenizers import processors
    text = "def f(x):\n    return x  # héllo\n" * 20
    hf_tok = tokenizers.BPETokenizer.train(text, 300, eot=True).hf_tokenizer()
    hf_tok.add_special_tokens(["<|bos|>"])
    bos = hf_tok.token_to_id("<|bos|>")
    hf_tok.post_processor = processors.TemplateProcessing(single="<|bos|> $A",
                                                          special_tokens=[("<|bos|>", bos)])
    tok = tokenizers.BPETokenizer(hf_tok)
    mc = model_config(vocab_size=tok.vocab_size)
    out = export.write_folder(mc, init_params(mc, jax.random.key(0)), tok, tmp_path / "hf")
    theirs = transformers.AutoTokenizer.from_pretrained(out)
    sample = "return f(x)  # héllo\n"
    assert bos not in tok.encode(sample)
    assert theirs.encode(sample) == tok.encode(sample)
    assert theirs.decode(tok.encode(sample)) == sample


def test_an_exported_end_of_text_token_ends_hf_generation_where_ours_ends(tmp_path):
    """A model trained with end-of-text tokens exports them as eos: transformers' generate
    stops at the same token our sampler stops at, and its tokenizer names it."""
    import transformers
    tok = tokenizers.ByteTokenizer(eot=True)
    mc = model_config(vocab_size=257)
    out = export.write_folder(mc, init_params(mc, jax.random.key(0)), tok, tmp_path / "hf")
    assert transformers.AutoConfig.from_pretrained(out).eos_token_id == tok.eot == 256
    model = hf_model(out)
    assert model.generation_config.eos_token_id == 256
    theirs = transformers.AutoTokenizer.from_pretrained(out)
    assert theirs.eos_token == tokenizers.EOT and theirs.eos_token_id == 256
    assert hf_import.load_pretrained(out)[2].eot == 256  # sample.py --hf stops there too
    char = tokenizers.CharTokenizer.from_text("abc\n", eot=True)
    out = export.write_folder(mc, init_params(mc, jax.random.key(0)), char, tmp_path / "c")
    back = hf_import.load_pretrained(out)[2]
    assert (back.kind, back.eot, back.chars) == ("char", 4, char.chars)


def save_run(workdir, config, params):
    config_lib.validate(config)
    ckpts = checkpoint.Checkpoints(workdir)
    ckpts.save(1, params, {"step": jnp.int32(1)},
               {"config": config_lib.to_dict(config),
                "tokenizer": tokenizers.ByteTokenizer().to_json(), "step": 1})
    ckpts.wait()
    ckpts.close()


def run_config(**model):
    config = config_lib.base_config()
    config.model.update(**{**BASE, **model})  # BASE has matmul=plain: float32, HF's numbers
    return config


def test_export_cli_writes_a_loadable_folder(tmp_path):
    config = run_config()
    mc = ModelConfig.from_config(config)
    params = random_params(mc)
    save_run(tmp_path / "run", config, params)
    result = run_cli("-m", "transformer", "export", f"--workdir={tmp_path / 'run'}",
                     f"--out={tmp_path / 'hf'}")
    assert result.returncode == 0, result.stderr
    model = hf_model(tmp_path / "hf").eval()
    x = tokens(mc)
    np.testing.assert_allclose(hf_logits(model, x), our_logits(mc, params, x), atol=TOL, rtol=0)


def test_export_cli_refuses_unsupported_variant_writing_nothing(tmp_path):
    config = run_config(norm_placement="post")
    save_run(tmp_path / "run", config, random_params(ModelConfig.from_config(config)))
    result = run_cli("-m", "transformer", "export", f"--workdir={tmp_path / 'run'}",
                     f"--out={tmp_path / 'hf' / 'x'}")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "model.norm_placement" in result.stderr
    assert not (tmp_path / "hf").exists()


def test_export_of_a_run_whose_newest_checkpoint_is_damaged_uses_the_one_before(tmp_path):
    """As sample.py does: a damaged newest checkpoint (here its meta, which export reads
    first to refuse an unsupported model) is skipped with a warning, never a traceback;
    asked for by --step, it is one error line and nothing is written."""
    config = run_config()
    mc = ModelConfig.from_config(config)
    params = {1: random_params(mc, seed=1), 2: random_params(mc, seed=2)}
    ckpts = checkpoint.Checkpoints(tmp_path / "run")
    for step in (1, 2):
        ckpts.save(step, params[step], {"step": jnp.int32(step)},
                   {"config": config_lib.to_dict(config),
                    "tokenizer": tokenizers.ByteTokenizer().to_json(), "step": step})
    ckpts.wait()
    ckpts.close()
    (checkpoint.directory(tmp_path / "run") / "2" / "meta" / "metadata").write_text("{cut")
    result = run_cli("-m", "transformer", "export", f"--workdir={tmp_path / 'run'}",
                     f"--out={tmp_path / 'hf'}")
    assert result.returncode == 0, result.stderr
    assert "checkpoint 2" in result.stderr and "Traceback" not in result.stderr
    model = hf_model(tmp_path / "hf").eval()
    x = tokens(mc)
    np.testing.assert_allclose(hf_logits(model, x), our_logits(mc, params[1], x), atol=TOL,
                               rtol=0)
    result = run_cli("-m", "transformer", "export", f"--workdir={tmp_path / 'run'}",
                     f"--out={tmp_path / 'hf2'}", "--step=2")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().count("\n") == 0 and "step 2" in result.stderr
    assert not (tmp_path / "hf2").exists()


def test_export_to_a_path_that_cannot_be_a_folder_is_one_line(tmp_path):
    config = run_config()
    save_run(tmp_path / "run", config, random_params(ModelConfig.from_config(config)))
    (tmp_path / "file").write_text("x")
    result = run_cli("-m", "transformer", "export", f"--workdir={tmp_path / 'run'}",
                     f"--out={tmp_path / 'file' / 'hf'}")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().count("\n") == 0 and "--out=" in result.stderr
    assert "is a file" in result.stderr


@pytest.mark.parametrize("field, value", [("norm", "rmsnorm"), ("mlp", "swiglu"),
                                          ("n_kv_heads", 2), ("sliding_window", 16),
                                          ("mlp", "relu2"), ("logit_softcap", 15.0),
                                          ("qk_norm", True)])
def test_unsupported_variants_name_the_field(field, value, tmp_path):
    mc = ModelConfig(**{**BASE, field: value})
    with pytest.raises(hf.HFError, match=f"model.{field}="):
        export.write_folder(mc, init_params(mc, jax.random.key(0)), tokenizers.ByteTokenizer(),
                            tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_init_from_starts_training_from_the_hf_weights(tmp_path):
    model, folder = hf_gpt2(tmp_path, tie=False)
    config = config_lib.base_config()
    config.model.update(**{**config_lib.GPT2_BLOCK, "tie_embeddings": False})
    config.model.update(vocab_size=0, d_model=32, n_layers=2, n_heads=4, d_ff=48, max_seq_len=64,
                        scan_layers=True, matmul="plain")
    config.data.update(corpus="random")
    config.sample.max_new_tokens = 40
    config.train.update(init_from=str(folder), steps=1, batch_size=2, lr=1e-9, warmup_steps=0,
                        eval_every=1, eval_batches=1, ckpt_every=1, log_every=1)
    config_lib.validate(config)
    config, tokenizer = start._init_from(asked := config)
    assert tokenizer is None  # no tokenizer.json: data.tokenizer decides
    assert config.model.vocab_size == 320  # 0: taken from the weights
    assert asked.model.vocab_size == 0  # the caller's config is left as it is
    trainer = training.Trainer.build(config)
    state = start.imported_state(trainer)
    assert jax.tree.structure(state) == jax.tree.structure(trainer.abstract_state())
    for leaf, want in zip(jax.tree.leaves(state), jax.tree.leaves(trainer.abstract_state())):
        assert leaf.sharding == want.sharding
    mc = dataclasses.replace(trainer.model_config, scan_layers=False)
    x = tokens(mc, T=64)
    params = unstack_layers(state.params, mc.n_layers)
    np.testing.assert_allclose(our_logits(mc, params, x), hf_logits(model, x), atol=TOL, rtol=0)
    state, _ = train_quietly(config, tmp_path / "run")
    assert int(state.step) == 1


def test_init_from_refuses_a_mismatched_shape_writing_nothing(tmp_path):
    _, folder = hf_gpt2(tmp_path)
    config = config_lib.base_config()
    config.model.update(vocab_size=320, d_model=32, n_layers=2, n_heads=4, d_ff=64,
                        max_seq_len=64, **config_lib.GPT2_BLOCK)
    config.data.corpus = "random"
    config.sample.max_new_tokens = 40
    config.train.init_from = str(folder)
    with pytest.raises(hf.HFError) as error:
        train_quietly(config, tmp_path / "run")
    message = str(error.value)
    assert "\n" not in message and "transformer.h.0.mlp.c_fc.weight" in message
    assert "(32, 48)" in message and "(32, 64)" in message
    assert not (tmp_path / "run").exists()


def test_init_from_reads_a_bare_safetensors_file(tmp_path):
    """A .safetensors file named like a bare GPT2Model's (no "transformer." prefix), with the
    causal-mask buffers old GPT-2 files carry, starts a run with exactly its weights."""
    from safetensors.numpy import save_file

    config = run_config(scan_layers=True)
    mc = ModelConfig.from_config(config)
    params = random_params(dataclasses.replace(mc, scan_layers=False))
    tensors = hf_weights.to_hf(mc, params)
    bare = {k.removeprefix("transformer."): v for k, v in tensors.items()}
    bare["h.0.attn.bias"] = np.tril(np.ones((1, 1, 128, 128), np.float32))
    save_file(bare, str(tmp_path / "w.safetensors"))
    config.train.init_from = str(tmp_path / "w.safetensors")
    loaded = hf_import.init_params(config_lib.validate(config))
    assert "blocks" in loaded  # the scanned layout training uses for this config
    loaded = unstack_layers(loaded, mc.n_layers)
    for want, got in zip(jax.tree.leaves(params), jax.tree.leaves(loaded)):
        np.testing.assert_array_equal(got, np.asarray(want))


@pytest.mark.parametrize("key, value", [("activation_function", "gelu"),
                                        ("layer_norm_epsilon", 1e-6),
                                        ("scale_attn_by_inverse_layer_idx", True),
                                        ("model_type", "bert")])
def test_hf_configs_we_compute_differently_are_refused(key, value):
    cfg = {"model_type": "gpt2", "vocab_size": 320, "n_embd": 32, "n_layer": 2, "n_head": 4,
           key: value}
    with pytest.raises(hf.HFError, match=key):
        hf.model_config_from_hf(cfg, "--hf=x")


def test_init_from_config_check_names_the_field(tmp_path):
    config = run_config()
    config.train.init_from = str(tmp_path / "missing")
    with pytest.raises(config_lib.ConfigError, match="train.init_from="):
        config_lib.validate(config)


def test_sample_refuses_an_hf_folder_whose_ids_have_no_text(tmp_path):
    """No tokenizer.json and a vocabulary above the 256 byte ids: every id >= 256 used to be
    dropped from the text silently."""
    _, folder = hf_gpt2(tmp_path)
    result = run_cli("sample.py", f"--hf={folder}", "--prompt=ab", "--max_new_tokens=5")
    assert result.returncode == 2, result.stdout + result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "tokenizer.json" in line and "vocab_size=320" in line


def test_sample_refuses_a_step_of_an_hf_folder(tmp_path):
    """A folder has no checkpoints: --step=N with --hf was accepted and ignored (the folder's
    weights sampled, whatever N said)."""
    result = run_cli("sample.py", f"--hf={tmp_path}", "--step=5", "--prompt=ab")
    assert result.returncode == 2, result.stdout + result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: --step=5") and "--workdir" in line


@pytest.mark.parametrize("kind", ["byte", "char"])
def test_init_from_an_exported_run_keeps_its_tokenizer_kind_and_says_what_it_loaded(kind,
                                                                                     tmp_path):
    corpus = "the cat sat on the mat. " * 400
    tok = tokenizers.build(kind, corpus)
    mc = model_config(vocab_size=max(256, tok.vocab_size) if kind == "byte"
                      else tok.vocab_size)
    out = export.write_folder(mc, random_params(mc), tok, tmp_path / "hf")
    loaded = hf_import.tokenizer(out)
    assert loaded.kind == kind and loaded.encode("the mat") == tok.encode("the mat")
    (tmp_path / "corpus.txt").write_text(corpus)
    config = run_config()
    config.model.update(vocab_size=0)
    config.data.update(corpus=str(tmp_path / "corpus.txt"), tokenizer="bpe")
    config.train.update(init_from=str(out), steps=1, batch_size=2, eval_every=1, eval_batches=1,
                        ckpt_every=1, log_every=1)
    logged = []
    train_quietly(config, tmp_path / "run", log=logged.append)
    lines = "\n".join(logged).splitlines()
    [init] = [line for line in lines if line.startswith("init: ")]
    assert str(out) in init and f"{kind} tokenizer (its tokenizer.json)" in init
    assert any(line.startswith("data: ") and f"{kind} tokenizer" in line for line in lines)


# --- the modern recipe's pieces (issue 29) ------------------------------------------------

@pytest.mark.parametrize("fields, cls", [
    (dict(bias=False, zero_init_out=True), "GPT2LMHeadModel"),
    (dict(**LLAMA, qk_norm=True, bias=False, zero_init_out=True, tie_embeddings=False),
     "Qwen3ForCausalLM")])
def test_padded_bias_free_and_zero_init_runs_export_with_equal_logits(fields, cls, tmp_path):
    """A padded vocabulary (320 rows, 257 ids used) exports its 257 ids only, and transformers'
    logits equal ours over them; GPT-2 without biases exports zero biases (the same numbers);
    zero-initialised output kernels need nothing (noise moved them here). Imported back, the
    folder gives the same logits again."""
    mc = model_config(vocab_size=320, vocab_used=257, **fields)
    params = random_params(mc)
    out = export.write_folder(mc, params, tokenizers.ByteTokenizer(eot=True), tmp_path / "hf")
    model = hf_model(out).eval()
    assert type(model).__name__ == cls and model.config.vocab_size == 257
    x = tokens(mc) % 257
    ours = our_logits(mc, params, x)
    assert np.isneginf(ours[..., 257:]).all()  # the padding ids: probability 0 here too
    np.testing.assert_allclose(hf_logits(model, x), ours[..., :257], atol=TOL, rtol=0)
    mc_back, params_back, _ = hf_import.load_pretrained(out)
    assert mc_back.vocab_size == 257 and mc_back.qk_norm == mc.qk_norm
    np.testing.assert_allclose(our_logits(mc_back, params_back, x), ours[..., :257], atol=TOL)


def test_qk_norm_with_biases_is_refused_naming_model_bias(tmp_path):
    mc = model_config(**LLAMA, qk_norm=True)  # bias=True: Qwen3's MLP has none
    with pytest.raises(hf.HFError, match=r"^model\.bias=True: .*Qwen3") as error:
        export.write_folder(mc, init_params(mc, jax.random.key(0)), tokenizers.ByteTokenizer(),
                            tmp_path / "hf")
    assert "\n" not in str(error.value) and not (tmp_path / "hf").exists()


def test_a_bias_free_model_refuses_non_zero_biases_from_a_checkpoint(tmp_path):
    """GPT-2 weights carry biases: a model with model.bias=False could only drop them, which
    would change its numbers; refused naming the tensor."""
    _, folder = hf_gpt2(tmp_path)
    mc = model_config(vocab_size=320, d_ff=48, max_seq_len=64, bias=False)
    with pytest.raises(hf.HFError, match="transformer.ln_f.bias is a non-zero bias"):
        hf_weights.from_hf(mc, hf_import.read_tensors(folder, "x"), "x")


def test_gpt2_paths_spell_out_every_field_of_the_block():
    """GPT2_BLOCK names every model field that changes what a block computes, so an imported
    GPT-2 (sample.py --hf, the equality tests, configs/gpt2.py, configs/gpt2_small.py for
    fine-tuning) stays GPT-2 when the field defaults move to a modern recipe. A model field
    added later must be put in it or in the shape/how-it-runs list below."""
    shape_or_how = {"vocab_size", "vocab_multiple", "d_model", "n_layers", "n_heads", "d_ff",
                    "max_seq_len", "dtype", "param_dtype", "scan_layers", "remat",
                    "attention_kernel", "matmul", "depth"}
    model_fields = {f.key for f in config_lib.fields.MODEL_FIELDS}
    assert set(config_lib.GPT2_BLOCK) | shape_or_how == model_fields
    assert not set(config_lib.GPT2_BLOCK) & shape_or_how
    cfg = {"model_type": "gpt2", "vocab_size": 320, "n_embd": 32, "n_layer": 2, "n_head": 4}
    mc = hf.model_config_from_hf(cfg, "--hf=x")
    assert {k: getattr(mc, k) for k in config_lib.GPT2_BLOCK} == config_lib.GPT2_BLOCK
    import importlib.util
    from pathlib import Path
    for name in ("gpt2", "gpt2_small"):
        path = Path(__file__).parent.parent / "configs" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        c = module.get_config()
        assert {k: c.model[k] for k in config_lib.GPT2_BLOCK} == config_lib.GPT2_BLOCK
        assert hf.family(ModelConfig.from_config(c)) == "gpt2"


def test_a_run_padded_by_vocab_multiple_samples_and_exports(tmp_path):
    """vocab_size=0 with vocab_multiple=64: the run trains 320 rows for the byte tokenizer's
    257 ids, saves vocab_used=257, sample.py decodes from it (text only: a padding id has
    none), and export writes the 257 ids with logits equal to ours."""
    config = run_config(vocab_size=0, vocab_multiple=64, max_seq_len=32)
    (tmp_path / "corpus.txt").write_text("def f(x):\n    return x + 1\n" * 300)
    config.data.update(corpus=str(tmp_path / "corpus.txt"))
    config.train.update(steps=2, batch_size=2, eval_every=2, eval_batches=1, ckpt_every=2,
                        log_every=1)
    config.sample.max_new_tokens = 8
    train_quietly(config, tmp_path / "run")
    saved = checkpoint.load_run(tmp_path / "run")
    assert (saved.model_config.vocab_size, saved.model_config.vocab_used) == (320, 257)
    result = run_cli("sample.py", f"--workdir={tmp_path / 'run'}", "--prompt=def ",
                     "--max_new_tokens=20", "--temperature=2", "--top_k=0", "--no_stream")
    assert result.returncode == 0, result.stderr
    out = export.export(tmp_path / "run", tmp_path / "hf")
    model = hf_model(out).eval()
    assert model.config.vocab_size == 257
    mc = dataclasses.replace(saved.model_config, matmul="plain")
    x = tokens(mc, T=20) % 257
    np.testing.assert_allclose(hf_logits(model, x), our_logits(mc, jax.device_get(saved.params),
                                                               x)[..., :257], atol=TOL)


def test_greedy_after_a_prompt_longer_than_half_the_context_equals_hf_generate(tmp_path):
    """A 67-token prompt on a 128-token model (its bucket: 128) and 20 tokens: all within the
    context, so transformers sees every token. The bucket's padding filled the cache, so
    generation re-prefilled after the first token, dropping prompt tokens: the text differed
    from token 1."""
    torch = need_torch()
    mc = model_config()
    out = export.write_folder(mc, random_params(mc, scale=1.0), tokenizers.ByteTokenizer(),
                              tmp_path / "hf")
    prompt = [(7 * i + 3) % 256 for i in range(67)]
    assert decode.prompt_bucket(len(prompt), mc.max_seq_len) == mc.max_seq_len == 128
    model = hf_model(out).eval()
    with torch.no_grad():
        ids = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=20,
                             min_new_tokens=20, pad_token_id=0)
    mc2, params, _ = hf_import.load_pretrained(out)
    ours = decode.generate(mc2, params, [prompt], max_new_tokens=20, temperature=0.0)[0]
    assert ours == ids[0, len(prompt):].tolist()


def test_greedy_sample_of_a_folder_whose_tokenizer_adds_a_bos_equals_hf_generate(tmp_path):
    """A Llama folder whose tokenizer.json puts <s> before every text (Llama 2, TinyLlama):
    transformers' tokenizer(prompt) starts with it, and so must sample.py --hf's prompt; it
    was left out (our tokenizer encodes text as text), and the greedy text differed."""
    import json

    torch = need_torch()
    import transformers
    from tokenizers import processors
    bpe = tokenizers.BPETokenizer.train("hello world, the quick brown fox jumps\n" * 20, 300)
    hf_tok = bpe.hf_tokenizer()
    hf_tok.add_special_tokens(["<s>"])
    bos = hf_tok.token_to_id("<s>")
    hf_tok.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                          special_tokens=[("<s>", bos)])
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=bos + 1, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64,
                                   rms_norm_eps=1e-5, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(tmp_path / "llama")
    hf_tok.save(str(tmp_path / "llama" / "tokenizer.json"))
    (tmp_path / "llama" / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>"}))
    prompt = "hello world"
    ids = transformers.AutoTokenizer.from_pretrained(tmp_path / "llama")(prompt)["input_ids"]
    assert ids[0] == bos
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=12,
                             min_new_tokens=12, pad_token_id=0)
    theirs = out[0, len(ids):].tolist()
    mc, params, _ = hf_import.load_pretrained(tmp_path / "llama")
    without_bos = decode.generate(mc, params, [ids[1:]], max_new_tokens=12, temperature=0.0)
    assert without_bos[0] != theirs  # the BOS matters to this model
    result = run_cli("sample.py", f"--hf={tmp_path / 'llama'}", f"--prompt={prompt}",
                     "--temperature=0", "--max_new_tokens=12", "--noend_at_eot")
    assert result.returncode == 0, result.stderr
    newlines = lambda t: t.replace("\r\n", "\n").replace("\r", "\n")  # noqa: E731 (text pipe)
    assert result.stdout.split("---\n", 1)[1] == newlines(prompt + bpe.decode(theirs) + "\n")


def test_sample_ends_at_the_folders_end_of_sequence_token(tmp_path):
    """sample.py --hf of a folder whose end token is not <|endoftext|> (config.json's
    eos_token_id, Llama's and Mistral's </s>): the sample ends where the model makes it
    (--end_at_eot, the default), as serve --hf ends a choice there; --noend_at_eot goes on."""
    import json
    _, folder = hf_gpt2(tmp_path)
    bpe = tokenizers.BPETokenizer.train("the quick brown fox jumps over the lazy dog\n" * 20,
                                        300)
    bpe.hf_tokenizer().save(str(folder / "tokenizer.json"))
    mc, params, tok = hf_import.load_pretrained(folder)
    prompt = "the fox"
    # seed 1: since the row noise became threefry's (docs/sampling.md), seed 0's sample holds
    # a "\r", which run_cli's text-mode pipe reads back as "\n" (universal newlines; the
    # bytes sample.py writes are right)
    free = decode.generate(mc, params, [tok.encode(prompt)], max_new_tokens=24,
                           temperature=1.0, seed=1)[0]
    k = next(k for k in range(2, 24) if free[k] not in free[:k] and free[k] < tok.vocab_size
             and tok.decode(free[k:]))
    spec = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**spec, "eos_token_id": free[k]}))
    args = ("sample.py", f"--hf={folder}", f"--prompt={prompt}", "--temperature=1",
            "--seed=1", "--max_new_tokens=24")
    # (the end token here is an ordinary token: past it, --noend_at_eot prints its text)
    for flags, text in (((), tok.decode(free[:k])), (("--noend_at_eot",), tok.decode(free))):
        result = run_cli(*args, *flags)
        assert result.returncode == 0, result.stderr
        assert result.stdout.split("---\n", 1)[1] == prompt + text + "\n"


GOOD_GPT2 = {"model_type": "gpt2", "vocab_size": 320, "n_embd": 32, "n_layer": 2, "n_head": 4,
             "n_positions": 64}


@pytest.mark.parametrize("config_json, phrase", [
    ('{"model_type": "gpt2", ', "config.json is not readable JSON"),  # a cut file
    ("[1, 2]", "config.json holds a JSON list"),
    (json.dumps({**GOOD_GPT2, "n_embd": "abc"}), "n_embd='abc': must be a positive integer"),
    (json.dumps({**GOOD_GPT2, "n_layer": 2.5}), "n_layer=2.5: must be a positive integer"),
    (json.dumps({"model_type": "llama", "rms_norm_eps": 1e-5, "hidden_size": 32}),
     "has no 'num_attention_heads'"),
])
def test_a_damaged_config_json_is_one_hf_error_naming_the_key(config_json, phrase, tmp_path):
    """A cut, non-object or mistyped config.json was a JSONDecodeError, AttributeError,
    TypeError or KeyError traceback from `sample.py --hf` / `serve --hf` / `init_from`."""
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "config.json").write_text(config_json)
    with pytest.raises(hf.HFError, match=re.escape(phrase)):
        hf.model_config_from_hf(hf_import.read_config(tmp_path, "--hf=x"), "--hf=x")


@pytest.mark.parametrize("tokenizer_json, phrase", [
    ('{"model": ', "tokenizer.json is not readable JSON"),
    ('{"model": {"type": "Nope"}}', "tokenizer.json is not a tokenizer"),
])
def test_a_damaged_tokenizer_json_is_one_hf_error(tokenizer_json, phrase, tmp_path):
    (tmp_path / "tokenizer.json").write_text(tokenizer_json)
    with pytest.raises(hf.HFError, match=re.escape(phrase)):
        hf_import.tokenizer(tmp_path)


def test_sample_of_an_hf_folder_with_a_cut_config_json_is_one_line(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "config.json").write_text('{"model_type": ')
    result = run_cli("sample.py", f"--hf={tmp_path}", "--prompt=ab")
    assert result.returncode == 2, result.stdout + result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: --hf=") and "config.json is not readable JSON" in line
