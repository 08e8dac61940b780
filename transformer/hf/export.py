"""Export a trained run as a Hugging Face folder that `transformers` loads as it is.

    python -m transformer export --workdir=runs/tiny --out=hf/tiny [--step=N]

    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained("hf/tiny")      # GPT2LMHeadModel or Llama
    tokenizer = AutoTokenizer.from_pretrained("hf/tiny")

Writes config.json, model.safetensors (float32, written from NumPy: torch is not needed),
tokenizer.json and tokenizer_config.json. Which of our variants map onto which architecture,
and why the others are refused, is in hf/mapping.py and docs/huggingface.md. Every check runs before
the output folder is created: a refused export writes nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

from absl import flags

from transformer import cli
from transformer.config import ModelConfig
from transformer.hf import mapping as hf
from transformer.hf import weights as hf_weights

_WORKDIR = flags.DEFINE_string("workdir", None, "A training run's workdir.")
_OUT = flags.DEFINE_string("out", None, "The folder to write (must not exist or be empty).")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest good one).")


def tokenizer_json(tokenizer) -> str:
    """The tokenizer as a `tokenizers` JSON that encodes and decodes exactly as ours does."""
    if tokenizer.kind == "bpe":
        # Without its post-processor, as ours encodes (tokenizers.ordinary): a BOS that a
        # prepared tokenizer.json's template would add was never in the training data.
        spec = json.loads(tokenizer.to_json()["tokenizer"])
        spec["post_processor"] = None
        return json.dumps(spec)
    # byte: byte-level BPE without merges; char: one token per character, id = its index;
    # either with <|endoftext|> after them when it has one.
    spec = json.loads(tokenizer.hf_tokenizer().to_str())
    if tokenizer.kind == "char":
        # A character the run never saw: ours refuses it, naming it (sample.py, serve); a BPE
        # model without an unknown token dropped it silently ("abxc" -> "abc"). An unknown
        # token that is not in the vocabulary makes `tokenizers` refuse the text instead.
        spec["model"]["unk_token"] = UNKNOWN_CHAR
    return json.dumps(spec)


# What `tokenizers` names in its refusal of a character outside a char vocabulary: "Unk token
# `...` not found in the vocabulary" (never a token: every token of a char vocabulary is one
# character).
UNKNOWN_CHAR = "<a character this char-level model never saw>"


def check_out(out) -> Path:
    """`out` if the folder can be written there: it is new or empty, and the nearest part of
    its path that exists is a folder this user may write in."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise hf.HFError(f"--out={out}: exists and is not an empty folder; choose a new one")
    why = cli.cannot_write(out, folder=True)
    if why:
        raise hf.HFError(f"--out={out}: {why}; choose another path")
    return out


def write_folder(model_config: ModelConfig, params, tokenizer, out) -> Path:
    """Writes the Hugging Face folder for (model_config, params, tokenizer) to `out`.
    Everything is computed first; the folder is created only when nothing can be refused."""
    from safetensors.numpy import save_file

    from transformer.model.gpt import unstack_layers
    out = check_out(out)
    config_json = hf.hf_config(model_config)  # refuses an unsupported variant
    tensors = hf_weights.to_hf(model_config, unstack_layers(params, model_config.n_layers))
    tok_json = tokenizer_json(tokenizer)
    # split_special_tokens: text spelling <|endoftext|> is text, as ours reads it (each
    # document's end token is placed, never parsed); eos_token_id still names the token.
    tok_config = {"tokenizer_class": "PreTrainedTokenizerFast",
                  "model_max_length": model_config.max_seq_len,
                  "clean_up_tokenization_spaces": False, "split_special_tokens": True}
    eot = getattr(tokenizer, "eot", None)
    if eot is not None:  # generate() then ends a sample where sample.py does
        config_json["eos_token_id"] = eot
        tok_config["eos_token"] = tokenizer.hf_tokenizer().id_to_token(eot)
    try:
        out.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        (out / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")
        (out / "tokenizer.json").write_text(tok_json)
        (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    except OSError as e:  # a path that could not be checked beforehand, a full disk
        raise hf.HFError(f"--out={out}: could not write the folder ({e.strerror or e}: "
                         f"{e.filename or out})") from e
    return out


def export(workdir, out, step=None) -> Path:
    """Exports checkpoint `step` (default: the latest good one) of the run in `workdir`."""
    import jax

    from transformer import checkpoint

    check_out(out)
    # Refused before any restore if the run's model has no Hugging Face family.
    run = checkpoint.load_run(workdir, step=step,
                              check=lambda model_config: hf.family(model_config))
    return write_folder(run.model_config, jax.device_get(run.params), run.tokenizer, out)


def main(argv):
    if len(argv) > 1:
        cli.fail(f"unexpected arguments {argv[1:]}: flags look like --name=value")
    if not _WORKDIR.value or not _OUT.value:
        cli.fail("--workdir and --out are required: python -m transformer export "
                 "--workdir=runs/x --out=hf/x")
    out = export(_WORKDIR.value, _OUT.value, _STEP.value)
    print(f"wrote {out}: config.json, model.safetensors, tokenizer.json "
          f"(load with transformers.AutoModelForCausalLM.from_pretrained({str(out)!r}))")


if __name__ == "__main__":
    cli.run(main)
