"""Side-by-side speed against the PyTorch peer: Hugging Face `transformers` GPT-2 at the same shape.

    pip install -e '.[bench]'                       # CPU torch 2.13.0 and transformers
    python -m transformer.bench                     # configs/bench.py: a table with ratios
    python -m transformer.bench --json              # one JSON object
    python -m transformer.bench --config=configs/tiny.py --rounds=1 --steps=2 --no_peer

One process measures, in alternating rounds so that both sides see the same machine:
- training: tokens/s and step time of `Trainer.step_fn` (the loop `train.py` runs) in float32
  (`model.matmul = fast_f32`, or --f32_matmul=plain) and in bf16-input mixed precision
  (`fast_bf16`), against the peer's eager PyTorch step (forward, backward, clipping, AdamW);
  both of our modes start from the same weights and see the same batches, so their val losses
  after the run compare (`val_loss_ratio_bf16`);
- decoding: `decode.generate_tokens` (prefill + one compiled scan) against HF `generate` with
  its KV cache, greedy, batch 1 and 8, --new_tokens after a --prompt_len prompt; the decode
  model's context is the next power of two that holds both (the same for the peer);
- prefill latency: the same programs asked for one new token;
- compile time and compile counts (from JAX's compile events: after warm-up there must be none);
- MFU against a measured matmul peak on CPU, the datasheet on accelerators (metrics.py);
- peak memory: the train step's compiled buffer sizes, and the process's peak RSS.
Timings are wall-clock around each step after `block_until_ready`; we report medians and the
spread (min, max) over all repetitions.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from ml_collections import config_flags

from transformer import cli, config as config_lib, data, decode, flops, kernels, metrics, training
from transformer.config import ModelConfig

_HERE = Path(__file__).resolve().parent.parent
_CONFIG = config_flags.DEFINE_config_file(
    "config", str(_HERE / "configs" / "bench.py"), "A config file (Python, get_config()).",
    lock_config=True)
_JSON = flags.DEFINE_bool("json", False, "Print one JSON object instead of a table.")
_NO_PEER = flags.DEFINE_bool("no_peer", False, "Skip the PyTorch peer (it needs the bench extra).")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Alternating rounds (ours, peer) per measurement.")
_STEPS = flags.DEFINE_integer("steps", 5, "Timed training steps per round.")
_WARMUP = flags.DEFINE_integer("warmup", 2, "Untimed training steps before the first round.")
_DECODE_REPS = flags.DEFINE_integer("decode_reps", 2, "Timed generations per round.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 16, "Prompt tokens before decoding.")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 256, "Tokens to decode.")
_F32_MATMUL = flags.DEFINE_enum("f32_matmul", "fast_f32", ["plain", "fast_f32"],
                                "model.matmul of the float32 training mode.")
_MODES = flags.DEFINE_list("modes", ["f32", "bf16"], "Training modes: f32 and/or bf16.")


class CompileCounter:
    """Counts XLA compilations (and their seconds) per phase, from JAX's monitoring events."""

    def __init__(self):
        self.phase, self.counts, self.seconds, self.names = "setup", {}, {}, {}
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            self.names.setdefault(self.phase, []).append(kwargs.get("fun_name", "?"))
            self.counts[self.phase] = self.counts.get(self.phase, 0) + 1
            self.seconds[self.phase] = self.seconds.get(self.phase, 0.0) + duration


def _timed(fn):
    begin = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - begin


def _stats(times):
    return {"median": float(np.median(times)), "min": float(np.min(times)),
            "max": float(np.max(times)), "n": len(times)}


# --- ours ------------------------------------------------------------------------------------

class OurTraining:
    """Timed steps of the project's own jitted train step."""

    def __init__(self, config, batches, counter, name):
        self.trainer = training.Trainer.build(config)
        self.state = self.trainer.init(config.train.seed)  # as train.py builds it
        self.batches, self.counter, self.name, self.i, self.times = batches, counter, name, 0, []
        counter.phase = f"train_{name}"
        self.first_step_s = self._step()  # compile + one step
        self.compile_s = counter.seconds.get(counter.phase, 0.0)

    def _step(self):
        batch = self.batches[self.i % len(self.batches)]
        self.i += 1
        begin = time.perf_counter()
        self.state, out = self.trainer.step_fn(self.state, batch)
        jax.block_until_ready((self.state, out))
        return time.perf_counter() - begin

    def run(self, n, timed=True):
        self.counter.phase = "steady"
        for _ in range(n):
            t = self._step()
            if timed:
                self.times.append(t)
        self.counter.phase = "other"

    def memory_mb(self):
        """Arguments + outputs + temporaries of the compiled step, less what donation reuses."""
        self.counter.phase = "analysis"
        try:
            m = self.trainer.step_fn.lower(self.state, self.batches[0]).compile().memory_analysis()
            total = (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
                     - m.alias_size_in_bytes)
            return total / 2**20
        except Exception:  # noqa: BLE001 - not every backend reports it
            return None


class OurDecoding:
    """`decode.generate_tokens` (prefill + scan), greedy, a fresh donated cache per call."""

    def __init__(self, model_config, params, batch, prompt_len, new_tokens, counter):
        self.config, self.params, self.batch, self.counter = model_config, params, batch, counter
        rng = np.random.default_rng(batch)
        self.prompt_BP = jnp.asarray(rng.integers(1, model_config.vocab_size,
                                                  (batch, prompt_len)), jnp.int32)
        self.start_B = jnp.zeros((batch,), jnp.int32)
        self.new_tokens = new_tokens
        self.args = (jax.random.key(0), jnp.float32(0.0), jnp.int32(0), jnp.float32(1.0),
                     jnp.int32(-1))

    def generate(self, new_tokens):
        cache = decode.new_cache(config=self.config, batch=self.batch)
        jax.block_until_ready(cache)
        return _timed(lambda: decode.generate_tokens(
            self.params, cache, self.prompt_BP, self.start_B, *self.args, config=self.config,
            max_new_tokens=new_tokens)[0])


# --- the PyTorch peer ----------------------------------------------------------------------

class PeerModel:
    """Hugging Face GPT-2 at our shape, random weights, eager CPU PyTorch, no dropout."""

    def __init__(self, model_config: ModelConfig, train_config, seq_len: int):
        import torch
        import transformers

        self.torch = torch
        transformers.logging.set_verbosity_error()
        torch.manual_seed(0)
        m = model_config
        cfg = transformers.GPT2Config(
            vocab_size=m.vocab_size, n_positions=seq_len, n_embd=m.d_model, n_layer=m.n_layers,
            n_head=m.n_heads, n_inner=m.d_ff, activation_function="gelu_new", resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=m.tie_embeddings,
            layer_norm_epsilon=1e-5, bos_token_id=None, eos_token_id=None)
        self.model = transformers.GPT2LMHeadModel(cfg)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=train_config.lr,
                                     betas=(train_config.b1, train_config.b2),
                                     weight_decay=train_config.weight_decay)
        self.grad_clip = train_config.grad_clip
        self.train_times, self.loss = [], None

    def train_step(self, batch):
        torch, model = self.torch, self.model
        model.train()
        inputs = torch.from_numpy(np.array(batch["inputs"])).long()
        targets = torch.from_numpy(np.array(batch["targets"])).long()
        begin = time.perf_counter()
        logits = model(input_ids=inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 targets.reshape(-1))
        loss.backward()
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), self.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.loss = loss.item()
        return time.perf_counter() - begin

    def generate(self, prompt_BP, new_tokens):
        torch = self.torch
        self.model.eval()
        ids = torch.from_numpy(np.array(prompt_BP)).long()
        with torch.no_grad():
            begin = time.perf_counter()
            self.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                max_new_tokens=new_tokens, use_cache=True, pad_token_id=0)
            return time.perf_counter() - begin


# --- the run -------------------------------------------------------------------------------

def _decode_config(model_config: ModelConfig, prompt_len: int, new_tokens: int) -> ModelConfig:
    context = model_config.max_seq_len
    while context < prompt_len + new_tokens:
        context *= 2
    return dataclasses.replace(model_config, max_seq_len=context)


def run(config, *, peer=True, rounds=3, steps=5, warmup=2, decode_reps=2, prompt_len=16,
        new_tokens=256, f32_matmul="fast_f32", modes=("f32", "bf16"), log=lambda s: None) -> dict:
    """Runs every measurement; returns the figures as a JSON-able dict."""
    counter = CompileCounter()
    config = config_lib.validate(config)
    total_steps = 1 + warmup + rounds * steps
    config.train.steps = total_steps  # the schedule every mode (and the peer's lr) follows
    tokenizer, source = data.load(config)
    training.resolve(config, tokenizer)
    t = config.train
    batches = [jax.device_put(source.batch(t.seed, "train", i, t.batch_size))
               for i in range(total_steps)]  # made up front: data loading is not timed
    model_config = ModelConfig.from_config(config)
    T, B = model_config.max_seq_len, t.batch_size
    tokens_per_step = B * T
    out = {"config": config_lib.to_dict(config), "machine": _machine(), "rounds": rounds,
           "steps_per_round": steps}

    log("measuring the matmul peak")
    peak_f32, source_f32 = metrics.peak_flops("float32")
    peak_bf16, source_bf16 = metrics.peak_flops("bfloat16")
    out.update(peak_flops_f32=peak_f32, peak_flops_bf16=peak_bf16, peak_source=source_f32)

    # On CPU the modes are the fast path's (kernels/); on GPU/TPU XLA's own kernels and
    # autodiff, with bfloat16 compute (model.dtype) for the mixed mode.
    on_cpu = jax.devices()[0].platform == "cpu"
    mode_matmul = {"f32": f32_matmul if on_cpu else "plain",
                   "bf16": "fast_bf16" if on_cpu else "plain"}
    ours = {}
    for mode in modes:
        cfg = config_lib.from_dict(config_lib.to_dict(config))
        cfg.model.matmul = mode_matmul[mode]
        if mode == "bf16" and not on_cpu:
            cfg.model.dtype = "bfloat16"
        log(f"compiling the train step ({mode}, model.matmul={cfg.model.matmul})")
        ours[mode] = OurTraining(cfg, batches, counter, mode)
        ours[mode].run(warmup, timed=False)
    peer_model = None
    if peer:
        peer_model = PeerModel(model_config, t, T)
        for i in range(1 + warmup):
            peer_model.train_step(batches[i])
    for r in range(rounds):
        log(f"training round {r + 1}/{rounds}")
        for mode in modes:
            ours[mode].run(steps)
        if peer_model:
            for i in range(steps):
                peer_model.train_times.append(
                    peer_model.train_step(batches[1 + warmup + r * steps + i]))

    flops_per_token = flops.train_flops_per_token(model_config)
    out["flops_per_token"] = flops_per_token
    out["tokens_per_step"] = tokens_per_step
    val = {}
    for mode, run_ in ours.items():
        step_s = _stats(run_.times)
        suffix = "" if mode == "f32" else "_bf16"
        tps = tokens_per_step / step_s["median"]
        peak = peak_f32 if mode == "f32" else peak_bf16
        out[f"train_tokens_per_s{suffix}"] = tps
        out[f"train_step_s{suffix}"] = step_s
        out[f"compile_s{suffix}"] = run_.compile_s
        out[f"first_step_s{suffix}"] = run_.first_step_s
        out[f"mfu{suffix}"] = metrics.mfu(tps, flops_per_token, peak)
        out[f"matmul{suffix}"] = run_.trainer.model_config.matmul
        counter.phase = "eval"
        val[mode] = training.evaluate(run_.trainer, run_.state.params, source, t.seed)
        out[f"val_loss{suffix}"] = val[mode]
    if "f32" in val and "bf16" in val:
        out["val_loss_ratio_bf16"] = val["bf16"] / val["f32"]
    if "f32" in ours:
        out["train_step_memory_mb"] = ours["f32"].memory_mb()
    if peer_model:
        step_s = _stats(peer_model.train_times)
        out["peer_train_tokens_per_s"] = tokens_per_step / step_s["median"]
        out["peer_train_step_s"] = step_s
        out["peer_mfu"] = metrics.mfu(out["peer_train_tokens_per_s"], flops_per_token, peak_f32)

    counter.phase = "other"
    # Decoding: a model with room for prompt + new tokens, random weights (speed only).
    dec_config = _decode_config(model_config, prompt_len, new_tokens)
    params = training.init_params(dec_config, jax.random.key(t.seed))
    out["decode_context"] = dec_config.max_seq_len
    out["decode_matmul"] = dec_config.matmul
    peer_dec = PeerModel(dec_config, t, dec_config.max_seq_len) if peer else None
    for batch in (1, 8):
        counter.phase = "other"
        # What the decode loop actually runs at this batch (one row keeps float32 weights).
        out[f"decode_matmul_b{batch}"] = kernels.decode_matmul(dec_config, batch)
        ours_dec = OurDecoding(dec_config, params, batch, prompt_len, new_tokens, counter)
        counter.phase = f"decode_b{batch}"
        log(f"compiling decode, batch {batch}")
        out[f"decode_compile_s_b{batch}"] = ours_dec.generate(new_tokens)
        counter.phase = f"prefill_b{batch}"
        ours_dec.generate(1)
        counter.phase = "other"
        if peer_dec:
            peer_dec.generate(ours_dec.prompt_BP, new_tokens)  # warm-up
        counter.phase = "steady"
        times, prefill, peer_times, peer_prefill = [], [], [], []
        for r in range(rounds):
            log(f"decode round {r + 1}/{rounds}, batch {batch}")
            for _ in range(decode_reps):
                times.append(ours_dec.generate(new_tokens))
                prefill.append(ours_dec.generate(1))
            if peer_dec:
                for _ in range(decode_reps):
                    peer_times.append(peer_dec.generate(ours_dec.prompt_BP, new_tokens))
                    peer_prefill.append(peer_dec.generate(ours_dec.prompt_BP, 1))
        out[f"decode_tokens_per_s_b{batch}"] = batch * new_tokens / np.median(times)
        out[f"decode_s_b{batch}"] = _stats(times)
        out[f"prefill_s_b{batch}"] = _stats(prefill)
        if peer_dec:
            out[f"peer_decode_tokens_per_s_b{batch}"] = batch * new_tokens / np.median(peer_times)
            out[f"peer_decode_s_b{batch}"] = _stats(peer_times)
            out[f"peer_prefill_s_b{batch}"] = _stats(peer_prefill)
        counter.phase = "other"

    out["compiles"] = dict(counter.counts)
    out["compile_seconds"] = {k: round(v, 3) for k, v in counter.seconds.items()}
    out["recompiles_after_warmup"] = counter.counts.get("steady", 0)
    out["recompiled"] = sorted(set(counter.names.get("steady", [])))
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    device = jax.devices()[0]
    if device.platform != "cpu" and device.memory_stats():
        out["device_peak_memory_mb"] = device.memory_stats().get("peak_bytes_in_use", 0) / 2**20
    for key in ("train_tokens_per_s", "train_tokens_per_s_bf16", "decode_tokens_per_s_b1",
                "decode_tokens_per_s_b8"):
        peer_key = "peer_" + key.replace("_bf16", "")
        if key in out and peer_key in out:
            out["ratio_" + key] = out[key] / out[peer_key]
    return out


def _machine() -> dict:
    device = jax.devices()[0]
    info = {"platform": device.platform, "device_kind": device.device_kind,
            "device_count": jax.device_count(), "cpu_count": os.cpu_count(),
            "python": platform.python_version(), "jax": jax.__version__,
            "xla_flags": os.environ.get("XLA_FLAGS", "")}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import torch
        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    return info


def format_table(r: dict) -> str:
    """The figures as a small text table with ratios (ours / peer)."""
    m, mc = r["machine"], r["config"]["model"]
    lines = [f"machine: {m.get('cpu', m['device_kind'])} ({m['platform']}, {m['cpu_count']} cpus), "
             f"jax {m['jax']}, torch {m.get('torch', '-')}",
             f"shape: {mc['n_layers']} layers, {mc['n_heads']} heads, d_model {mc['d_model']}, "
             f"context {mc['max_seq_len']}, batch {r['config']['train']['batch_size']}, "
             f"vocab {mc['vocab_size']}; decode context {r['decode_context']}",
             f"peak matmul: {r['peak_flops_f32'] / 1e9:.0f} GFLOP/s f32, "
             f"{r['peak_flops_bf16'] / 1e9:.0f} bf16-in/f32-acc ({r['peak_source']})",
             "", f"{'':38}{'ours':>10}{'peer':>10}{'ratio':>8}"]

    def row(label, key, peer_key=None, fmt="{:,.0f}"):
        if key not in r:
            return
        peer = r.get(peer_key) if peer_key else None
        lines.append(f"{label:38}{fmt.format(r[key]):>10}"
                     f"{fmt.format(peer) if peer else '-':>10}"
                     f"{f'{r[key] / peer:.2f}x' if peer else '':>8}")

    row(f"train tokens/s, f32 ({r.get('matmul', '')})", "train_tokens_per_s",
        "peer_train_tokens_per_s")
    row("train tokens/s, bf16 mixed", "train_tokens_per_s_bf16", "peer_train_tokens_per_s")
    row(f"decode tokens/s, batch 1 ({r.get('decode_matmul_b1', '')})", "decode_tokens_per_s_b1",
        "peer_decode_tokens_per_s_b1")
    row(f"decode tokens/s, batch 8 ({r.get('decode_matmul_b8', '')})", "decode_tokens_per_s_b8",
        "peer_decode_tokens_per_s_b8")
    for b in (1, 8):
        if f"prefill_s_b{b}" in r:
            peer = r.get(f"peer_prefill_s_b{b}", {}).get("median")
            lines.append(f"{f'prefill+1 token ms, batch {b}':38}"
                         f"{r[f'prefill_s_b{b}']['median'] * 1e3:>10.1f}"
                         f"{f'{peer * 1e3:.1f}' if peer else '-':>10}")
    lines.append("")
    for suffix, name in (("", "f32"), ("_bf16", "bf16")):
        if f"train_step_s{suffix}" in r:
            s = r[f"train_step_s{suffix}"]
            lines.append(f"{name}: step {s['median'] * 1e3:.0f} ms (min {s['min'] * 1e3:.0f}, "
                         f"max {s['max'] * 1e3:.0f}, n {s['n']}), MFU {r[f'mfu{suffix}']:.1%}, "
                         f"compile {r[f'compile_s{suffix}']:.1f}s, val loss "
                         f"{r[f'val_loss{suffix}']:.4f}")
    if "peer_mfu" in r:
        lines.append(f"peer: MFU {r['peer_mfu']:.1%} (of the f32 peak)")
    if "val_loss_ratio_bf16" in r:
        lines.append(f"val loss bf16 / f32: {r['val_loss_ratio_bf16']:.4f}")
    lines.append(f"compiles: {r['compiles']}; after warm-up: {r['recompiles_after_warmup']}")
    mem = r.get("train_step_memory_mb")
    lines.append(f"memory: train step {f'{mem:.0f} MB' if mem else 'n/a'}, "
                 f"process peak RSS {r['peak_rss_mb']:.0f} MB")
    return "\n".join(lines)


def main(argv):
    if len(argv) > 1:
        cli.fail(f"unexpected arguments {argv[1:]}: flags look like --name=value")
    modes = tuple(_MODES.value)
    if not modes or set(modes) - {"f32", "bf16"}:
        cli.fail(f"--modes={','.join(modes)}: give f32, bf16 or f32,bf16")
    if not _NO_PEER.value:
        try:
            import torch  # noqa: F401
            import transformers  # noqa: F401
        except ImportError:
            cli.fail("the PyTorch peer needs torch and transformers: pip install -e '.[bench]' "
                     "(or pass --no_peer)")
    log = (lambda s: None) if _JSON.value else (lambda s: print(f"... {s}", file=sys.stderr))
    result = run(cli.config_value(_CONFIG), peer=not _NO_PEER.value, rounds=_ROUNDS.value,
                 steps=_STEPS.value, warmup=_WARMUP.value, decode_reps=_DECODE_REPS.value,
                 prompt_len=_PROMPT_LEN.value, new_tokens=_NEW_TOKENS.value, f32_matmul=_F32_MATMUL.value,
                 modes=modes, log=log)
    print(json.dumps(result) if _JSON.value else format_table(result))


if __name__ == "__main__":
    cli.run(main)
