"""Start from weights a user has on disk in Hugging Face format (nothing is downloaded).

    python train.py --config=configs/gpt2_small.py --config.model.vocab_size=50257 \
        --config.train.init_from=path/to/gpt2      # fine-tune: a folder or a .safetensors file
    python sample.py --hf=path/to/gpt2 --prompt="Hello" --temperature=0

A folder holds config.json and model.safetensors (PyTorch .bin files are not read: convert
them with `transformers`' save_pretrained(safe_serialization=True)). GPT-2 folders are the
aim; Llama folders this project exported (or bias-free Llamas with matching settings) load too.

Tokenizer: a folder with tokenizer.json brings its own (GPT-2's BPE for a real GPT-2), which
then tokenizes the training corpus of an `init_from` run and the prompts of `sample.py --hf`;
without one, text is fed as UTF-8 byte ids (ids 0..255), which needs vocab_size >= 256.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from transformer.config import ModelConfig
from transformer.data import tokenizers
from transformer.hf import mapping as hf
from transformer.hf import weights as hf_weights


def _files(path, where: str) -> tuple[Path, Path | None]:
    """(the .safetensors file, config.json or None) of a folder or a file."""
    path = Path(path).expanduser()
    if path.is_file() and path.suffix == ".safetensors":
        config = path.parent / "config.json"
        return path, config if config.is_file() else None
    if path.is_dir():
        weights = path / "model.safetensors"
        if not weights.is_file():
            other = "; pytorch_model.bin is not read, save it as safetensors" if (
                path / "pytorch_model.bin").exists() else ""
            raise hf.HFError(f"{where}: {path} has no model.safetensors{other}")
        config = path / "config.json"
        return weights, config if config.is_file() else None
    raise hf.HFError(f"{where}: no such folder or .safetensors file")


def read_tensors(path, where: str) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    weights, _ = _files(path, where)
    try:
        return load_file(str(weights))
    except Exception as e:  # noqa: BLE001 -- safetensors raises its own error types
        raise hf.HFError(f"{where}: {weights} could not be read: {e}") from None


def read_config(path, where: str) -> dict:
    _, config = _files(path, where)
    if config is None:
        raise hf.HFError(f"{where}: no config.json next to the weights; it says the model shape")
    return _json_object(config, where)


def _json_object(path: Path, where: str) -> dict:
    """The JSON object in `path`, or an HFError naming the file (a damaged or cut file was a
    JSONDecodeError traceback, a list an AttributeError)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise hf.HFError(f"{where}: {path} is not readable JSON ({e}); copy the folder's "
                         "files again") from None
    if not isinstance(value, dict):
        raise hf.HFError(f"{where}: {path} holds a JSON {type(value).__name__}, not the object "
                         "a Hugging Face folder's file holds") from None
    return value


def tokenizer(path):
    """The folder's tokenizer.json as our BPE tokenizer kind, or None when it has none."""
    path = Path(path).expanduser()
    folder = path if path.is_dir() else path.parent
    if not (folder / "tokenizer.json").is_file():
        return None
    from tokenizers import Tokenizer
    file = folder / "tokenizer.json"
    ours = _exported_kind(_json_object(file, f"--hf={path}"))
    if ours:
        return ours
    try:
        return tokenizers.BPETokenizer(Tokenizer.from_file(str(file)))
    except Exception as e:  # noqa: BLE001 -- tokenizers raises its own exception type
        raise hf.HFError(f"--hf={path}: {file} is not a tokenizer the tokenizers library reads "
                         f"({e})") from None


def _exported_kind(spec: dict):
    """A byte or char tokenizer that `export` wrote as merge-free BPE (export.tokenizer_json),
    as that kind again, so that a run started from the folder says and saves the right kind;
    None for any other tokenizer.json."""
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or model.get("merges"):
        return None
    vocab, pre = model.get("vocab") or {}, (spec.get("pre_tokenizer") or {}).get("type")
    added = {t.get("content"): t.get("id") for t in spec.get("added_tokens") or []}
    eot = added.get(tokenizers.EOT) == len(vocab)  # the end-of-text id right after the rest
    if set(added) - {tokenizers.EOT} or (added and not eot):
        return None
    if pre == "ByteLevel" and vocab == {ch: b for b, ch in enumerate(hf.byte_alphabet())}:
        return tokenizers.ByteTokenizer(eot=eot)
    if pre == "Split" and vocab and sorted(vocab.values()) == list(range(len(vocab))) \
            and all(len(ch) == 1 for ch in vocab):
        return tokenizers.CharTokenizer("".join(sorted(vocab, key=vocab.get)), eot=eot)
    return None


def describe(config, tokenizer) -> str:
    """The line a run started from `train.init_from` prints: what was loaded, which tokenizer."""
    path = Path(config.train.init_from).expanduser()
    folder = path if path.is_dir() else path.parent
    source = ("its tokenizer.json" if (folder / "tokenizer.json").is_file() else
              f"no tokenizer.json there: data.tokenizer={config.data.tokenizer}")
    return (f"init: weights from {path} ({config.model.n_layers} layers, d_model "
            f"{config.model.d_model}, vocab {config.model.vocab_size}); {tokenizer.kind} "
            f"tokenizer ({source})")


def load_pretrained(path, matmul: str = "plain"):
    """(model_config, params, tokenizer) for a Hugging Face folder: what `sample.py --hf` runs.
    params are NumPy arrays in the unrolled layout; without tokenizer.json, byte ids."""
    where = f"--hf={path}"
    cfg = read_config(path, where)
    model_config = hf.model_config_from_hf(cfg, where)
    model_config = ModelConfig(**{**model_config.__dict__, "matmul": matmul})
    params = hf_weights.from_hf(model_config, read_tensors(path, where), where)
    tok = tokenizer(path)
    if tok is None:
        if model_config.vocab_size < 256:
            raise hf.HFError(f"{where}: no tokenizer.json and vocab_size={model_config.vocab_size}"
                             " < 256: byte ids would not fit; add the model's tokenizer.json")
        tok = tokenizers.ByteTokenizer()
    return model_config, params, tok


def ending_at(tokenizer, path, config: dict):
    """A folder's BPE tokenizer with its end-of-text token set to the folder's end of
    sequence, so that a choice ends where the model makes it: tokenizer_config.json's
    `eos_token` (what a chat template writes after a turn: `</s>`, `<|im_end|>`), else
    config.json's `eos_token_id` (the first of a list), else generation_config.json's. The
    tokenizer alone knows only `<|endoftext|>`, so a Llama or Mistral folder's `</s>` ended
    nothing: every choice ran to max_tokens, its text going on past the end (the token
    itself is not text).

    `end_ids`: every id of config.json's and generation_config.json's `eos_token_id` (an id
    or a list) besides: Llama 3.1 Instruct's generation_config.json lists <|end_of_text|>,
    <|eom_id|> and <|eot_id|>, and `transformers` stops at any of them, so a sample or a
    choice ends at any too (text.end_ids); only the first one ended it before."""
    if getattr(tokenizer, "kind", None) != "bpe":
        return tokenizer
    path = Path(path).expanduser()
    folder = path if path.is_dir() else path.parent
    spec = folder / "tokenizer_config.json"
    name = json.loads(spec.read_text()).get("eos_token") if spec.is_file() else None
    name = name.get("content") if isinstance(name, dict) else name
    eos = tokenizer.hf_tokenizer().token_to_id(name) if isinstance(name, str) else None
    listed = [*_ids(config.get("eos_token_id")),
              *_ids(_read_json(folder / "generation_config.json").get("eos_token_id"))]
    listed = [i for i in listed if 0 <= i < tokenizer.vocab_size]
    if eos is None and listed:
        eos = listed[0]
    if isinstance(eos, int) and 0 <= eos < tokenizer.vocab_size:
        tokenizer.eot = eos
        tokenizer.end_ids = tuple(dict.fromkeys([eos, *listed]))
    return tokenizer


def starting_at(tokenizer, path):
    """A folder's BPE tokenizer with `prefix_ids` set: the ids its tokenizer.json's
    post-processor puts before every text (Llama 2's and TinyLlama's `<s>`, Llama 3's
    `<|begin_of_text|>`), which `transformers`' tokenizer(prompt), and so generate(), starts
    from; textgen.encode_prompt puts them first. Our tokenizer encodes text as text
    (tokenizers.ordinary: a training corpus gets no BOS), so `sample.py --hf` of such a folder
    continued a prompt without the BOS its model was trained to see first: other text than
    `transformers` gives on the same weights. None for GPT-2 (its post-processor adds
    nothing) and for a folder this project exported (it has no post-processor);
    tokenizer_config.json's `add_bos_token: false` drops it, as `transformers` does."""
    if getattr(tokenizer, "kind", None) != "bpe":
        return tokenizer
    path = Path(path).expanduser()
    folder = path if path.is_dir() else path.parent
    if _read_json(folder / "tokenizer_config.json").get("add_bos_token") is False:
        return tokenizer
    from tokenizers import Tokenizer
    tok = Tokenizer.from_str(tokenizer.hf_tokenizer().to_str())
    tok.no_padding()
    tok.no_truncation()
    encoding = tok.encode("a", add_special_tokens=True)  # any text: what comes before it
    prefix = []
    for i, special in zip(encoding.ids, encoding.special_tokens_mask):
        if not special:
            break
        prefix.append(int(i))
    tokenizer.prefix_ids = tuple(prefix)
    return tokenizer


def _ids(value) -> list[int]:
    """An `eos_token_id` (an id, a list of them, or nothing) as a list of ids."""
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


def _read_json(path: Path) -> dict:
    """A JSON object from `path`; {} where there is none (or it is not one)."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def init_params(config):
    """Host (NumPy) parameters for `config` from `train.init_from`, in the layout training
    uses (stacked when model.scan_layers); every tensor's shape checked against the config
    (an HFError naming the tensor otherwise). train/start.py places them on the mesh."""
    from transformer.model.gpt import stack_layers

    path = config.train.init_from
    where = f"train.init_from={path}"
    model_config = ModelConfig.from_config(config)
    hf.family(model_config, "cannot load Hugging Face weights into it")
    params = hf_weights.from_hf(model_config, read_tensors(path, where), where)
    dtype = np.dtype(model_config.param_dtype) if model_config.param_dtype == "float32" else None
    if dtype is None:  # bfloat16 params: cast through jax's dtype
        import jax.numpy as jnp
        params = _map(lambda x: np.asarray(x).astype(jnp.bfloat16), params)
    if model_config.scan_layers:
        params = _map(np.asarray, stack_layers(params, model_config.n_layers))
    return params


def _map(fn, tree):
    return {k: _map(fn, v) for k, v in tree.items()} if isinstance(tree, dict) else fn(tree)


def vocab_size(path) -> int:
    """The vocabulary of the weights at `path` (rows of the token embedding)."""
    where = f"train.init_from={path}"
    tensors = read_tensors(path, where)
    name = next((n for n in ("transformer.wte.weight", "wte.weight",
                             "model.embed_tokens.weight") if n in tensors), None)
    if name is None:
        raise hf.HFError(f"{where}: no embedding tensor (wte.weight or "
                         "model.embed_tokens.weight) to take model.vocab_size from")
    return int(tensors[name].shape[0])
