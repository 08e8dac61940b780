"""Our parameters ↔ Hugging Face `transformers` tensors, for GPT-2 and Llama layouts.

Two of our variants have an exact counterpart in `transformers` (docs/huggingface.md):

    GPT2LMHeadModel   learned positions, pre-norm LayerNorm, GELU (tanh form, "gelu_new") or
                      ReLU, multi-head attention, no window
    LlamaForCausalLM  RoPE, pre-norm RMSNorm, SwiGLU, any K/V heads, no window; written with
                      attention_bias and mlp_bias on, because our denses always carry biases

Both use our norm epsilon 1e-5 and, for Llama, RoPE base 10000 in the rotate-half layout
(rope.py pairs dimension i with i + K/2, which is `rotate_half`: no permutation needed).
Anything else is refused with one line naming the field, before anything is written.

Layouts: our kernels are [in, out...] with heads split out (query [D, H, K], out [H, K, D]).
GPT-2's Conv1D weights are [in, out] too, with Q, K and V fused into c_attn [D, 3D]; Llama's
nn.Linear weights are [out, in] (transposed). Heads are head-major in every layout.

    tensors = to_hf(model_config, params)                 {name: float32 array}, for safetensors
    params  = from_hf(model_config, tensors, where)       our tree; checks every shape
"""

from __future__ import annotations

from transformer.config import ConfigError, ModelConfig
from transformer.model import rope

NORM_EPS = 1e-5  # model._norm
GPT2_ACTIVATIONS = {"gelu": "gelu_new", "relu": "relu"}  # gelu_new: the tanh approximation
# What HF GPT-2 checkpoints may call the activation our GELU computes (the same formula).
_TANH_GELU = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")


class HFError(ConfigError):
    """A model, folder or tensor that cannot be mapped; the message names the field or tensor."""


def family(mc: ModelConfig, what: str = "cannot export to Hugging Face format") -> str:
    """"gpt2" or "llama": the `transformers` architecture that computes exactly what `mc` does.
    Raises HFError naming the first field that has no counterpart."""
    def refuse(field, value, need):
        raise HFError(f"model.{field}={value!r}: {what}; {need}")

    if mc.norm_placement != "pre":
        refuse("norm_placement", mc.norm_placement, "GPT-2 and Llama are pre-norm")
    if mc.sliding_window:
        refuse("sliding_window", mc.sliding_window, "GPT-2 and Llama attend to every position")
    if mc.position == "learned":
        if mc.norm != "layernorm":
            refuse("norm", mc.norm, "learned positions export as GPT-2, which needs layernorm")
        if mc.mlp not in GPT2_ACTIVATIONS:
            refuse("mlp", mc.mlp, "learned positions export as GPT-2, which needs gelu or relu")
        if mc.kv_heads != mc.n_heads:
            refuse("n_kv_heads", mc.n_kv_heads, "learned positions export as GPT-2, which needs "
                   "multi-head attention (0)")
        return "gpt2"
    if mc.norm != "rmsnorm":
        refuse("norm", mc.norm, "rope exports as Llama, which needs rmsnorm")
    if mc.mlp != "swiglu":
        refuse("mlp", mc.mlp, "rope exports as Llama, which needs swiglu")
    return "llama"


def hf_config(mc: ModelConfig) -> dict:
    """config.json for `mc` (float32 weights; no special tokens: export.py adds the end of
    text when the tokenizer has one)."""
    common = {"vocab_size": mc.vocab_size, "tie_word_embeddings": mc.tie_embeddings,
              "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
              "dtype": "float32", "torch_dtype": "float32", "use_cache": True}
    if family(mc) == "gpt2":
        return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", **common,
                "n_embd": mc.d_model, "n_layer": mc.n_layers, "n_head": mc.n_heads,
                "n_inner": mc.d_ff, "n_positions": mc.max_seq_len,
                "activation_function": GPT2_ACTIVATIONS[mc.mlp],
                "layer_norm_epsilon": NORM_EPS, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
                "attn_pdrop": 0.0, "scale_attn_weights": True,
                "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False}
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **common,
            "hidden_size": mc.d_model, "num_hidden_layers": mc.n_layers,
            "num_attention_heads": mc.n_heads, "num_key_value_heads": mc.kv_heads,
            "head_dim": mc.head_dim, "intermediate_size": mc.mlp_hidden, "hidden_act": "silu",
            "max_position_embeddings": mc.max_seq_len, "rms_norm_eps": NORM_EPS,
            "rope_theta": rope.BASE,
            "rope_parameters": {"rope_type": "default", "rope_theta": rope.BASE},
            "attention_bias": True, "mlp_bias": True, "attention_dropout": 0.0}


def model_config_from_hf(cfg: dict, where: str) -> ModelConfig:
    """Our ModelConfig for a `transformers` config.json (GPT-2 or Llama); refuses settings
    our model computes differently, naming the config.json key."""
    def refuse(key, need):
        raise HFError(f"{where}: config.json {key}={cfg.get(key)!r}: {need}")

    kind = cfg.get("model_type")
    tie = bool(cfg.get("tie_word_embeddings", kind == "gpt2"))
    if kind == "gpt2":
        act = cfg.get("activation_function", "gelu_new")
        if act not in _TANH_GELU + ("relu",):
            refuse("activation_function", "our MLP computes gelu_new (tanh GELU) or relu")
        if abs(cfg.get("layer_norm_epsilon", NORM_EPS) - NORM_EPS) > 1e-12:
            refuse("layer_norm_epsilon", f"our LayerNorm uses {NORM_EPS}")
        if cfg.get("scale_attn_by_inverse_layer_idx") or not cfg.get("scale_attn_weights", True):
            refuse("scale_attn_by_inverse_layer_idx", "our attention scales by 1/sqrt(d_k) only")
        D = cfg.get("n_embd", 768)
        return ModelConfig(vocab_size=cfg.get("vocab_size", 50257), d_model=D,
                           n_layers=cfg.get("n_layer", 12), n_heads=cfg.get("n_head", 12),
                           d_ff=cfg.get("n_inner") or 4 * D,
                           max_seq_len=cfg.get("n_positions", 1024), tie_embeddings=tie,
                           mlp="relu" if act == "relu" else "gelu")
    if kind == "llama":
        return _llama_model_config(cfg, tie, refuse)
    raise HFError(f"{where}: config.json model_type={kind!r}: only gpt2 and llama map onto "
                  "this project's model")


def _llama_model_config(cfg: dict, tie: bool, refuse) -> ModelConfig:
    rope_params = cfg.get("rope_parameters") or {}
    theta = rope_params.get("rope_theta", cfg.get("rope_theta", rope.BASE))
    if rope_params.get("rope_type", "default") != "default" or cfg.get("rope_scaling"):
        refuse("rope_parameters", "only plain RoPE (rope_type default) is implemented here")
    if theta != rope.BASE:
        refuse("rope_theta", f"our RoPE base is {rope.BASE:g}")
    if abs(cfg.get("rms_norm_eps", 1e-6) - NORM_EPS) > 1e-12:
        refuse("rms_norm_eps", f"our RMSNorm uses {NORM_EPS}")
    if cfg.get("hidden_act", "silu") != "silu":
        refuse("hidden_act", "our SwiGLU gates with silu")
    D, H = cfg["hidden_size"], cfg["num_attention_heads"]
    if cfg.get("head_dim") not in (None, D // H):
        refuse("head_dim", f"our head dim is hidden_size / num_attention_heads = {D // H}")
    F = cfg["intermediate_size"]
    if F % 8:
        refuse("intermediate_size", "our SwiGLU width is a multiple of 8")
    return ModelConfig(vocab_size=cfg["vocab_size"], d_model=D, n_layers=cfg["num_hidden_layers"],
                       n_heads=H, d_ff=F * 3 // 2, max_seq_len=cfg["max_position_embeddings"],
                       tie_embeddings=tie, position="rope", norm="rmsnorm", mlp="swiglu",
                       n_kv_heads=0 if cfg.get("num_key_value_heads") in (None, H)
                       else cfg["num_key_value_heads"])


def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-in for each byte (the ByteLevel pre-tokenizer's mapping)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]
