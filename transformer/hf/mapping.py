"""Our parameters ↔ Hugging Face `transformers` tensors, for GPT-2, Llama and Qwen3 layouts.

Three of our variants have an exact counterpart in `transformers` (docs/huggingface.md):

    GPT2LMHeadModel   learned positions, pre-norm LayerNorm, GELU (tanh form, "gelu_new") or
                      ReLU, multi-head attention, no window; model.bias=False is written as
                      zero biases (GPT-2 always has them: adding 0 computes the same)
    LlamaForCausalLM  RoPE, pre-norm RMSNorm, SwiGLU, any K/V heads, no window;
                      attention_bias and mlp_bias as model.bias says
    Qwen3ForCausalLM  the same with model.qk_norm (q_norm / k_norm: RMSNorm over the head
                      dim with a learned gain, before RoPE, as ours); its MLP has no biases,
                      so model.bias=False
ReLU² and the logit soft-cap have none: Gemma 2's final_logit_softcapping comes with another
block (embeddings scaled by √D, (1 + g) norm gains, GeGLU, norms after each sub-layer), and
NanoChatForCausalLM (ReLU², soft-cap, QK-norm) has norms without gains and QK-norm after
RoPE. Padding ids (model.vocab_used) are cut off: the export has the tokenizer's ids only,
and its softmax is ours, where the padding ids have probability 0.

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

from transformer.config import GPT2_BLOCK, ConfigError, ModelConfig
from transformer.model import rope

NORM_EPS = 1e-5  # model._norm
GPT2_ACTIVATIONS = {"gelu": "gelu_new", "relu": "relu"}  # gelu_new: the tanh approximation
# What HF GPT-2 checkpoints may call the activation our GELU computes (the same formula).
_TANH_GELU = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")


class HFError(ConfigError):
    """A model, folder or tensor that cannot be mapped; the message names the field or tensor."""


def family(mc: ModelConfig, what: str = "cannot export to Hugging Face format") -> str:
    """"gpt2", "llama" or "qwen3": the `transformers` architecture that computes exactly what
    `mc` does. Raises HFError naming the first field that has no counterpart."""
    def refuse(field, value, need):
        raise HFError(f"model.{field}={value!r}: {what}; {need}")

    if mc.mlp == "relu2":
        refuse("mlp", mc.mlp, "no transformers class computes ReLU² with learned norm gains "
               "(NanoChat's norms have none)")
    if mc.logit_softcap:
        refuse("logit_softcap", mc.logit_softcap, "only Gemma 2/3 and NanoChat soft-cap logits, "
               "and their blocks differ from ours")
    if mc.norm_placement != "pre":
        refuse("norm_placement", mc.norm_placement, "GPT-2 and Llama are pre-norm")
    if mc.sliding_window:
        refuse("sliding_window", mc.sliding_window, "GPT-2 and Llama attend to every position")
    for field in ("value_embeds", "smear", "backout", "x0_lambdas"):  # nanochat's pieces: no counterpart
        if getattr(mc, field) not in ("none", False):
            refuse(field, getattr(mc, field), "GPT-2, Llama and Qwen3 have no such piece")
    if mc.position == "learned":
        if mc.norm != "layernorm":
            refuse("norm", mc.norm, "learned positions export as GPT-2, which needs layernorm")
        if mc.mlp not in GPT2_ACTIVATIONS:
            refuse("mlp", mc.mlp, "learned positions export as GPT-2, which needs gelu or relu")
        if mc.kv_heads != mc.n_heads:
            refuse("n_kv_heads", mc.n_kv_heads, "learned positions export as GPT-2, which needs "
                   "multi-head attention (0)")
        if mc.qk_norm:
            refuse("qk_norm", mc.qk_norm, "learned positions export as GPT-2, which has no "
                   "QK-norm (rope + rmsnorm + swiglu export as Qwen3, which has)")
        return "gpt2"
    if mc.norm != "rmsnorm":
        refuse("norm", mc.norm, "rope exports as Llama or Qwen3, which need rmsnorm")
    if mc.mlp != "swiglu":
        refuse("mlp", mc.mlp, "rope exports as Llama or Qwen3, which need swiglu")
    if mc.qk_norm:
        if mc.bias:
            refuse("bias", mc.bias, "QK-norm exports as Qwen3, whose MLP has no biases: "
                   "needs model.bias=False")
        return "qwen3"
    return "llama"


def hf_config(mc: ModelConfig) -> dict:
    """config.json for `mc` (float32 weights; no special tokens: export.py adds the end of
    text when the tokenizer has one)."""
    common = {"vocab_size": mc.vocab_used or mc.vocab_size,  # padding ids are not exported
              "tie_word_embeddings": mc.tie_embeddings,
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
    rope_like = {"hidden_size": mc.d_model, "num_hidden_layers": mc.n_layers,
                 "num_attention_heads": mc.n_heads, "num_key_value_heads": mc.kv_heads,
                 "head_dim": mc.head_dim, "intermediate_size": mc.mlp_hidden,
                 "hidden_act": "silu", "max_position_embeddings": mc.max_seq_len,
                 "rms_norm_eps": NORM_EPS, "rope_theta": rope.BASE,
                 "rope_parameters": {"rope_type": "default", "rope_theta": rope.BASE},
                 "attention_bias": mc.bias, "attention_dropout": 0.0}
    if family(mc) == "qwen3":
        return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", **common,
                **rope_like, "use_sliding_window": False, "sliding_window": None,
                "max_window_layers": mc.n_layers,
                "layer_types": ["full_attention"] * mc.n_layers}
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **common,
            **rope_like, "mlp_bias": mc.bias}


# Our size fields and the config.json keys they come from.
_GPT2_KEYS = {"vocab_size": "vocab_size", "d_model": "n_embd", "n_layers": "n_layer",
              "n_heads": "n_head", "d_ff": "n_inner", "max_seq_len": "n_positions"}
_LLAMA_KEYS = {"vocab_size": "vocab_size", "d_model": "hidden_size",
               "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
               "d_ff": "intermediate_size", "max_seq_len": "max_position_embeddings"}


def model_config_from_hf(cfg: dict, where: str) -> ModelConfig:
    """Our ModelConfig for a `transformers` config.json (GPT-2 or Llama); refuses settings
    our model computes differently, naming the config.json key. A key missing (Llama's have
    no defaults here) or of the wrong type is refused too: a KeyError or TypeError traceback."""
    try:
        config = _model_config_from_hf(cfg, where)
    except KeyError as e:
        raise HFError(f"{where}: config.json has no {e.args[0]!r}, which the model shape "
                      "needs; copy the folder's config.json again") from None
    except TypeError as e:
        raise HFError(f"{where}: config.json holds a value of the wrong type ({e}); its sizes "
                      "are integers") from None
    keys = _GPT2_KEYS if cfg.get("model_type") == "gpt2" else _LLAMA_KEYS
    for field, key in keys.items():
        value = getattr(config, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise HFError(f"{where}: config.json {key}={cfg.get(key)!r}: must be a positive "
                          f"integer (our model.{field})")
    return config


def _model_config_from_hf(cfg: dict, where: str) -> ModelConfig:
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
        # Every block field spelled out (GPT2_BLOCK), not left to the base values.
        return ModelConfig(**{**GPT2_BLOCK, "tie_embeddings": tie,
                              "mlp": "relu" if act == "relu" else "gelu"},
                           vocab_size=cfg.get("vocab_size", 50257), d_model=D,
                           n_layers=cfg.get("n_layer", 12), n_heads=cfg.get("n_head", 12),
                           d_ff=cfg.get("n_inner") or 4 * D,
                           max_seq_len=cfg.get("n_positions", 1024))
    if kind in ("llama", "qwen3"):
        return _llama_model_config(cfg, tie, refuse, qwen3=kind == "qwen3")
    raise HFError(f"{where}: config.json model_type={kind!r}: only gpt2, llama and qwen3 map "
                  "onto this project's model")


def _llama_model_config(cfg: dict, tie: bool, refuse, qwen3: bool = False) -> ModelConfig:
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
    if qwen3 and cfg.get("use_sliding_window"):
        refuse("use_sliding_window", "our attention sees every position here")
    if qwen3 and cfg.get("attention_bias"):
        refuse("attention_bias", "our model.bias covers the MLP too, which Qwen3 has none in")
    # Biases where either side has them (a missing one loads as zeros: the same numbers).
    bias = not qwen3 and bool(cfg.get("attention_bias", False) or cfg.get("mlp_bias", False))
    return ModelConfig(**{**GPT2_BLOCK, "tie_embeddings": tie, "position": "rope",
                          "norm": "rmsnorm", "mlp": "swiglu", "bias": bias, "qk_norm": qwen3,
                          "n_kv_heads": 0 if cfg.get("num_key_value_heads") in (None, H)
                          else cfg["num_key_value_heads"]},
                       vocab_size=cfg["vocab_size"], d_model=D, n_layers=cfg["num_hidden_layers"],
                       n_heads=H, d_ff=F * 3 // 2, max_seq_len=cfg["max_position_embeddings"])


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
