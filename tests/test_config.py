"""Configs are data; bad values are refused at start-up with the field named."""

import importlib.util
import re
from pathlib import Path

import pytest

from transformer import config as config_lib
from transformer.config import ConfigError, base_config, validate

CONFIGS = sorted((Path(__file__).parent.parent / "configs").rglob("*.py"))


def _load(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_shipped_config_is_valid(path):
    config = _load(path)
    if hasattr(config, "model"):  # sweep files under configs/ describe several runs
        validate(config)


def test_a_saved_config_round_trips():
    c = base_config()
    c.model.d_model = 96
    c.model.n_heads = 3
    assert config_lib.from_dict(config_lib.to_dict(c)) == c


def test_a_config_saved_with_a_retired_field_reads_back_without_it():
    """A checkpoint saved before train.final_eval_batches became train.eval_tokens resumes:
    the retired field is dropped (kept, it was an unknown key that validate refuses)."""
    saved = config_lib.to_dict(base_config())
    saved["train"]["final_eval_batches"] = 0
    assert config_lib.from_dict(saved) == base_config()


@pytest.mark.parametrize("section,field,value,match", [
    ("model", "d_model", 102, "model.d_model=102: must be divisible by model.n_heads=4"),
    ("model", "n_layers", 0, "model.n_layers=0"),
    ("model", "dtype", "float16", "model.dtype"),
    ("model", "remat", "always", "model.remat"),
    ("data", "tokenizer", "words", "data.tokenizer"),
    ("data", "val_fraction", 1.5, "data.val_fraction"),
    ("train", "lr", -1.0, "train.lr"),
    ("train", "batch_size", 0, "train.batch_size"),
    ("sample", "top_p", 0.0, "sample.top_p"),
    ("sample", "temperature", -0.5, "sample.temperature"),
    # accepted here, it raised OverflowError in the sample after the whole run had trained
    ("sample", "top_k", 2**31, "sample.top_k=2147483648: must be at most 2,147,483,647"),
    # accepted here, `python -m transformer sizes` stopped in JAX's OverflowError traceback
    ("model", "max_seq_len", 10**11, "model.max_seq_len=100000000000: must be at most 2,147,"),
    ("model", "vocab_size", 2**31, "model.vocab_size=2147483648: must be at most 2,147,"),
    ("sample", "max_new_tokens", -1, r"sample.max_new_tokens=-1: must be .* >= 0 \(0: no sample"),
    ("sample", "prompt", "", "sample.prompt='': must not be empty"),
    ("train", "lr", float("inf"), "train.lr=inf: must be a finite"),  # --config.train.lr=1e400
    ("train", "muon_lr", float("inf"), "train.muon_lr=inf: must be a finite"),
    ("model", "logit_softcap", float("inf"), "model.logit_softcap=inf: must be a finite"),
    ("train", "weight_decay", float("inf"), "train.weight_decay=inf: must be a finite"),
])
def test_invalid_values_name_the_field(section, field, value, match):
    c = base_config()
    with c.unlocked():
        c[section][field] = value
    with pytest.raises(ConfigError, match=match):
        validate(c)


@pytest.mark.parametrize("position,n_heads,d_model", [("learned", 3, 64), ("rope", 5, 64),
                                                      ("rope", 3, 64), ("learned", 4, 102)])
def test_the_d_model_the_error_suggests_is_valid(position, n_heads, d_model):
    """`try d_model=N` must name a width that passes: with rope one of an even head dim (5
    heads of 64 suggested 65, head dim 13, which the rope check then refused)."""
    c = base_config()
    c.model.update(position=position, n_heads=n_heads, d_model=d_model)
    with pytest.raises(ConfigError, match="try d_model=") as refused:
        validate(c)
    suggested = int(re.search(r"try d_model=(\d+)", str(refused.value)).group(1))
    c.model.d_model = suggested
    validate(c)
    assert abs(suggested - d_model) <= 2 * n_heads


def test_unknown_keys_are_refused():
    c = base_config()
    with c.unlocked():
        c.model.d_modle = 3
    with pytest.raises(ConfigError, match="model.d_modle: unknown config key"):
        validate(c)


def test_wrong_types_are_refused():
    c = base_config()
    with c.unlocked():
        c.model.__setattr__("n_heads", "four") if False else None
        c.model._fields["n_heads"] = "four"  # bypass ConfigDict's own type check
    with pytest.raises(ConfigError, match="model.n_heads='four': must be of type int"):
        validate(c)


@pytest.mark.parametrize("name", ["default", "tiny", "bench", "char_small", "gpt2_small"])
def test_every_shipped_config_starts_on_its_own_data(name, tmp_path, monkeypatch):
    """The config as shipped, its data read and its vocabulary resolved as train.py and the
    bench do (not trained): a vocab_size that no longer fits the tokenizer (256 once text had an
    end-of-text token) is caught here, not by a user."""
    import importlib

    from transformer import data
    from transformer.train.resolve import resolve
    config = importlib.import_module(f"configs.{name}").get_config()
    config.data.max_bytes = min(config.data.max_bytes, 300_000)  # what is read, not the shape
    config = validate(config)
    tokenizer, _ = data.load(config)
    resolved, _ = resolve(config, platform=None, tokenizer=tokenizer)
    assert resolved.model.vocab_size >= tokenizer.vocab_size
