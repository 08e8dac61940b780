"""Compile a run's real programs for a TPU or GPU you do not have, and read what they need.

    python -m transformer compile --config=configs/tiny.py --target=v5e:2x2
    python -m transformer compile --config=configs/gpt3_175b.py --target=v5p:8x8x16 \\
        --config.mesh.data=1 --config.mesh.fsdp=128 --config.mesh.tensor=8 --json=175b.json
    python -m transformer compile --config=configs/gpt2_small.py --target=v5e:2x2 --decode \\
        --batch=8 --prompt_len=64 --max_new_tokens=128

The train step is the run's own (train/trainer.py's Trainer over a mesh of the target's
devices, parallel/target.py), lowered with ShapeDtypeStructs carrying the state's and batch's
shardings and compiled by the target's compiler (libtpu, or the CUDA plugin): nothing is
allocated. It prints the target; the mesh and how each parameter is laid out; per chip XLA's
peak memory against what the device reports (libtpu's usable HBM, CUDA's, and on a GPU JAX's
75% preallocation) beside the project's own estimate (model/sizes.py's figures); per step the
FLOPs of model/flops.py (XLA's cost_analysis counts a scanned layer once); every collective
counted once per run (tools/collectives.py), the largest with the mesh axes they span
(--top), each priced on the links its group crosses (parallel/links.py: torus ports, NVLink,
the network between GPU hosts, DCN between TPU slices); a roofline step time, the larger of
compute at the peak of the precision that runs and the collectives on their links, and the
MFU it implies, an upper bound; the compile's seconds and the program's fingerprint
(tools/program.py). --hlo, --save, --json and --record write the program, the executable,
the figures and a dated record (tools/compile_record.py). Several TPU slices: v5p:8x8x8*2.

Exit status: 0 fits; 1 does not fit (one line: by how much, what to try); 2 bad input
(a malformed --target, a missing libtpu or CUDA plugin, a mesh that does not divide the chips).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
import time

from absl import flags
from ml_collections import config_flags

from transformer import cli
from transformer.tools import collectives, program

GiB = 2**30
# Bytes a chip sends per byte of the collective's result, on a ring of n (large n): an
# all-reduce is a reduce-scatter then an all-gather, 2x; the others move their result once.
TRAFFIC = {"all-reduce": 2.0, "all-gather": 1.0, "reduce-scatter": 1.0, "all-to-all": 1.0,
           "collective-permute": 1.0}
NETWORK_NAMES = {"ici": "ICI (inside a slice)", "dcn": "DCN (between slices)",
                 "nvlink": "NVLink (inside a host)", "network": "the network between hosts"}
TOP = 20  # the largest collectives a report keeps (--top=N prints and writes the first N)


@dataclasses.dataclass
class Report:
    """What one compiled program needs on its target (the --json keys, and the lines printed)."""
    target: str
    chips: int
    mesh: dict
    fits: bool
    peak_bytes_per_chip: int
    hbm_bytes_per_chip: float
    estimate_bytes_per_chip: int
    flops_per_step: float
    collectives: dict
    predicted_step_s: float
    predicted_mfu: float
    compile_s: float
    memory: dict = dataclasses.field(default_factory=dict)
    program: str = "train step"
    unit: str = "step"
    top: list = dataclasses.field(default_factory=list)  # the largest collectives (--top)
    links: dict = dataclasses.field(default_factory=dict)  # per network: ops, bytes, seconds
    peak_flops_per_chip: float = 0.0   # of the precision the matmuls run in (peak_source)
    peak_source: str = ""
    compute_s: float = 0.0             # the roofline's compute term
    gpu_memory: dict = dataclasses.field(default_factory=dict)  # JAX's preallocation verdict
    unknown_loops: list = dataclasses.field(default_factory=list)  # counted once, unknown trips
    fingerprint: str = ""  # of the optimised HLO, metadata stripped (tools/program.py)
    built_under: dict = dataclasses.field(default_factory=dict)  # versions, XLA flags
    hlo: str = ""  # the compiled program's text (not written to --json)
    compiled: object = None  # the executable (--save; not written to --json)

    def json(self, top: int = TOP) -> dict:
        out = {k: v for k, v in dataclasses.asdict(
            dataclasses.replace(self, compiled=None)).items() if k not in ("hlo", "compiled")}
        out["top"] = out["top"][:top]
        return out


# ---------------------------------------------------------------- reading the compiled HLO

def has_conditional(hlo: str) -> bool:
    """Whether the program branches on a value (lax.cond's `conditional`)."""
    return re.search(r"\bconditional\(", hlo) is not None


# ---------------------------------------------------------------- building the programs

def resolved_config(config, target):
    """The run's config as its start would resolve it on the target: validated, `auto` made
    concrete for the target's platform, vocab_size=0 padded as a run pads it for the mesh."""
    import types

    from transformer.config import replace
    from transformer.model.sizes import model_config_of
    from transformer.parallel import sharding
    from transformer.train.resolve import resolve
    config, _ = resolve(config, platform=target.platform)
    if config.model.vocab_size == 0:  # the tokenizer's size as the config gives it, no corpus
        vocab = model_config_of(replace(config, **{"model.vocab_multiple": 1})).vocab_size
        mesh = sharding.make_mesh(config.mesh, target.devices)
        config, _ = resolve(config, platform=target.platform, mesh=mesh, validated=True,
                            tokenizer=types.SimpleNamespace(vocab_size=vocab))
    return config


def layout(trainer) -> list[str]:
    """How each parameter is laid out: one line per distinct (name, spec), layers merged."""
    import jax
    seen = {}
    for path, sh in jax.tree_util.tree_flatten_with_path(trainer.state_sharding.params)[0]:
        name = re.sub(r"block_\d+", "block_*", "/".join(str(getattr(k, "key", k)) for k in path))
        seen.setdefault(name, str(tuple(sh.spec)))
    return [f"  {name:<44} {spec}" for name, spec in seen.items()]


def _shard_bytes(tree) -> list[tuple[str, int]]:
    import jax
    out = []
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
        out.append((jax.tree_util.keystr(path), math.prod(shape) * x.dtype.itemsize))
    return out


def estimate(trainer, state) -> int:
    """The project's own per-chip estimate: the state as sharded (params, optimizer), a
    gradient as big as the params' shard, and model/flops.py's activation bytes for the rows
    one chip holds, split further only where the length axis is (mesh.rules.length): the
    residual stream a block keeps is [batch, length, embed], whole across the tensor axis."""
    from transformer.model import sizes
    from transformer.parallel import sharding
    c, t, mesh = trainer.model_config, trainer.config.train, trainer.mesh
    state_bytes = sum(b for _, b in _shard_bytes(state))
    grad_bytes = sum(b for _, b in _shard_bytes(state.params))
    return int(state_bytes + grad_bytes + sizes.activations_per_chip(
        c, t.batch_size, t.grad_accum, sharding.shards(mesh, trainer.rules, "batch"),
        sharding.shards(mesh, trainer.rules, "length")))


def compile_train(config, target) -> tuple[Report, list[str]]:
    """The train step of `config` compiled for `target`: (its report, lines to print)."""
    import jax
    import numpy as np
    from transformer.model import flops
    from transformer.parallel import sharding
    from transformer.train.trainer import Trainer
    mesh = sharding.make_mesh(config.mesh, target.devices)
    sharding.check_fits(config, mesh, processes=target.hosts)  # one line, before XLA's words
    trainer = Trainer.build(config, mesh)
    B, T = config.train.batch_size, config.model.max_seq_len
    spec = {k: jax.ShapeDtypeStruct((B, T), dt, sharding=trainer.batch_sharding)
            for k, dt in (("inputs", np.int32), ("targets", np.int32), ("weights", np.float32))}
    state = trainer.abstract_state()
    began = time.perf_counter()
    compiled, failure = _compile(trainer.step_fn.lower(state, spec))
    seconds = time.perf_counter() - began
    flops_per_step = flops.train_flops_per_token(trainer.model_config) * B * T
    recomputed = flops.recompute_flops_per_token(trainer.model_config) * B * T
    lines = [sharding.describe(mesh, target.hosts), "parameters (per-chip split):"]
    lines += layout(trainer)
    biggest = sorted(_shard_bytes(state), key=lambda kv: -kv[1])[:3]
    report = _report(target, mesh, compiled, failure, seconds, flops_per_step,
                     estimate(trainer, state), biggest, recomputed, trainer.model_config.dtype)
    return report, lines


def compile_decode(config, target, batch: int, prompt_len: int, max_new_tokens: int):
    """The decode program (prefill + the compiled loop, generate/decode.py) for `batch` rows
    of `prompt_len` tokens and `max_new_tokens` more."""
    import jax
    import numpy as np
    from transformer.config import ModelConfig
    from transformer.generate import decode
    from transformer.model import flops
    from transformer.model.gpt import init_params
    from transformer.parallel import sharding
    mesh = sharding.make_mesh(config.mesh, target.devices)
    c, rules = ModelConfig.from_config(config), sharding.axis_rules(config)
    P = decode.prompt_bucket(prompt_len, c.max_seq_len)
    budget = decode.token_budget(max_new_tokens, c.max_seq_len - P)
    generate_fn, cache_fn, param_sh = decode.sharded_program(c, budget, mesh, rules, batch)
    rep = sharding.replicated(mesh)
    shapes = jax.eval_shape(lambda: init_params(c, jax.random.key(0)))
    params = jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
                          shapes, param_sh)
    cache = jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
                         cache_fn.eval_shape(), sharding.cache_shardings(
                             c, mesh, sharding.decode_rules(rules, mesh, batch)))

    def like(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=rep)

    key = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0)))
    args = (params, cache, like((batch, P), np.int32), like((batch,), np.int32),
            like(key.shape, key.dtype), like((), np.float32), like((), np.int32),
            like((), np.float32), like((), np.int32), like((), np.int32))
    began = time.perf_counter()
    compiled, failure = _compile(generate_fn.lower(*args))
    seconds = time.perf_counter() - began
    tokens = batch * (P + budget)
    flops_per_call = flops.forward_flops_per_token(c) * tokens
    # the program gathers the weights over fsdp once, at its top (decode.sharded_program):
    # each chip then holds its trained shard and the gathered copy, and every token reads
    # the gathered copy and the cache
    gathered = jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
                            shapes, sharding.param_shardings(
                                c, mesh, sharding.decode_rules(rules, mesh, batch)))
    read = sum(b for _, b in _shard_bytes(gathered)) + sum(b for _, b in _shard_bytes(cache))
    est = sum(b for _, b in _shard_bytes(params)) + read
    biggest = sorted(_shard_bytes({"gathered params": gathered, "cache": cache}),
                     key=lambda kv: -kv[1])[:3]
    report = _report(target, mesh, compiled, failure, seconds, flops_per_call, est, biggest,
                     dtype=c.dtype)
    if compiled is not None and target.hbm_bytes_s:
        # each new token reads every weight and the cache once: HBM, not the MXU, bounds it
        memory_s = budget * read / target.hbm_bytes_s
        if memory_s > report.predicted_step_s:
            report.predicted_mfu *= report.predicted_step_s / memory_s
            report.predicted_step_s = memory_s
    report.program = (f"decode ({batch} rows, prompt {P}, {budget} new tokens; estimate: "
                      "the params' shard, their copy gathered over fsdp, and the KV cache)")
    report.unit = "call (a loop of unknown length counted once)"
    return report, [sharding.describe(mesh, target.hosts)]


def _compile(lowered):
    """(compiled, None), or (None, the compiler's out-of-memory message)."""
    try:
        return lowered.compile(), None
    except Exception as e:  # noqa: BLE001 - only the compiler's out-of-memory is a result
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        return None, str(e)


def _used_from(message: str) -> float | None:
    """The bytes libtpu said a program needs: 'the total memory required for HLO temporaries
    (97.05G) exceeds available HBM (95.74G)', or 'Used 177.83G of 95.74G hbm'."""
    scale = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    for pattern in (r"\(([\d.]+)([KMGT])\) exceeds available", r"Used ([\d.]+)([KMGT]) of",
                    r"([\d.]+)([KMGT]) exceeds"):
        match = re.search(pattern, message)
        if match:
            return float(match.group(1)) * scale[match.group(2)]
    return None


def peak_of(target, dtype: str) -> tuple[float, str]:
    """Per chip, the peak FLOP/s of what the target's matmuls run for `dtype` (model.dtype):
    train/metrics.py's table, where float32 runs as TF32 on NVIDIA GPUs and as bf16 passes on
    TPUs at jax's default precision."""
    from transformer.train import metrics
    if target.platform not in ("tpu", "gpu"):
        return target.peak_flops or 0.0, "unknown"
    return metrics.peak_flops(dtype, target.devices[0])


def _report(target, mesh, compiled, failure, seconds, flops_per_step, est, biggest,
            recomputed: float = 0.0, dtype: str = "bfloat16") -> Report:
    """`recomputed`: FLOPs remat repeats, which the chip spends and MFU does not count."""
    from transformer.parallel import links
    if compiled is not None:
        memory = compiled.memory_analysis()
        peak = int(memory.peak_memory_in_bytes)
        ops, unknown = collectives.read(compiled.as_text(), tuple(mesh.shape.values()),
                                        tuple(mesh.shape))
        found = collectives.totals(ops)
        parts = {k: int(getattr(memory, f"{k}_size_in_bytes", 0) or 0)
                 for k in ("argument", "output", "alias", "temp")}
    else:
        peak, found, parts = int(_used_from(failure) or 0), {}, {"compiler": failure[:300]}
        ops, unknown = [], []
    parts["biggest"] = biggest
    usable = target.memory_bytes or float("inf")
    flops_s, source = peak_of(target, dtype)
    compute_s = (flops_per_step + recomputed) / (target.chips * flops_s) if flops_s else 0.0
    priced = links.price(ops, list(mesh.devices.flat), target) if target.link_bytes_s else \
        {"networks": {}, "seconds": 0.0}
    step_s = max(compute_s, priced["seconds"])
    mfu = flops_per_step / (target.chips * flops_s * step_s) if step_s else 0.0
    report = Report(target.name, target.chips, dict(mesh.shape),
                    compiled is not None and peak <= usable, peak, usable, est, flops_per_step,
                    found, step_s, mfu, round(seconds, 2), parts,
                    top=collectives.top(ops, TOP), unknown_loops=unknown,
                    hlo=compiled.as_text() if compiled is not None else "")
    report.peak_flops_per_chip, report.peak_source = flops_s, source
    report.compiled, report.built_under = compiled, program.built_under()
    report.fingerprint = program.fingerprint(report.hlo) if report.hlo else ""
    report.compute_s, report.links = compute_s, priced["networks"]
    if target.platform == "gpu":
        report.gpu_memory = gpu_memory(peak, usable)
    return report


# JAX preallocates this fraction of a GPU's memory at start-up and allocates from it
# (https://docs.jax.dev/en/latest/gpu_memory_allocation.html)
JAX_GPU_FRACTION = 0.75


def gpu_memory(peak: int, usable: float) -> dict:
    """Whether the program fits JAX's default preallocation, and how to give it more."""
    pool = usable * JAX_GPU_FRACTION
    return {"default_pool_bytes": pool, "fits_default": peak <= pool,
            "advice": "" if peak <= pool else
            (f"XLA's peak {peak / GiB:.1f} GiB exceeds JAX's default pool (75% of "
             f"{usable / GiB:.1f} GiB = {pool / GiB:.1f} GiB): run with "
             f"XLA_PYTHON_CLIENT_MEM_FRACTION={min(0.95, (peak / usable) + 0.02):.2f}, or "
             "XLA_PYTHON_CLIENT_PREALLOCATE=false (allocates on demand, may fragment)")}


def top_lines(rows: list[dict]) -> list[str]:
    """--top: the largest collectives, bytes per chip per run x runs, and the mesh axes."""
    from transformer.model.sizes import human
    if not rows:
        return []
    out = ["  largest collectives (per chip; bytes x runs; the mesh axes each group spans):"]
    for r in rows:
        shape = re.sub(r"\{[^{}]*\}|/\*.*?\*/", "", r["shape"])
        shape = shape if len(shape) <= 48 else shape[:45] + "..."
        axes = "+".join(r["axes"]) or ("?" if r["group"] is None else "-")
        out.append(f"    {r['kind']:<18} {human(r['bytes'], 'B'):>9} x {r['runs']:<4} "
                   f"{axes:<12} {shape}  {r['op_name'][-70:]}"
                   + (" (in a conditional branch)" if r["in_branch"] else ""))
    return out


def text(report: Report, target, lines: list[str], top: int = 5) -> str:
    from transformer.model.sizes import human
    gib = lambda n: human(n, "B")  # noqa: E731
    out = [target.describe(), *lines, f"{report.program}:"]
    verdict = "fits" if report.fits else \
        f"short by {gib(report.peak_bytes_per_chip - report.hbm_bytes_per_chip)}"
    out.append(f"  memory per chip: XLA's peak {gib(report.peak_bytes_per_chip)} of "
               f"{gib(report.hbm_bytes_per_chip)} the device reports: {verdict} (the project's "
               f"estimate, model/sizes.py's figures: {gib(report.estimate_bytes_per_chip)})")
    if report.gpu_memory:
        g = report.gpu_memory
        out.append("    JAX preallocates 75% of a GPU (" + gib(g["default_pool_bytes"]) + "): "
                   + ("fits that too" if g["fits_default"] else g["advice"]))
    m = report.memory
    if "temp" in m:
        out.append(f"    arguments {gib(m['argument'])}, temporaries {gib(m['temp'])}, outputs "
                   f"{gib(m['output'])} (aliased to arguments {gib(m['alias'])})")
    out.append("    biggest buffers: " + ", ".join(f"{name} {gib(b)}" for name, b in m["biggest"]))
    out.append(f"  FLOPs per {report.unit} (model/flops.py): {report.flops_per_step:.4g}")
    for kind, v in report.collectives.items():
        if v["count"]:
            out.append(f"  {kind:<19} {v['count']:>6} per {report.unit.split()[0]}, "
                       f"{gib(v['bytes'])} per chip (results)")
    if not any(v["count"] for v in report.collectives.values()):
        out.append("  collectives: none")
    for loop in report.unknown_loops:
        out.append(f"  warning: loop {loop['loop']} has a trip count XLA does not state and its "
                   "condition does not show: its collectives are counted once (unknown)")
    out += top_lines(report.top[:top])
    for name, v in report.links.items():
        out.append(f"  on {NETWORK_NAMES.get(name, name)}: {v['ops']} collectives, "
                   f"{gib(v['bytes'])} per chip (results), {gib(v['sent'])} sent, "
                   f"{v['seconds'] * 1e3:.4g} ms")
    out.append(f"  compute at {report.peak_flops_per_chip / 1e12:.4g} TFLOP/s per chip "
               f"({report.peak_source}): {report.compute_s * 1e3:.4g} ms")
    bound = ("compute at peak with remat's recompute, or the collectives on their links, "
             "one after another" + (", or each token's read of weights and cache from HBM"
                            if report.unit != "step" else "") + ", the largest")
    out.append(f"  roofline {report.unit.split()[0]} time (upper bound on speed: {bound}): "
               f"{report.predicted_step_s * 1e3:.4g} ms, MFU at most "
               f"{100 * report.predicted_mfu:.1f}%")
    out.append(f"  compiled in {report.compile_s:.1f} s; program fingerprint {report.fingerprint} "
               "(optimised HLO, metadata stripped)")
    return "\n".join(out)


def advice(report: Report, config) -> str:
    short = (report.peak_bytes_per_chip - report.hbm_bytes_per_chip) / GiB
    mesh = config.mesh
    by = f"short by {short:.2f} GiB per chip" if short > 0 else \
        f"the compiler refused it ({report.memory.get('compiler', '')[:120]})"
    m = report.mesh
    return (f"the {report.program} does not fit {report.target}: {by} (mesh data {m['data']} "
            f"x fsdp {m['fsdp']} x tensor {m['tensor']}); try more --config.mesh.fsdp or "
            "--config.mesh.tensor, "
            f"--config.train.grad_accum={2 * config.train.grad_accum}"
            + (", --config.model.remat=block" if config.model.remat == "none" else "")
            + (", or --search" if mesh.fsdp == 1 else ""))


def _config_path() -> str:
    """The --config=PATH given on the command line."""
    return next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--config=")), "")


def main_flags():
    config_flag = config_flags.DEFINE_config_file("config", None,
                                                  "A config file (Python, get_config()).")
    target_flag = flags.DEFINE_string("target", None, "v5e:2x2, v5p:8x8x16, v6e:16x16, h100:1x1x8")
    decode_flag = flags.DEFINE_bool("decode", False, "Compile the decode program instead.")
    batch_flag = flags.DEFINE_integer("batch", 8, "--decode: rows.")
    prompt_flag = flags.DEFINE_integer("prompt_len", 64, "--decode: prompt tokens.")
    new_flag = flags.DEFINE_integer("max_new_tokens", 64, "--decode: tokens to sample.")
    json_flag = flags.DEFINE_string("json", None, "Also write the numbers as JSON to this path.")
    hlo_flag = flags.DEFINE_string("hlo", None, "Write the optimised HLO to this path.")
    save_flag = flags.DEFINE_string("save", None, "Serialise the compiled executable to this "
                                    "path (jax.experimental.serialize_executable).")
    record_flag = flags.DEFINE_string("record", None, "Append the figures as a dated record "
                                      "(docs/records/compile.jsonl; transformer/lab/records.py).")
    top_flag = flags.DEFINE_integer("top", 5, "List the N largest collectives (text and JSON).")
    search_flag = flags.DEFINE_bool("search", False, "Try meshes, remat and grad_accum; rank.")
    compiles_flag = flags.DEFINE_integer("search_compiles", 4, "--search: at most this many "
                                         "compiles (the estimate prunes the rest first).")

    def main(argv):
        if len(argv) > 1:
            cli.fail(f"unexpected arguments {argv[1:]}: flags look like --name=value")
        if flags.FLAGS["config"].value is None:
            cli.fail("--config=PATH is required, e.g. --config=configs/tiny.py")
        if not target_flag.value:
            cli.fail("--target=NAME is required, e.g. --target=v5e:2x2")
        for flag in (batch_flag, prompt_flag, new_flag):
            if flag.value < 1:
                cli.fail(f"--{flag.name}={flag.value}: must be a positive integer")
        import jax
        # Ahead of time: nothing runs here, and the CUDA plugin must not look for a device.
        jax.config.update("jax_platforms", "cpu")
        from transformer.config import validate
        from transformer.parallel import target as target_lib
        try:
            target = target_lib.parse(target_flag.value)
        except target_lib.TargetError as e:
            cli.fail(str(e))
        config = validate(cli.config_value(config_flag))
        if search_flag.value:
            from transformer.tools import compile_search

            def build(candidate_config):
                return compile_train(resolved_config(candidate_config, target), target)[0]
            sys.exit(compile_search.search(config, target, sys.argv, build, compiles_flag.value,
                                           json_path=json_flag.value))
        config = resolved_config(config, target)
        if decode_flag.value:
            report, lines = compile_decode(config, target, batch_flag.value, prompt_flag.value,
                                           new_flag.value)
        else:
            report, lines = compile_train(config, target)
        print(text(report, target, lines, top_flag.value))
        if json_flag.value:
            with open(json_flag.value, "w") as f:
                json.dump(report.json(top_flag.value), f, indent=1)
        if record_flag.value:
            from transformer import host
            from transformer.lab import records
            from transformer.tools import compile_record
            records.append(record_flag.value, records.record(
                {"cpu": host.cpu_line(), "cores": host.usable_cores()},
                "python -m transformer compile " + " ".join(sys.argv[1:]), [],
                compile_record.result(report, config, _config_path())))
        if hlo_flag.value and report.compiled is not None:
            program.write_hlo(report.compiled, hlo_flag.value)
        if save_flag.value and report.compiled is not None:
            program.save(report.compiled, save_flag.value)
        if not report.fits:
            cli.fail(advice(report, config), status=1)

    cli.run(main)


if __name__ == "__main__":
    main_flags()
