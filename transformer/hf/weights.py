"""Tensor by tensor: our parameter tree ↔ the state dict of GPT2LMHeadModel / LlamaForCausalLM
(Qwen3ForCausalLM: Llama's names plus self_attn.q_norm / k_norm for attn.q_norm / k_norm).

    ours (block i)             GPT-2 (Conv1D [in, out])      Llama (Linear [out, in])
    embed.embedding [V, D]     transformer.wte               model.embed_tokens
    pos_embed [T, D]           transformer.wpe               -
    ln_attn, ln_mlp            h.i.ln_1, h.i.ln_2            layers.i.input_layernorm,
                                                             .post_attention_layernorm
    attn.query|key|value       h.i.attn.c_attn [D, 3D]:      self_attn.q|k|v_proj
      [D, H, K]                  Q, K, V side by side          [H·K, D] (transposed)
    attn.out [H, K, D]         h.i.attn.c_proj [D, D]        self_attn.o_proj [D, H·K]
    mlp.expand | gate [D, F]   h.i.mlp.c_fc | -              mlp.up_proj | gate_proj
    mlp.project [F, D]         h.i.mlp.c_proj                mlp.down_proj
    ln_final                   transformer.ln_f              model.norm
    head [D, V] (untied)       lm_head [V, D]                lm_head [V, D]

Our kernel / embedding / scale leaves become `<name>.weight`, biases `<name>.bias`. Our params here are the unrolled
layout (block_0, block_1, ...); model.stack_layers / unstack_layers convert.
"""

from __future__ import annotations

import numpy as np

from transformer.config import ModelConfig
from transformer.hf.mapping import HFError, family


def to_hf(mc: ModelConfig, params) -> dict[str, np.ndarray]:
    """HF tensor name → float32 array (contiguous, ready for safetensors). Padding ids
    (model.vocab_used) are left out: their rows of the embedding and the head."""
    p = _np(params)
    n = mc.vocab_used or mc.vocab_size
    p["embed"] = {"embedding": p["embed"]["embedding"][:n]}
    out = _to_gpt2(mc, p) if family(mc) == "gpt2" else _to_llama(mc, p)
    if not mc.tie_embeddings:
        out["lm_head.weight"] = p["head"]["kernel"][:, :n].T
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def _bias(layer, *shape):
    """A layer's bias; zeros for a model without biases (GPT-2 always has them: + 0 is the
    same computation)."""
    return layer["bias"] if "bias" in layer else np.zeros(shape, np.float32)


def _np(tree):
    if isinstance(tree, dict):
        return {k: _np(v) for k, v in tree.items()}
    return np.asarray(tree, dtype=np.float32)


def _to_gpt2(mc, p):
    D, F = mc.d_model, mc.d_ff
    out = {"transformer.wte.weight": p["embed"]["embedding"],
           "transformer.wpe.weight": p["pos_embed"],
           "transformer.ln_f.weight": p["ln_final"]["scale"],
           "transformer.ln_f.bias": _bias(p["ln_final"], D)}
    for i in range(mc.n_layers):
        b, h = p[f"block_{i}"], f"transformer.h.{i}."
        a, m = b["attn"], b["mlp"]
        qkv = [a[n] for n in ("query", "key", "value")]
        out.update({
            h + "ln_1.weight": b["ln_attn"]["scale"], h + "ln_1.bias": _bias(b["ln_attn"], D),
            h + "attn.c_attn.weight": np.concatenate([x["kernel"].reshape(D, D) for x in qkv], 1),
            h + "attn.c_attn.bias": np.concatenate([_bias(x, D).reshape(D) for x in qkv]),
            h + "attn.c_proj.weight": a["out"]["kernel"].reshape(D, D),
            h + "attn.c_proj.bias": _bias(a["out"], D),
            h + "ln_2.weight": b["ln_mlp"]["scale"], h + "ln_2.bias": _bias(b["ln_mlp"], D),
            h + "mlp.c_fc.weight": m["expand"]["kernel"],
            h + "mlp.c_fc.bias": _bias(m["expand"], F),
            h + "mlp.c_proj.weight": m["project"]["kernel"],
            h + "mlp.c_proj.bias": _bias(m["project"], D)})
    return out


_LLAMA_ATTN = (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj"))
_LLAMA_MLP = (("expand", "up_proj"), ("gate", "gate_proj"), ("project", "down_proj"))


def _to_llama(mc, p):
    D = mc.d_model
    out = {"model.embed_tokens.weight": p["embed"]["embedding"],
           "model.norm.weight": p["ln_final"]["scale"]}
    for i in range(mc.n_layers):
        b, h = p[f"block_{i}"], f"model.layers.{i}."
        a, m = b["attn"], b["mlp"]
        out[h + "input_layernorm.weight"] = b["ln_attn"]["scale"]
        out[h + "post_attention_layernorm.weight"] = b["ln_mlp"]["scale"]
        for ours, theirs in _LLAMA_ATTN:
            out[h + f"self_attn.{theirs}.weight"] = a[ours]["kernel"].reshape(D, -1).T
            if mc.bias:
                out[h + f"self_attn.{theirs}.bias"] = a[ours]["bias"].reshape(-1)
        out[h + "self_attn.o_proj.weight"] = a["out"]["kernel"].reshape(-1, D).T
        if mc.qk_norm:  # Qwen3
            out[h + "self_attn.q_norm.weight"] = a["q_norm"]["scale"]
            out[h + "self_attn.k_norm.weight"] = a["k_norm"]["scale"]
        if mc.bias:
            out[h + "self_attn.o_proj.bias"] = a["out"]["bias"]
        for ours, theirs in _LLAMA_MLP:
            out[h + f"mlp.{theirs}.weight"] = m[ours]["kernel"].T
            if mc.bias:
                out[h + f"mlp.{theirs}.bias"] = m[ours]["bias"]
    return out


class _Reader:
    """Takes tensors by name, checking each shape against what `mc` needs; one-line errors."""

    def __init__(self, tensors: dict, where: str):
        self.where = where
        # Checkpoints saved from the bare GPT2Model have no "transformer." prefix.
        bare = ("h.", "wte.", "wpe.", "ln_f.")
        self.tensors = {"transformer." + k if k.startswith(bare) else k: v
                        for k, v in tensors.items()}

    def has(self, name):
        return name in self.tensors

    def bias(self, model_has_bias: bool, name, *shape):
        """A bias tensor for a model with biases (zeros when the checkpoint has none); None for
        one without, which can hold a checkpoint's bias only when it is all zeros."""
        if model_has_bias:
            return self(name, *shape, zeros_if_missing=True)
        if self.has(name) and np.any(self(name, *shape)):
            raise HFError(f"{self.where}: tensor {name} is a non-zero bias, which a model with "
                          "model.bias=False cannot hold; set model.bias=True to load it")
        return None

    def __call__(self, name, *shape, zeros_if_missing=False):
        if name not in self.tensors:
            if zeros_if_missing:  # a bias-free checkpoint: our biases start at zero
                return np.zeros(shape, np.float32)
            raise HFError(f"{self.where}: tensor {name} is missing (expected shape "
                          f"{tuple(shape)})")
        x = np.asarray(self.tensors[name], dtype=np.float32)
        if x.shape != tuple(shape):
            raise HFError(f"{self.where}: tensor {name} has shape {x.shape} but the model "
                          f"config needs {tuple(shape)}")
        return x


def from_hf(mc: ModelConfig, tensors: dict, where: str):
    """Our unrolled parameter tree (NumPy float32) from HF tensors. A tied HF checkpoint
    gives an untied model its head from the embedding; the reverse is refused."""
    t = _Reader(tensors, where)
    kind = family(mc, "cannot load Hugging Face weights into it")
    p = _from_gpt2(mc, t) if kind == "gpt2" else _from_llama(mc, t)
    V, D = mc.vocab_size, mc.d_model
    if not mc.tie_embeddings:
        name = "lm_head.weight" if t.has("lm_head.weight") else next(
            n for n in ("transformer.wte.weight", "model.embed_tokens.weight") if t.has(n))
        p["head"] = {"kernel": t(name, V, D).T.copy()}
    elif t.has("lm_head.weight") and not np.array_equal(
            t("lm_head.weight", V, D), p["embed"]["embedding"]):
        raise HFError(f"{where}: tensor lm_head.weight differs from the embedding; set "
                      "model.tie_embeddings=False to load it")
    return p


def _with_bias(layer: dict, bias) -> dict:
    return layer if bias is None else {**layer, "bias": bias}


def _from_gpt2(mc, t):
    V, D, F, H, K = mc.vocab_size, mc.d_model, mc.d_ff, mc.n_heads, mc.head_dim
    bias = lambda name, *shape: t.bias(mc.bias, name, *shape)  # noqa: E731
    p = {"embed": {"embedding": t("transformer.wte.weight", V, D)},
         "pos_embed": t("transformer.wpe.weight", mc.max_seq_len, D),
         "ln_final": _with_bias({"scale": t("transformer.ln_f.weight", D)},
                                bias("transformer.ln_f.bias", D))}
    for i in range(mc.n_layers):
        h = f"transformer.h.{i}."
        w, qkv_b = t(h + "attn.c_attn.weight", D, 3 * D), bias(h + "attn.c_attn.bias", 3 * D)
        attn = {n: _with_bias({"kernel": w[:, j * D:(j + 1) * D].reshape(D, H, K)},
                              None if qkv_b is None else qkv_b[j * D:(j + 1) * D].reshape(H, K))
                for j, n in enumerate(("query", "key", "value"))}
        attn["out"] = _with_bias({"kernel": t(h + "attn.c_proj.weight", D, D).reshape(H, K, D)},
                                 bias(h + "attn.c_proj.bias", D))
        p[f"block_{i}"] = {
            "attn": attn,
            "ln_attn": _with_bias({"scale": t(h + "ln_1.weight", D)}, bias(h + "ln_1.bias", D)),
            "ln_mlp": _with_bias({"scale": t(h + "ln_2.weight", D)}, bias(h + "ln_2.bias", D)),
            "mlp": {"expand": _with_bias({"kernel": t(h + "mlp.c_fc.weight", D, F)},
                                         bias(h + "mlp.c_fc.bias", F)),
                    "project": _with_bias({"kernel": t(h + "mlp.c_proj.weight", F, D)},
                                          bias(h + "mlp.c_proj.bias", D))}}
    return p


def _from_llama(mc, t):
    V, D, F, K = mc.vocab_size, mc.d_model, mc.mlp_hidden, mc.head_dim
    heads = {"query": mc.n_heads, "key": mc.kv_heads, "value": mc.kv_heads}
    p = {"embed": {"embedding": t("model.embed_tokens.weight", V, D)},
         "ln_final": {"scale": t("model.norm.weight", D)}}
    for i in range(mc.n_layers):
        h = f"model.layers.{i}."
        attn = {}
        for ours, theirs in _LLAMA_ATTN:
            n = heads[ours]
            kernel = t(h + f"self_attn.{theirs}.weight", n * K, D)
            b = t.bias(mc.bias, h + f"self_attn.{theirs}.bias", n * K)
            attn[ours] = _with_bias({"kernel": kernel.T.reshape(D, n, K)},
                                    None if b is None else b.reshape(n, K))
        attn["out"] = _with_bias(
            {"kernel": t(h + "self_attn.o_proj.weight", D, mc.n_heads * K).T.reshape(
                mc.n_heads, K, D)}, t.bias(mc.bias, h + "self_attn.o_proj.bias", D))
        if mc.qk_norm:  # Qwen3's per-head RMSNorm gains
            attn["q_norm"] = {"scale": t(h + "self_attn.q_norm.weight", K)}
            attn["k_norm"] = {"scale": t(h + "self_attn.k_norm.weight", K)}
        mlp = {}
        for ours, theirs in _LLAMA_MLP:
            n_in, n_out = (F, D) if ours == "project" else (D, F)
            mlp[ours] = _with_bias({"kernel": t(h + f"mlp.{theirs}.weight", n_out, n_in).T.copy()},
                                   t.bias(mc.bias, h + f"mlp.{theirs}.bias", n_out))
        p[f"block_{i}"] = {"attn": attn, "mlp": mlp,
                           "ln_attn": {"scale": t(h + "input_layernorm.weight", D)},
                           "ln_mlp": {"scale": t(h + "post_attention_layernorm.weight", D)}}
    return p
