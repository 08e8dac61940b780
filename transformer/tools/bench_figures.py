"""What the bench measured, as typed records; its JSON object and its text table.

    result = bench.run(config)              # a BenchResult
    json.dumps(result.to_json())            # one object, a key per figure (the --json line)
    print(format_table(result))             # ours against the peer, with ratios

Modes and batch sizes are fields of the records; only the JSON object spells them as key
suffixes (`train_tokens_per_s_bf16`, `decode_tokens_per_s_b8`), and only `to_json` does.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Spread:
    """Repeated timings in seconds: the median and the range."""

    median: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, times) -> "Spread":
        return cls(float(np.median(times)), float(np.min(times)), float(np.max(times)),
                   len(times))


@dataclasses.dataclass
class TrainFigures:
    """One of our training modes: speed, compilation, and the val loss after the run."""

    matmul: str
    tokens_per_s: float
    step_s: Spread
    compile_s: float
    first_step_s: float
    mfu: float
    val_loss: float
    # the process's minor page faults per timed step: XLA maps each step's scratch space
    # afresh under glibc (docs/performance.md, "page faults")
    page_faults_per_step: float = 0.0


@dataclasses.dataclass
class PeerTrainFigures:
    tokens_per_s: float
    step_s: Spread
    mfu: float  # of the float32 peak


@dataclasses.dataclass
class DecodeFigures:
    """Greedy decoding at one batch size, ours and (when measured) the peer's."""

    matmul: str  # what the decode loop runs at this batch (one row keeps float32 weights)
    compile_s: float
    tokens_per_s: float
    decode_s: Spread
    prefill_s: Spread
    peer_tokens_per_s: float | None = None
    peer_decode_s: Spread | None = None
    peer_prefill_s: Spread | None = None
    groups: int = 1  # programs the rows ran in at once (decode.row_groups)


@dataclasses.dataclass
class Compiles:
    counts: dict  # phase -> compilations
    seconds: dict  # phase -> seconds compiling
    recompiled: list  # names of what compiled after warm-up (should be empty)

    @property
    def after_warmup(self) -> int:
        return self.counts.get("steady", 0)


@dataclasses.dataclass
class BenchResult:
    """Everything `run` measured. `to_json` flattens it into the bench's JSON object."""

    config: dict
    machine: dict
    rounds: int
    steps_per_round: int
    matmul_auto: dict  # what model.matmul=auto picks on this machine, and why
    peak_flops_f32: float
    peak_flops_bf16: float
    peak_source: str
    flops_per_token: float
    tokens_per_step: int
    train: dict  # "f32" / "bf16" -> TrainFigures
    peer_train: PeerTrainFigures | None
    train_step_memory_mb: float | None  # of the f32 step; absent when f32 was not run
    decode_context: int
    decode_matmul: str
    decode: dict  # batch size -> DecodeFigures
    compiles: Compiles
    peak_rss_mb: float
    device_peak_memory_mb: float | None

    @property
    def val_loss_ratio_bf16(self) -> float | None:
        if "f32" in self.train and "bf16" in self.train:
            return self.train["bf16"].val_loss / self.train["f32"].val_loss
        return None

    def to_json(self) -> dict:
        return _flatten(self)


def _flatten(r: BenchResult) -> dict:
    """The JSON object: one key per figure, mode and batch as suffixes (`_bf16`, `_b8`)."""
    out = {"config": r.config, "machine": r.machine, "rounds": r.rounds,
           "steps_per_round": r.steps_per_round, "matmul_auto": r.matmul_auto,
           "peak_flops_f32": r.peak_flops_f32,
           "peak_flops_bf16": r.peak_flops_bf16, "peak_source": r.peak_source,
           "flops_per_token": r.flops_per_token, "tokens_per_step": r.tokens_per_step}
    for mode, t in r.train.items():
        s = "" if mode == "f32" else "_bf16"
        out.update({f"train_tokens_per_s{s}": t.tokens_per_s,
                    f"train_step_s{s}": dataclasses.asdict(t.step_s),
                    f"compile_s{s}": t.compile_s, f"first_step_s{s}": t.first_step_s,
                    f"mfu{s}": t.mfu, f"matmul{s}": t.matmul, f"val_loss{s}": t.val_loss,
                    f"page_faults_per_step{s}": t.page_faults_per_step})
    if r.val_loss_ratio_bf16 is not None:
        out["val_loss_ratio_bf16"] = r.val_loss_ratio_bf16
    if "f32" in r.train:
        out["train_step_memory_mb"] = r.train_step_memory_mb
    if r.peer_train:
        out.update(peer_train_tokens_per_s=r.peer_train.tokens_per_s,
                   peer_train_step_s=dataclasses.asdict(r.peer_train.step_s),
                   peer_mfu=r.peer_train.mfu)
    out.update(decode_context=r.decode_context, decode_matmul=r.decode_matmul)
    for b, d in r.decode.items():
        out.update({f"decode_matmul_b{b}": d.matmul, f"decode_groups_b{b}": d.groups,
                    f"decode_compile_s_b{b}": d.compile_s,
                    f"decode_tokens_per_s_b{b}": d.tokens_per_s,
                    f"decode_s_b{b}": dataclasses.asdict(d.decode_s),
                    f"prefill_s_b{b}": dataclasses.asdict(d.prefill_s)})
        if d.peer_tokens_per_s is not None:
            out.update({f"peer_decode_tokens_per_s_b{b}": d.peer_tokens_per_s,
                        f"peer_decode_s_b{b}": dataclasses.asdict(d.peer_decode_s),
                        f"peer_prefill_s_b{b}": dataclasses.asdict(d.peer_prefill_s)})
    c = r.compiles
    out.update(compiles=c.counts, compile_seconds=c.seconds,
               recompiles_after_warmup=c.after_warmup, recompiled=c.recompiled,
               peak_rss_mb=r.peak_rss_mb)
    if r.device_peak_memory_mb is not None:
        out["device_peak_memory_mb"] = r.device_peak_memory_mb
    for key in ("train_tokens_per_s", "train_tokens_per_s_bf16", "decode_tokens_per_s_b1",
                "decode_tokens_per_s_b8"):
        peer_key = "peer_" + key.replace("_bf16", "")
        if key in out and peer_key in out:
            out["ratio_" + key] = out[key] / out[peer_key]
    return out



LABEL = 46  # the width of the table's first column


def format_table(r: BenchResult) -> str:
    """The figures as a small text table with ratios (ours / peer)."""
    m, mc = r.machine, r.config["model"]
    lines = [f"machine: {m.get('cpu', m['device_kind'])} ({m['platform']}, {m['cpu_count']} cpus), "
             f"jax {m['jax']}, torch {m.get('torch', '-')}",
             f"shape: {mc['n_layers']} layers, {mc['n_heads']} heads, d_model {mc['d_model']}, "
             f"context {mc['max_seq_len']}, batch {r.config['train']['batch_size']}, "
             f"vocab {mc['vocab_size']}; decode context {r.decode_context}",
             f"peak matmul: {r.peak_flops_f32 / 1e9:.0f} GFLOP/s f32, "
             f"{r.peak_flops_bf16 / 1e9:.0f} bf16-in/f32-acc ({r.peak_source})",
             f"isa: {m.get('isa', '-')}; model.matmul=auto picks {r.matmul_auto['mode']} "
             f"({r.matmul_auto['reason']})",
             "", f"{'':{LABEL}}{'ours':>10}{'peer':>10}{'ratio':>8}"]
    lines += _speed_rows(r)
    lines.append("")
    for mode, t in r.train.items():
        s = t.step_s
        lines.append(f"{mode}: step {s.median * 1e3:.0f} ms (min {s.min * 1e3:.0f}, "
                     f"max {s.max * 1e3:.0f}, n {s.n}), MFU {t.mfu:.1%}, "
                     f"compile {t.compile_s:.1f}s, val loss {t.val_loss:.4f}, "
                     f"{t.page_faults_per_step:,.0f} page faults a step")
    if r.peer_train:
        lines.append(f"peer: MFU {r.peer_train.mfu:.1%} (of the f32 peak)")
    if r.val_loss_ratio_bf16 is not None:
        lines.append(f"val loss bf16 / f32: {r.val_loss_ratio_bf16:.4f}")
    lines.append(f"compiles: {r.compiles.counts}; after warm-up: {r.compiles.after_warmup}")
    mem = r.train_step_memory_mb
    lines.append(f"memory: train step {f'{mem:.0f} MB' if mem else 'n/a'}, "
                 f"process peak RSS {r.peak_rss_mb:.0f} MB")
    return "\n".join(lines)


def _speed_rows(r: BenchResult) -> list[str]:
    """Tokens/s, ours against the peer's, then prefill latency."""
    def row(label, ours, peer):
        ratio = f"{ours / peer:.2f}x" if peer else ""
        return f"{label:{LABEL}}{ours:>10,.0f}{f'{peer:,.0f}' if peer else '-':>10}{ratio:>8}"

    peer_train = r.peer_train.tokens_per_s if r.peer_train else None
    lines = []
    if "f32" in r.train:
        lines.append(row(f"train tokens/s, f32 ({r.train['f32'].matmul})",
                         r.train["f32"].tokens_per_s, peer_train))
    if "bf16" in r.train:
        lines.append(row("train tokens/s, bf16 mixed", r.train["bf16"].tokens_per_s, peer_train))
    for b, d in r.decode.items():
        groups = f", {d.groups} groups" if d.groups > 1 else ""
        lines.append(row(f"decode tokens/s, batch {b}{groups} ({d.matmul})", d.tokens_per_s,
                         d.peer_tokens_per_s))
    for b, d in r.decode.items():
        peer = d.peer_prefill_s.median if d.peer_prefill_s else None
        label = f"prefill+1 token ms, batch {b}"
        lines.append(f"{label:{LABEL}}{d.prefill_s.median * 1e3:>10.1f}"
                     f"{f'{peer * 1e3:.1f}' if peer else '-':>10}")
    return lines
