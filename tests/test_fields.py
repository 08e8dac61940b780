"""One declaration per config field: everything else is derived from fields.FIELDS, and a field
declared incompletely, or named somewhere it is not declared, fails here."""

import dataclasses

import pytest

from transformer import config as config_lib
from transformer.config import ModelConfig, base_config, fields, resume
from transformer.model import sizes
from transformer.train.resolve import resolve


def problems(table, model_config=ModelConfig, free=resume.FREE, fixed=resume.FIXED) -> list:
    """What is wrong between a declaration table and the things derived from it."""
    out = []
    names = [f.name for f in table]
    out += [f"{n}: declared twice" for n in set(names) if names.count(n) > 1]
    for f in table:
        if not f.doc.strip() or "\n" in f.doc:
            out.append(f"{f.name}: needs a one-line doc")
        if f.resume not in (fields.FREE, fields.FIXED, fields.CHANGE):
            out.append(f"{f.name}: resume rule {f.resume!r} is not free, fixed or change")
        if f.choices and f.default not in f.choices:
            out.append(f"{f.name}: default {f.default!r} is not among its choices")
        if f.check and f.check(f.default):
            out.append(f"{f.name}: default {f.default!r} fails its own check")
    model_keys = {f.key for f in table if f.section == "model"}
    dataclass_keys = {f.name for f in dataclasses.fields(model_config)}
    out += [f"ModelConfig.{k}: not declared" for k in sorted(dataclass_keys - model_keys)]
    out += [f"model.{k}: missing from ModelConfig" for k in sorted(model_keys - dataclass_keys)]
    out += [f"resume rules name {n}: not declared" for n in (*free, *fixed) if n not in names]
    return out


def test_the_declarations_and_everything_derived_agree():
    assert problems(fields.FIELDS) == []


@pytest.mark.parametrize("plant,expected", [
    (lambda t: t + (fields.Field("train.new", 1, "", fields.CHANGE),), "needs a one-line doc"),
    (lambda t: t + (fields.Field("train.new", 1, "a knob", "maybe"),), "resume rule"),
    (lambda t: t + (fields.Field("model.new", 1, "a knob", fields.FIXED),),
     "model.new: missing from ModelConfig"),
    (lambda t: tuple(f for f in t if f.name != "model.mlp"), "ModelConfig.mlp: not declared"),
    (lambda t: t + (t[0],), "declared twice"),
    (lambda t: t + (fields.Field("model.x", "a", "a knob", fields.FIXED, ("b",)),), "choices"),
])
def test_a_field_added_in_one_place_only_is_caught(plant, expected):
    assert any(expected in p for p in problems(plant(fields.FIELDS)))


def test_resume_rules_naming_a_non_field_are_caught():
    found = problems(fields.FIELDS, fixed=(*resume.FIXED, "model.d_modle"))
    assert found == ["resume rules name model.d_modle: not declared"]


def test_base_config_model_config_and_resume_derive_from_the_declarations():
    flat = config_lib.flatten(config_lib.to_dict(base_config()))
    assert set(flat) == set(fields.BY_NAME)
    assert all(flat[f.name] == f.default for f in fields.FIELDS)
    built = ModelConfig()  # the same defaults as base_config(): plain data, matmul "auto" too
    for f in fields.MODEL_FIELDS:
        assert getattr(built, f.key) == f.default, f.name
    every_rule = {f.name for f in fields.FIELDS if f.resume != fields.CHANGE}
    assert set(resume.FREE) | set(resume.FIXED) == every_rule


def test_validate_names_the_field_for_every_declared_check():
    """Each declared choice or check is enforced by validate, with the field in the message."""
    tested = 0
    for f in fields.FIELDS:
        bad = {str: "no-such-value", int: -7, float: -7.0}.get(type(f.default))
        if not (f.choices or f.check) or bad is None or (f.check and not f.check(bad)):
            continue
        config = config_lib.replace(base_config(), **{f.name: bad})
        with pytest.raises(config_lib.ConfigError, match=f"^{f.name}="):
            config_lib.validate(config)
        tested += 1
    assert tested > 30  # most fields have a choice or a check


def test_derived_values_come_back_in_a_new_config():
    """A validated config is never changed: resolving returns a new one."""
    class Tok:
        vocab_size, kind = 65, "char"
    config = config_lib.validate(config_lib.replace(base_config(), **{"model.vocab_size": 0}))
    resolved, _ = resolve(config, platform=None, tokenizer=Tok())
    assert (config.model.vocab_size, resolved.model.vocab_size) == (0, 65)
    assert sizes.model_config_of(config).vocab_size == 257 and config.model.vocab_size == 0
    synthetic = config_lib.replace(config, **{"data.corpus": "copy"})
    assert sizes.model_config_of(synthetic).vocab_size == 256


def test_resume_rules_follow_the_numerics():
    """fast_bf16 rounds matmul inputs to bfloat16: switching to or from it changes what a
    resumed run computes, so it must be allowed and is reported; plain and fast_f32 are the
    same float32 arithmetic, and remat recomputes the same values: both change freely."""
    def diffs(field, old, new):
        section, key = field.split(".")
        return resume.differences({section: {key: old}}, {section: {key: new}})

    for old, new in (("fast_bf16", "fast_f32"), ("fast_f32", "fast_bf16"), ("plain", "fast_bf16")):
        changed = diffs("model.matmul", old, new)
        with pytest.raises(config_lib.ConfigError, match="allow_change=model.matmul"):
            resume.check(changed, allowed=(), workdir="runs/x")
        resume.check(changed, allowed={"model.matmul"}, workdir="runs/x")
        assert "computes differently" in resume.computing_differently(changed)
    assert diffs("model.matmul", "plain", "fast_f32") == {}
    for old, new in (("none", "block"), ("block", "dots"), ("dots", "none")):
        changed = diffs("model.remat", old, new)
        resume.check(changed, allowed=(), workdir="runs/x")
        assert resume.computing_differently(changed) is None
    with pytest.raises(config_lib.ConfigError, match="model.d_model"):
        resume.check({"model.d_model": (64, 32)}, allowed=(), workdir="runs/x")


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_a_matmul_change_is_allowed_by_the_flags_docs_resume_names(optimizer):
    """docs/resume.md: a run moved to or from fast_bf16 continues with
    --allow_change=model.matmul. train.muon_ns_dtype=auto resolves after the matmul mode, so
    the saved config differs there too; under AdamW that field computes nothing, and naming
    it was required all the same (configs/tiny.py on another CPU was refused twice). Under
    Muon it does change the arithmetic: the message and docs name both fields."""
    def resolved(matmul):
        c = config_lib.replace(base_config(), **{"model.matmul": matmul,
                                                 "train.optimizer": optimizer})
        return config_lib.to_dict(resolve(c)[0])

    changed = resume.differences(resolved("fast_bf16"), resolved("fast_f32"))
    if optimizer == "adamw":
        resume.check(changed, allowed={"model.matmul"}, workdir="runs/x")
    else:
        with pytest.raises(config_lib.ConfigError,
                           match="allow_change=model.matmul,train.muon_ns_dtype"):
            resume.check(changed, allowed=(), workdir="runs/x")
        resume.check(changed, allowed={"model.matmul", "train.muon_ns_dtype"}, workdir="runs/x")


def test_the_fields_command_lists_every_field_with_default_allowed_values_and_meaning():
    from pathlib import Path

    from transformer.config import fields
    from tests.conftest import fork_run
    out = fork_run("-m", "transformer", "fields", cwd=Path(__file__).resolve().parents[1],
                   timeout=60)
    assert out.returncode == 0, out.stderr
    lines = {line.split()[0]: line for line in out.stdout.splitlines()[1:]}
    assert set(lines) == {f.name for f in fields.FIELDS}
    for f in fields.FIELDS:
        line = lines[f.name]
        assert repr(f.default) in line and f.doc in line and f.resume in line
        assert all(str(c) in line for c in f.choices)
