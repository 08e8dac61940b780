"""Side-by-side speed against the PyTorch peer: Hugging Face `transformers` GPT-2 at the same shape.

    pip install -e '.[bench]'                       # CPU torch 2.13.0 and transformers
    python -m transformer bench                     # configs/bench.py: a table with ratios
    python -m transformer bench --json              # one JSON object
    python -m transformer bench --config=configs/tiny.py --rounds=1 --steps=2 --no_peer

One process measures, in alternating rounds so that both sides see the same machine:
- training: tokens/s and step time of `Trainer.step_fn` (the loop `train.py` runs) in float32
  and in bf16-input mixed precision, each the fast way the kernel seam knows for this platform
  (`kernels.train_settings`: `fast_f32` / `fast_bf16` on CPU; --f32_matmul=plain asks for
  autodiff), against the peer's eager PyTorch step (forward, backward, clipping, AdamW);
  both of our modes start from the same weights and see the same batches, so their val losses
  after the run compare (`val_loss_ratio_bf16`);
- decoding: `decode.decode_groups` (prefill + compiled `lax.while_loop`s, the rows in as many
  programs at once as `decode.row_groups` picks, what `sample.py` runs) against HF
  `generate` with its KV cache, greedy, batch 1 and 8, --new_tokens after a --prompt_len
  prompt; the decode model's context is the next power of two that holds both (the same
  for the peer);
- prefill latency: the same programs asked for one new token;
- compile time and compile counts (from JAX's compile events: after warm-up there must be none);
- MFU against a measured matmul peak on CPU, the datasheet on accelerators (metrics.py);
- peak memory: the train step's compiled buffer sizes, and the process's peak RSS.
Timings are wall-clock around each step after `block_until_ready`; we report medians and the
spread (min, max) over all repetitions. `run` returns the figures as typed records
(bench_figures.py), which also print them as a table or one JSON object.
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

from transformer import cli, data, host
from transformer import config as config_lib
from transformer.config import ModelConfig
from transformer.generate import decode
from transformer.model import flops, kernels
from transformer.model.gpt import init_params
from transformer.parallel import target as target_lib
from transformer.model.kernels import auto as matmul_auto
from transformer.tools.bench_figures import (
    BenchResult,
    Compiles,
    DecodeFigures,
    PeerTrainFigures,
    Spread,
    TrainFigures,
    format_table,
)
from transformer.train import metrics, scratch
from transformer.train import trainer as training
from transformer.train.resolve import resolve

_HERE = Path(__file__).resolve().parents[2]  # the checkout: transformer/tools/ -> .
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
_RECORD = flags.DEFINE_string("record", None, "Append the figures as one line to this JSON "
                               "Lines file (docs/records/bench.jsonl; docs/records.md).")
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


def minor_faults() -> int:
    """This process's minor page faults so far (pages the kernel mapped in and zeroed)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _timed(fn):
    begin = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - begin


# --- ours ------------------------------------------------------------------------------------

class OurTraining:
    """Timed steps of the project's own jitted train step."""

    def __init__(self, config, batches, counter, name):
        self.trainer = training.Trainer.build(config)
        self.state = self.trainer.init(config.train.seed)  # as train.py builds it
        self.batches, self.counter, self.name, self.i, self.times = batches, counter, name, 0, []
        self.faults = []  # minor page faults of each timed step (the whole process's)
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
            faults = minor_faults()
            t = self._step()
            if timed:
                self.times.append(t)
                self.faults.append(minor_faults() - faults)
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
    """`decode.decode_groups` (prefill + while loops, `row_groups` programs at once), greedy,
    fresh donated caches per call."""

    def __init__(self, model_config, params, batch, prompt_len, new_tokens, counter):
        self.config, self.params, self.batch, self.counter = model_config, params, batch, counter
        rng = np.random.default_rng(batch)
        self.prompt_BP = jnp.asarray(rng.integers(1, model_config.vocab_size,
                                                  (batch, prompt_len)), jnp.int32)
        self.start_B = jnp.zeros((batch,), jnp.int32)
        self.new_tokens = new_tokens
        self.groups = decode.row_groups(model_config, batch)
        self.args = (jax.random.key(0), jnp.float32(0.0), jnp.int32(0), jnp.float32(1.0),
                     jnp.int32(-1))

    def generate(self, new_tokens):
        caches = decode.new_caches(config=self.config, batch=self.batch, groups=self.groups)
        jax.block_until_ready(caches)
        return _timed(lambda: decode.decode_groups(
            self.params, caches, self.prompt_BP, self.start_B, *self.args,
            jnp.int32(new_tokens), config=self.config,
            budget=decode.token_budget(new_tokens)))


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
        # Decay as optimizer.py does by role: in HF's GPT-2 the matrices (projections,
        # token and position embeddings) are exactly the 2-D tensors; biases and LayerNorm
        # gains are 1-D and not decayed.
        params = list(self.model.parameters())
        groups = [{"params": [p for p in params if p.ndim >= 2]},
                  {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
        self.opt = torch.optim.AdamW(groups, lr=train_config.lr,
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

PRECISION = {"f32": "float32", "bf16": "bfloat16"}  # --modes -> what the matmuls take in


@dataclasses.dataclass(frozen=True)
class Settings:
    """How much to measure (the command line's flags)."""

    peer: bool = True
    rounds: int = 3
    steps: int = 5
    warmup: int = 2
    decode_reps: int = 2
    prompt_len: int = 16
    new_tokens: int = 256
    f32_matmul: str = "fast_f32"
    modes: tuple = ("f32", "bf16")

    @property
    def total_steps(self) -> int:
        return 1 + self.warmup + self.rounds * self.steps


def _decode_config(model_config: ModelConfig, prompt_len: int, new_tokens: int) -> ModelConfig:
    context = model_config.max_seq_len
    while context < prompt_len + new_tokens:
        context *= 2
    return dataclasses.replace(model_config, max_seq_len=context)


def _mode_config(config, mode: str, f32_matmul: str):
    """A copy of `config` that trains in `mode`, the fast way on this platform (the seam's
    choice); --f32_matmul=plain asks for autodiff in float32 instead."""
    settings = kernels.train_settings(PRECISION[mode], jax.devices()[0].platform)
    if mode == "f32" and f32_matmul == "plain":
        settings = {"matmul": "plain"}
    cfg = config_lib.from_dict(config_lib.to_dict(config))
    cfg.model.update(settings)
    return cfg


def _train(config, batches, counter, s: Settings, log):
    """Our modes and the peer, warmed up, then timed in alternating rounds.
    Returns ({mode: OurTraining}, PeerModel or None)."""
    ours = {}
    for mode in s.modes:
        cfg = _mode_config(config, mode, s.f32_matmul)
        log(f"compiling the train step ({mode}, model.matmul={cfg.model.matmul})")
        ours[mode] = OurTraining(cfg, batches, counter, mode)
        ours[mode].run(s.warmup, timed=False)
    peer = None
    if s.peer:
        peer = PeerModel(ModelConfig.from_config(config), config.train, config.model.max_seq_len)
        for i in range(1 + s.warmup):
            peer.train_step(batches[i])
    for r in range(s.rounds):
        log(f"training round {r + 1}/{s.rounds}")
        for mode in s.modes:
            ours[mode].run(s.steps)
        if peer:
            for i in range(s.steps):
                peer.train_times.append(peer.train_step(batches[1 + s.warmup + r * s.steps + i]))
    return ours, peer


def _train_figures(ours: dict, source, counter, tokens_per_step, flops_per_token,
                   peaks) -> dict:
    """{mode: TrainFigures}; evaluates each mode's final params on the validation split."""
    figures = {}
    for mode, run_ in ours.items():
        step_s = Spread.of(run_.times)
        tps = tokens_per_step / step_s.median
        counter.phase = "eval"
        val = training.evaluate(run_.trainer, run_.state.params, source,
                                run_.trainer.config.train.seed)
        figures[mode] = TrainFigures(
            matmul=run_.trainer.model_config.matmul, tokens_per_s=tps, step_s=step_s,
            compile_s=run_.compile_s, first_step_s=run_.first_step_s,
            mfu=metrics.mfu(tps, flops_per_token, peaks[mode]), val_loss=val,
            page_faults_per_step=float(np.median(run_.faults)))
    return figures


def _peer_train_figures(peer, tokens_per_step, flops_per_token, peak_f32):
    if peer is None:
        return None
    step_s = Spread.of(peer.train_times)
    tps = tokens_per_step / step_s.median
    return PeerTrainFigures(tps, step_s, metrics.mfu(tps, flops_per_token, peak_f32))


def _decode(dec_config, params, batch, counter, peer_dec, s: Settings, log) -> DecodeFigures:
    """Greedy decoding at `batch` rows: compile, prefill, then timed rounds against the peer."""
    counter.phase = "other"
    ours = OurDecoding(dec_config, params, batch, s.prompt_len, s.new_tokens, counter)
    counter.phase = f"decode_b{batch}"
    log(f"compiling decode, batch {batch}")
    compile_s = ours.generate(s.new_tokens)
    counter.phase = f"prefill_b{batch}"
    ours.generate(1)
    counter.phase = "other"
    if peer_dec:
        peer_dec.generate(ours.prompt_BP, s.new_tokens)  # warm-up
    counter.phase = "steady"
    times, prefill, peer_times, peer_prefill = [], [], [], []
    for r in range(s.rounds):
        log(f"decode round {r + 1}/{s.rounds}, batch {batch}")
        for _ in range(s.decode_reps):
            times.append(ours.generate(s.new_tokens))
            prefill.append(ours.generate(1))
        for _ in range(s.decode_reps if peer_dec else 0):
            peer_times.append(peer_dec.generate(ours.prompt_BP, s.new_tokens))
            peer_prefill.append(peer_dec.generate(ours.prompt_BP, 1))
    counter.phase = "other"
    peer = {}
    if peer_dec:
        peer = dict(peer_tokens_per_s=batch * s.new_tokens / np.median(peer_times),
                    peer_decode_s=Spread.of(peer_times), peer_prefill_s=Spread.of(peer_prefill))
    return DecodeFigures(kernels.decode_matmul(dec_config, batch), compile_s,
                         batch * s.new_tokens / np.median(times), Spread.of(times),
                         Spread.of(prefill), **peer, groups=ours.groups)


def _device_peak_memory_mb() -> float | None:
    device = jax.devices()[0]
    if device.platform != "cpu" and device.memory_stats():
        return device.memory_stats().get("peak_bytes_in_use", 0) / 2**20
    return None


def run(config, settings: Settings = Settings(), log=lambda s: None) -> BenchResult:
    """Runs every measurement: training, then decoding, with the compile counts throughout."""
    s, counter = settings, CompileCounter()
    # the schedule every mode (and the peer's lr) follows
    config, _ = resolve(config_lib.replace(config, **{"train.steps": s.total_steps}),
                        platform=None)
    tokenizer, source = data.load(config)
    config, _ = resolve(config, platform=None, tokenizer=tokenizer, validated=True)
    t = config.train
    batches = [jax.device_put(source.batch(t.seed, "train", i, t.batch_size))
               for i in range(s.total_steps)]  # made up front: data loading is not timed
    model_config = ModelConfig.from_config(config)
    tokens_per_step = t.batch_size * model_config.max_seq_len

    auto = dataclasses.asdict(target_lib.matmul_choice(jax.default_backend()))
    log(f"model.matmul=auto picks {auto['mode']}: {auto['reason']}")
    log("measuring the matmul peak")
    peak_f32, source_f32 = metrics.peak_flops("float32")
    peak_bf16, _ = metrics.peak_flops("bfloat16")
    ours, peer = _train(config, batches, counter, s, log)
    flops_per_token = flops.train_flops_per_token(model_config)
    train = _train_figures(ours, source, counter, tokens_per_step, flops_per_token,
                           {"f32": peak_f32, "bf16": peak_bf16})
    memory_mb = ours["f32"].memory_mb() if "f32" in ours else None
    peer_train = _peer_train_figures(peer, tokens_per_step, flops_per_token, peak_f32)

    counter.phase = "other"
    # Decoding: a model with room for prompt + new tokens, random weights (speed only).
    dec_config = _decode_config(model_config, s.prompt_len, s.new_tokens)
    params = init_params(dec_config, jax.random.key(t.seed))
    peer_dec = PeerModel(dec_config, t, dec_config.max_seq_len) if s.peer else None
    decode_figures = {b: _decode(dec_config, params, b, counter, peer_dec, s, log)
                      for b in (1, 8)}

    compiles = Compiles(dict(counter.counts), {k: round(v, 3) for k, v in counter.seconds.items()},
                        sorted(set(counter.names.get("steady", []))))
    return BenchResult(
        config=config_lib.to_dict(config), machine=_machine(), rounds=s.rounds,
        steps_per_round=s.steps, matmul_auto=auto, peak_flops_f32=peak_f32, peak_flops_bf16=peak_bf16,
        peak_source=source_f32, flops_per_token=flops_per_token,
        tokens_per_step=tokens_per_step, train=train, peer_train=peer_train,
        train_step_memory_mb=memory_mb, decode_context=dec_config.max_seq_len,
        decode_matmul=dec_config.matmul, decode=decode_figures, compiles=compiles,
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        device_peak_memory_mb=_device_peak_memory_mb())


def _machine() -> dict:
    device = jax.devices()[0]
    info = {"platform": device.platform, "device_kind": device.device_kind,
            "device_count": jax.device_count(), "cpu_count": os.cpu_count(),
            "python": platform.python_version(), "jax": jax.__version__,
            "xla_flags": os.environ.get("XLA_FLAGS", ""), "isa": _isa()}
    info["cpu"] = host.cpu_model()
    try:
        import torch
        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    return info


def _isa() -> str:
    """The bf16 matmul features this CPU has, and XLA's ISA cap, as matmul_auto sees them."""
    cpuinfo = host.cpu_flags(host.read_cpuinfo())
    bf16 = [flag for flag, _ in matmul_auto.BF16_FLAGS if flag in cpuinfo] or ["no bf16 flags"]
    cap = host.max_isa(os.environ.get("XLA_FLAGS")) or "none"
    return f"{', '.join(bf16)}; xla_cpu_max_isa cap: {cap}"


def main(argv):
    if len(argv) > 1:
        cli.fail(f"unexpected arguments {argv[1:]}: flags look like --name=value")
    scratch.keep_freed_memory()  # as train.py does (the peer's steps run under it too)
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
    settings = Settings(peer=not _NO_PEER.value, rounds=_ROUNDS.value, steps=_STEPS.value,
                        warmup=_WARMUP.value, decode_reps=_DECODE_REPS.value,
                        prompt_len=_PROMPT_LEN.value, new_tokens=_NEW_TOKENS.value,
                        f32_matmul=_F32_MATMUL.value, modes=modes)
    result = run(cli.config_value(_CONFIG), settings, log)
    print(json.dumps(result.to_json()) if _JSON.value else format_table(result))
    if _RECORD.value:
        from transformer.lab import records
        figures = {k: v for k, v in result.to_json().items()
                   if isinstance(v, (int, float, str)) and not isinstance(v, bool)}
        records.append(_RECORD.value, records.record(
            {"cpu": result.machine["cpu"], "cores": result.machine["cpu_count"]},
            "python -m transformer bench " + " ".join(sys.argv[1:]),
            [result.config["train"]["seed"]], figures))


if __name__ == "__main__":
    cli.run(main)
