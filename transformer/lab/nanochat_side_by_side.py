"""The quick start and nanochat's own model and optimizer, on the same tokens and the same clock.

    python -m transformer.lab.nanochat_side_by_side --nanochat=path/to/nanochat   # a checkout
    python -m transformer.lab.nanochat_side_by_side --nanochat=path/to/nanochat --budget_s=5 \
        --seeds=0,1 --lr_multipliers=1,2 --ours=--config.train.steps=10            # a smoke run

1. Ours: `python train.py` (configs/default.py, plus any `--ours` flags) once per seed in
   `--seeds`, each in a fresh workdir, all sharing one data cache (the first run prepares the
   quick start's BPE set). Each seed gives its final val loss (the whole validation split,
   nats per byte: `val_bpb` × ln 2) and its training time, the `trained steps 0..N in T s`
   line (its evaluations included, compile not): nanogpt_side_by_side.run_ours.
2. nanochat: its `nanochat.gpt.GPT` and its `MuonAdamW` (built by the model's
   `setup_optimizer`, as its scripts/base_train.py builds it), imported from the checkout at run
   time; nothing of nanochat is copied into this project. Each run is a fresh process.
   - Size, by base_train's rule (width = depth × aspect ratio, rounded up to whole heads):
     depth = our layers (4), aspect ratio = our width / depth (32), head_dim 64: 128 wide, 2
     heads of 64, ReLU² MLP 4× wide, QK-norm, value embeddings (its alternating layers), smear,
     backout, untied head, window pattern "L" (full context: the pattern base_train advises
     where attention falls back from FlashAttention 3 to PyTorch's SDPA, as it does on a CPU),
     vocabulary 2,048, sequence_len 128. Its compute dtype (its NANOCHAT_DTYPE) is that of
     our run's matmuls: bfloat16 where our run reports `matmul: fast_bf16` (a CPU with
     AVX512_BF16 or AMX), else float32. Its own choice on a CPU is float32 (bfloat16 is its
     choice on a GPU, the recipe it is tuned for); `--nanochat_dtype=auto` leaves it that.
   - Data: our prepared shards, read by our loader (data.prepared.PreparedSet): batch i of
     seed s is the same 16 windows of 129 tokens, in the same order, that our run of seed s
     trains on at step i: the same token ids, train split and batch of 16 × 128 = 2,048 tokens
     a step. Its own BOS-aligned best-fit loader and tokenizer are not used.
   - Rates, by base_train's rules: its flag defaults (read from the checkout's
     scripts/base_train.py), the AdamW groups' 1/√(d_model/768) inside setup_optimizer, its
     weight decay scaled by √(B/2¹⁹)·(D_ref/D) (D its compute-optimal token target, 12 × its
     scaling parameters; D_ref the same for its depth-12 reference at these flags); warmup 40
     steps, a linear warmdown over the last 65% to 5%, Muon's momentum 0.85 → 0.97 over 400
     steps and back to 0.90 in the warmdown, the weight decay's cosine to zero.
     Its batch rule multiplies every rate by √(B/2¹⁹) = 1/16 at 2,048 tokens a step, a rule
     fitted at batches of 2¹⁹ tokens. Decision: `--batch_lr_scale=False` by default, and the
     `--lr_multipliers` (every group's rate, the fixed smear group's too, after the rules) are
     relative to the unscaled rates and reach down to 1/16, so the default sweep covers both
     the rule's rates (0.0625) and the unscaled ones (1), and beyond (up to 8).
   - Clock: torch.compile on (if it fails, a printed note and eager mode). Two warm-up steps
     compile; ten more on the cores our run uses (host.usable_cores) and ten on one thread
     measure its step time, and it trains on whichever count was faster (on 2 vCPUs torch's
     two threads have measured slower than one at this size); then the weights and the
     optimizer's state are put back as initialised.
     num_iterations = budget / step time, so its warmdown ends at the budget; after a fifth
     of those steps (before the warmdown starts) num_iterations is set once more from the
     loop's own step time so far. The loop also stops at the budget whatever happens. The
     budget is the mean of our seeds' training times; `--budget_s` overrides it.
   - Score: its trained model on the windows our final evaluation scores
     (data.prepared.PreparedSet.eval_windows for train.eval_tokens: the whole validation split
     for the quick start, every token a target once, windows of 128), in nats per token × the
     set's validation tokens per byte (nanogpt_side_by_side.tokens_per_byte) = nats per byte.
3. The sweep: one run of the first seed per multiplier; the lowest val loss wins and runs over
   the other seeds (the sweep's run is the first seed's).
4. A table per seed, the means, spreads (max − min and the sample std), the ratio
   ours/nanochat of the mean losses and a Welch t-test (unequal variances,
   scipy.stats.ttest_ind(equal_var=False)), one-sided: the p-value of "ours is lower". The
   last line is one JSON object; `--record=docs/records/side_by_side.jsonl` appends a record.

What is not the same: our training time includes our evaluations (the run's line says how
much), nanochat's does not (in its favour); it gets no BOS-aligned packing; its weight decay
target D assumes its compute-optimal horizon, not the steps that fit the clock.
It needs torch (the test extra) and a nanochat checkout; without either it prints one
`skipped:` line and exits 0. Run it on a quiet machine: all runs share the same cores.
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
import sys
import tempfile
import time
from pathlib import Path

from absl import app, flags

from transformer import host
from transformer.lab import nanogpt_side_by_side as nanogpt
from transformer.lab import speedrun_rows

ROOT = nanogpt.ROOT
B_REF = 2**19  # base_train's reference batch (tokens) at depth 12, a constant in its script
REF_DEPTH = 12  # base_train's reference depth for the weight decay's D_ref
HEAD_DIM = 64
MULTIPLIERS = "0.0625,0.125,0.25,0.5,1,2,4,8"
WARM_STEPS, MEASURE_STEPS = 2, 10
# base_train's flags this tool reads, with its defaults as a fallback if its parser changes.
RULE_FLAGS = {"embedding_lr": 0.3, "unembedding_lr": 0.008, "matrix_lr": 0.02,
              "scalar_lr": 0.5, "weight_decay": 0.28, "warmup_steps": 40,
              "warmdown_ratio": 0.65, "final_lr_frac": 0.05, "target_param_data_ratio": 12.0}


class _Flags:
    """The tool's absl flags, defined only when it runs as a program (`define_flags`)."""


F = _Flags()


def define_flags() -> None:
    F.nanochat = flags.DEFINE_string("nanochat", None, "A checkout of karpathy/nanochat.")
    F.ours = flags.DEFINE_multi_string("ours", [], "Extra flags for our train.py (repeatable).")
    F.seeds = flags.DEFINE_list("seeds", "0,1,2", "Seeds, both sides; the sweep uses the first.")
    F.multipliers = flags.DEFINE_list(
        "lr_multipliers", MULTIPLIERS, "nanochat's rate multipliers to sweep (every group, after "
        "its rules; relative to the unscaled rates unless --batch_lr_scale).")
    F.batch_lr_scale = flags.DEFINE_bool(
        "batch_lr_scale", False, "Apply base_train's sqrt(B/2^19) batch rule before the "
        "multipliers (1/16 at 2,048 tokens a step).")
    F.budget_s = flags.DEFINE_float("budget_s", None, "nanochat's training seconds (default: "
                                    "the mean of our seeds' training times).")
    F.dtype = flags.DEFINE_enum(
        "nanochat_dtype", "ours", ["ours", "auto", "float32", "bfloat16"],
        "nanochat's compute dtype: ours, that of our run's matmuls (bfloat16 where the CPU "
        "runs bf16-input matmuls natively, else float32); auto, nanochat's own choice "
        "(float32 on a CPU); or one named.")
    F.compile = flags.DEFINE_bool("compile", True, "torch.compile nanochat's model and its "
                                  "optimizer's steps (False: eager, to compare).")
    F.record = flags.DEFINE_string("record", None, "Append the result as one line to this JSON "
                                   "Lines file (docs/records/side_by_side.jsonl).")
    F.work = flags.DEFINE_string("work", None,
                                 "Scratch folder (default: a temporary one, removed).")


def skip_reason(nanochat: str | None) -> str | None:
    if not nanochat:
        return "no --nanochat=PATH (a checkout of karpathy/nanochat) given"
    root = Path(nanochat).expanduser()
    if not all((root / f).is_file() for f in ("nanochat/gpt.py", "nanochat/optim.py",
                                              "scripts/base_train.py")):
        return f"{nanochat} is not a nanochat checkout (no nanochat/gpt.py, nanochat/optim.py " \
               "and scripts/base_train.py)"
    return nanogpt.torch_missing()


# ---- nanochat's rules, from its scripts/base_train.py -------------------------------------

def base_train_defaults(script: Path) -> dict:
    """RULE_FLAGS' values as the checkout's base_train.py declares them: the `default=` of each
    `add_argument("--flag-name", ...)`, read from its source (running it would start a run)."""
    out = dict(RULE_FLAGS)
    for node in ast.walk(ast.parse(Path(script).read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" \
                and node.args and isinstance(node.args[0], ast.Constant):
            name = str(node.args[0].value).lstrip("-").replace("-", "_")
            for kw in node.keywords:
                if name in out and kw.arg == "default":
                    out[name] = float(ast.literal_eval(kw.value))
    return out


def nanochat_shape(depth: int, aspect_ratio: int, head_dim: int) -> tuple[int, int]:
    """(width, heads) by base_train's rule: depth × aspect ratio, rounded up to whole heads."""
    width = -(-depth * aspect_ratio // head_dim) * head_dim
    return width, width // head_dim


def nanochat_rates(rules: dict, tokens_per_step: int, scaling_params: int,
                   ref_scaling_params: int, batch_lr_scale: bool) -> dict:
    """setup_optimizer's arguments as base_train computes them: its rates (times √(B/B_ref) if
    `batch_lr_scale`) and its weight decay λ·√(B/B_ref)·(D_ref/D)."""
    ratio = tokens_per_step / B_REF
    scale = math.sqrt(ratio) if batch_lr_scale else 1.0
    target, ref = (rules["target_param_data_ratio"] * p
                   for p in (scaling_params, ref_scaling_params))
    return {"embedding_lr": rules["embedding_lr"] * scale,
            "unembedding_lr": rules["unembedding_lr"] * scale,
            "matrix_lr": rules["matrix_lr"] * scale, "scalar_lr": rules["scalar_lr"] * scale,
            "weight_decay": rules["weight_decay"] * math.sqrt(ratio) * ref / target}


def lr_factor(it: int, n: int, rules: dict) -> float:
    """base_train's schedule: linear warmup, constant, linear warmdown to final_lr_frac."""
    warmup, warmdown = int(rules["warmup_steps"]), round(rules["warmdown_ratio"] * n)
    if it < warmup:
        return (it + 1) / warmup
    if it <= n - warmdown:
        return 1.0
    progress = (n - it) / warmdown
    return progress + (1 - progress) * rules["final_lr_frac"]


def muon_momentum(it: int, n: int, rules: dict) -> float:
    """base_train's Muon momentum: 0.85 → 0.97 over 400 steps, to 0.90 over the warmdown."""
    start = n - round(rules["warmdown_ratio"] * n)
    if it < 400:
        return 0.85 + (0.97 - 0.85) * it / 400
    if it >= start:
        progress = (it - start) / max(1, n - start)
        return 0.97 + (0.90 - 0.97) * progress
    return 0.97


def _eager_optimizer() -> None:
    """nanochat's optimizer steps are functions compiled where they are defined
    (`@torch.compile(fullgraph=True)` in nanochat/optim.py): put the plain functions back."""
    from nanochat import optim
    for name, fn in list(vars(optim).items()):
        if callable(fn) and hasattr(fn, "_torchdynamo_orig_callable"):
            setattr(optim, name, fn._torchdynamo_orig_callable)


def train_nanochat(nanochat: str, prepared: str, seed: int, lr_multiplier: float,
                   batch_lr_scale: bool, budget_s: float, threads: int, compile_model: bool,
                   n_layers: int, d_model: int, seq_len: int, batch_size: int,
                   eval_tokens: int) -> dict:
    """One nanochat run (in its own process: see `_run_nanochat`) on our prepared set: built,
    compiled and timed, trained for `budget_s` seconds, scored on our final evaluation's
    windows. Returns its figures."""
    import torch
    sys.path.insert(0, str(Path(nanochat).resolve()))

    from transformer.data.prepared import PreparedSet
    torch.set_num_threads(threads)
    if not compile_model:
        _eager_optimizer()
    rules = base_train_defaults(Path(nanochat) / "scripts" / "base_train.py")
    source = PreparedSet(prepared, seq_len)
    model, optimizer, rates = _nanochat_model(source, rules, seed, lr_multiplier,
                                              batch_lr_scale, n_layers, d_model, seq_len,
                                              batch_size)

    def batch(i):
        b = source.batch(seed, "train", i, batch_size)
        return (torch.from_numpy(b["inputs"]).long(), torch.from_numpy(b["targets"]).long())

    def step(net, it, n):
        x, y = batch(it)
        loss = net(x, y)
        loss.backward()
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"] * lr_factor(it, n, rules)
            if group["kind"] == "muon":
                group["momentum"] = muon_momentum(it, n, rules)
                group["weight_decay"] = rates["weight_decay"] * 0.5 * (1 + math.cos(
                    math.pi * it / n))
        optimizer.step()
        model.zero_grad(set_to_none=True)
        return loss.item()

    initial = {k: v.clone() for k, v in model.state_dict().items()}
    net, note, compile_s = _compiled(model, optimizer, step, compile_model, initial)
    threads, step_s, timed = _timed(net, step, threads)
    from torch._dynamo.utils import counters
    graphs = counters["stats"]["unique_graphs"]  # a graph compiled later would be timed
    n = max(1, int(budget_s / step_s))
    print(f"nanochat seed {seed} x{lr_multiplier:g}: {step_s * 1e3:.1f} ms/step on {threads} "
          f"thread(s) (" + ", ".join(f"{c}: {t * 1e3:.1f} ms" for c, t in timed.items())
          + f"; compile {compile_s:.1f}s), {n} steps in {budget_s:.1f}s", flush=True)
    model.load_state_dict(initial)  # the weights and optimizer state as before the timing
    optimizer.state.clear()
    model.zero_grad(set_to_none=True)
    done, n, first_plan, loss, train_s = _train_within(net, step, n, budget_s)
    if counters["stats"]["unique_graphs"] > graphs:
        note = "; ".join(filter(None, [note, "recompiled while training: compile time counted"]))
        print(f"note: {note}", flush=True)
    windows = source.eval_windows(eval_tokens)
    per_token = _val_loss(model, source, windows) / (len(windows) * seq_len)
    counts = model.num_scaling_params()
    return {"seed": seed, "lr_multiplier": lr_multiplier, "val_loss": per_token,
            "nats_per_byte": per_token * nanogpt.tokens_per_byte(Path(prepared)),
            "val_tokens": len(windows) * seq_len, "steps": done, "planned_steps": n,
            "first_plan": first_plan,
            "step_s": step_s, "threads": threads, "train_s": train_s, "compile_s": compile_s,
            "last_train_loss": loss, "params": counts["total"],
            "matmul_params": model.num_matmul_params(), "rates": rates,
            "dtype": str(model.cos.dtype).removeprefix("torch."), "note": note}


def _nanochat_model(source, rules, seed, lr_multiplier, batch_lr_scale, n_layers, d_model,
                    seq_len, batch_size):
    """(nanochat's GPT of our shape, initialised with `seed`; its optimizer at base_train's
    rates times `lr_multiplier`; the rates)."""
    import torch
    from nanochat.gpt import GPT, GPTConfig
    vocab = int(source.manifest["tokenizer"]["vocab_size"])

    def meta_model(depth):
        width, heads = nanochat_shape(depth, d_model // n_layers, HEAD_DIM)
        config = GPTConfig(sequence_len=seq_len, vocab_size=vocab, n_layer=depth,
                           n_head=heads, n_kv_head=heads, n_embd=width, window_pattern="L")
        with torch.device("meta"):
            return GPT(config)

    def scaling_params(model):  # base_train's: the blocks' matrices and the head
        counts = model.num_scaling_params()
        return counts["transformer_matrices"] + counts["lm_head"]

    model = meta_model(n_layers)
    model.to_empty(device="cpu")
    torch.manual_seed(seed)
    model.init_weights()
    rates = nanochat_rates(rules, batch_size * seq_len, scaling_params(model),
                           scaling_params(meta_model(REF_DEPTH)), batch_lr_scale)
    optimizer = model.setup_optimizer(**rates)
    for group in optimizer.param_groups:
        group["lr"] *= lr_multiplier
        group["initial_lr"] = group["lr"]
    return model, optimizer, rates


def _compiled(model, optimizer, step, compile_model: bool, initial: dict):
    """(the model to step: torch.compile's or the eager one, a note, compile seconds): a few
    steps run to compile; a failed compile puts back the `initial` weights, eagerly."""
    import torch
    net, note = model, ""
    began = time.perf_counter()
    if compile_model:
        try:
            net = torch.compile(model, dynamic=False)
            for it in range(WARM_STEPS):
                step(net, it, 1000)
        except Exception as e:  # noqa: BLE001 -- inductor's failures have no common type
            note = f"torch.compile failed ({type(e).__name__}: {str(e)[:200]}); eager mode"
            print(f"note: {note}", flush=True)
            _eager_optimizer()
            net = model
            model.load_state_dict(initial)
            optimizer.state.clear()
            model.zero_grad(set_to_none=True)
    if net is model:
        for it in range(WARM_STEPS):
            step(net, it, 1000)
    return net, note, time.perf_counter() - began


def _timed(net, step, threads: int) -> tuple[int, float, dict]:
    """(the thread count, its step seconds, every count's): whichever of all our cores and one is faster here
    (torch's two threads on two vCPUs have measured slower than one at this size). A thread
    count is part of what inductor's kernels are compiled for: each count compiles its own
    graphs (hence the higher recompile limit) and warms up before it is timed."""
    import torch
    torch._dynamo.config.recompile_limit = max(64, torch._dynamo.config.recompile_limit)
    timed, it = {}, WARM_STEPS
    for count in sorted({threads, 1}, reverse=True):
        torch.set_num_threads(count)
        for _ in range(WARM_STEPS if count != threads else 0):
            step(net, it, 1000)
            it += 1
        began = time.perf_counter()
        for _ in range(MEASURE_STEPS):
            step(net, it, 1000)
            it += 1
        timed[count] = (time.perf_counter() - began) / MEASURE_STEPS
    threads = min(timed, key=timed.get)
    torch.set_num_threads(threads)
    return threads, timed[threads], timed


def _train_within(net, step, n: int, budget_s: float):
    """(steps done, steps planned, the first plan, the last train loss, seconds): `n` steps
    planned, re-planned once on the loop's own step time, stopped at `budget_s`."""
    import gc
    gc.collect()
    gc.freeze()
    gc.disable()  # as base_train does after its first step
    began, done, loss, first_plan = time.perf_counter(), 0, float("nan"), n
    while done < n and time.perf_counter() - began < budget_s:
        loss = step(net, done, n)
        done += 1
        if done == max(1, first_plan // 5):  # re-planned once, on the loop's own step time,
            elapsed = time.perf_counter() - began  # before the warmdown (its last 65%) starts
            n = done + max(1, int((budget_s - elapsed) * done / elapsed))
    train_s = time.perf_counter() - began
    gc.enable()
    return done, n, first_plan, loss, train_s


def _val_loss(model, source, windows) -> float:
    """The summed validation loss (nats) over our final evaluation's windows."""
    import torch
    model.eval()
    total = 0.0
    with torch.no_grad():
        for i in range(0, len(windows), 64):
            b = source.read_windows("val", windows[i:i + 64])
            total += model(torch.from_numpy(b["inputs"]).long(),
                           torch.from_numpy(b["targets"]).long(), loss_reduction="sum").item()
    return total


_CHILD = ("import json, sys; from transformer.lab.nanochat_side_by_side import "
          "train_nanochat; print('result:', json.dumps(train_nanochat(**json.loads(sys.argv[1]))))")


def _run_nanochat(args: dict, dtype: str) -> dict:
    env = dict(os.environ, **({"NANOCHAT_DTYPE": dtype} if dtype != "auto" else {}))
    _, log = nanogpt._run([sys.executable, "-c", _CHILD, json.dumps(args)], ROOT, env)
    for line in log.splitlines():
        if line.startswith(("nanochat seed", "note:")):
            print(f"    {line}", flush=True)
    return json.loads([line for line in log.splitlines() if line.startswith("result: ")][-1]
                      .removeprefix("result: "))


# ---- the pure pieces: the choice, the statistics, the record ------------------------------

def best_multiplier(sweep: dict) -> float:
    """The multiplier with the lowest val loss (a diverged run, NaN, never wins; ties go to
    the smaller multiplier)."""
    finite = {float(m): v for m, v in sweep.items() if v is not None and math.isfinite(v)}
    if not finite:
        raise SystemExit("error: every nanochat run of the sweep diverged")
    return min(finite, key=lambda m: (finite[m], m))


def summary(ours_losses, ours_wall_s, nano_losses, nano_wall_s, lr_multiplier, sweep,
            cpu: str) -> dict:
    """The JSON summary: both sides' losses (nats per byte) and training seconds per seed,
    their means and spreads, the sweep, the ratio ours/nanochat of the means and Welch's p,
    one-sided for "ours is lower" (speedrun_rows.welch_less; None with fewer than 2 seeds)."""
    ours, nano = speedrun_rows.summary(list(ours_losses)), speedrun_rows.summary(list(nano_losses))
    return {"ours": {"val_losses": list(ours_losses), "wall_s": list(ours_wall_s), **ours},
            "nanochat": {"val_losses": list(nano_losses), "wall_s": list(nano_wall_s),
                         "lr_multiplier": lr_multiplier, **nano},
            "sweep": {f"{float(m):g}": v if v is not None and math.isfinite(v) else None
                      for m, v in sweep.items()},
            "p_value": speedrun_rows.welch_less(list(ours_losses), list(nano_losses)),
            "ratio": ours["mean"] / nano["mean"], "cpu": cpu}


def report(s: dict, seeds: list[int], detail: dict) -> str:
    o, n = s["ours"], s["nanochat"]
    lines = [f"CPU: {s['cpu']}", f"nanochat: {detail['nanochat']}",
             f"budget: {detail['budget_s']:.1f}s of training each (ours: its evaluations "
             f"included, {detail['ours_eval_s']:.1f}s of it; nanochat: none)",
             f"sweep (seed {seeds[0]}): " + ", ".join(
                 f"x{m} " + ("diverged" if v is None else f"{v:.4f}")
                 for m, v in s["sweep"].items()) + f"; best x{n['lr_multiplier']:g}",
             "val loss: nats per byte of the same validation text",
             f"{'seed':>6} {'ours':>8} {'train s':>8} {'nanochat':>9} {'train s':>8} "
             f"{'steps/planned':>12}"]
    for i, seed in enumerate(seeds):
        lines.append(f"{seed:>6} {o['val_losses'][i]:8.4f} {o['wall_s'][i]:8.1f} "
                     f"{n['val_losses'][i]:9.4f} {n['wall_s'][i]:8.1f} "
                     f"{detail['steps'][i]:>12}")
    std = lambda x: "n/a" if x is None else f"{x:.4f}"  # noqa: E731
    p = "n/a (fewer than 2 seeds)" if s["p_value"] is None else f"{s['p_value']:.3g}"
    lines += [f"{'mean':>6} {o['mean']:8.4f} {'':8} {n['mean']:9.4f}",
              f"spread (max-min): ours {o['spread']:.4f}, nanochat {n['spread']:.4f}; std: "
              f"ours {std(o['std'])}, nanochat {std(n['std'])}",
              f"ratio ours/nanochat: {s['ratio']:.3f}; Welch t-test, one-sided (ours lower): "
              f"p = {p}"]
    return "\n".join(lines)


def as_record(s: dict, seeds: list[int], argv: list[str], cores: int, note: str = "") -> dict:
    """The summary as one docs/records/side_by_side.jsonl line (transformer.lab.records)."""
    from transformer.lab import records
    o, n = s["ours"], s["nanochat"]
    result = {"ours_val_loss": round(o["mean"], 4), "ours_spread": round(o["spread"], 4),
              "nanochat_val_loss": round(n["mean"], 4), "nanochat_spread": round(n["spread"], 4),
              "loss_ratio": round(s["ratio"], 3), "p_value": s["p_value"],
              "nanochat_lr_multiplier": n["lr_multiplier"],
              "train_s": round(sum(o["wall_s"]) / len(o["wall_s"]), 1)}
    for seed, a, b in zip(seeds, o["val_losses"], n["val_losses"]):
        result[f"ours_seed{seed}"], result[f"nanochat_seed{seed}"] = round(a, 4), round(b, 4)
    for m, v in s["sweep"].items():
        result[f"sweep_x{m}"] = None if v is None else round(v, 4)
    return records.record({"cpu": s["cpu"], "cores": cores},
                          "python -m transformer.lab.nanochat_side_by_side " + " ".join(argv),
                          list(seeds), result,
                          "; ".join(filter(None, ["Welch p one-sided (ours lower)", note])))


# ---- the run --------------------------------------------------------------------------------

def _our_sizes(ours_flags: list[str]) -> dict:
    """configs/default.py's sizes that nanochat copies, with any `--ours` overrides of them."""
    from transformer.config.files import quick_start
    c = quick_start()
    sizes = {"n_layers": c.model.n_layers, "d_model": c.model.d_model,
             "seq_len": c.model.max_seq_len, "batch_size": c.train.batch_size,
             "eval_tokens": c.train.eval_tokens}
    keys = {"model.n_layers": "n_layers", "model.d_model": "d_model",
            "model.max_seq_len": "seq_len", "train.batch_size": "batch_size",
            "train.eval_tokens": "eval_tokens"}
    for flag in ours_flags:
        key, _, value = flag.removeprefix("--config.").partition("=")
        if key in keys:
            sizes[keys[key]] = int(value)
    return sizes


def side_by_side(nanochat: Path, work: Path, ours_flags: list[str], seeds: list[int],
                 multipliers: list[float], batch_lr_scale: bool = False,
                 budget_s: float | None = None, dtype: str = "ours",
                 compile_model: bool = True) -> tuple[dict, dict]:
    """(the JSON summary, the details the table prints)."""
    cache = work / "cache"
    ours = [nanogpt.run_ours(work / f"ours-seed{s}", [*ours_flags, f"--config.train.seed={s}"],
                             cache) for s in seeds]
    for r in ours:
        if r["train_s"] is None or r["nats_per_byte"] is None:
            raise SystemExit("error: our run trained no step or has no final evaluation")
    prepared = nanogpt.prepared_set(cache)
    if dtype == "ours":
        matmul = re.search(r"^matmul: (\S+)", ours[0]["log"], re.M)
        dtype = "bfloat16" if matmul and matmul.group(1) == "fast_bf16" else "float32"
    budget = budget_s or sum(r["train_s"] for r in ours) / len(ours)
    sizes = _our_sizes(ours_flags)
    base = {"nanochat": str(nanochat.resolve()), "prepared": str(prepared),
            "batch_lr_scale": batch_lr_scale, "budget_s": budget,
            "threads": host.usable_cores(), "compile_model": compile_model, **sizes}
    print(f"... nanochat: {len(multipliers)} multipliers on seed {seeds[0]}, then "
          f"{len(seeds) - 1} more seeds; {budget:.1f}s of training each", flush=True)
    sweep_runs = {m: _run_nanochat({**base, "seed": seeds[0], "lr_multiplier": m}, dtype)
                  for m in multipliers}
    sweep = {m: r["nats_per_byte"] for m, r in sweep_runs.items()}
    best = best_multiplier(sweep)
    nano = [sweep_runs[best]] + [_run_nanochat({**base, "seed": s, "lr_multiplier": best}, dtype)
                                 for s in seeds[1:]]
    scored = re.findall(r"scores (?:the whole val split \(|)([\d,]+) (?:val )?tokens",
                        ours[0]["log"])
    if scored and int(scored[-1].replace(",", "")) != nano[0]["val_tokens"]:
        print(f"warning: ours scored {scored[-1]} validation tokens, nanochat "
              f"{nano[0]['val_tokens']:,}", flush=True)
    first = nano[0]
    s = summary([r["nats_per_byte"] for r in ours], [r["train_s"] for r in ours],
                [r["nats_per_byte"] for r in nano], [r["train_s"] for r in nano], best, sweep,
                host.cpu_line())
    params = re.search(r"params: ([\d,]+) total", ours[0]["log"])
    evals = [float(e) for r in ours
             for e in re.findall(r"\(evaluation ([\d.]+)s of it\)", r["log"])[-1:]]
    detail = {"budget_s": budget, "steps": [f"{r['steps']}/{r['planned_steps']}" for r in nano],
              "ours_eval_s": sum(evals) / len(evals) if evals else float("nan"),
              "dtype": first["dtype"],
              "nanochat": f"{first['params']:,} params ({first['matmul_params']:,} in matmuls; "
                          f"ours {params.group(1) if params else '?'}), {first['dtype']}, "
                          f"{first['train_s'] / first['steps'] * 1e3:.1f} ms/step on "
                          f"{first['threads']} thread(s) (seed {seeds[0]}), compile "
                          f"{first['compile_s']:.1f}s"
                          + (f"; {first['note']}" if first["note"] else "")}
    return s, detail


def main(argv):
    if len(argv) > 1:
        raise SystemExit(f"error: unexpected arguments {argv[1:]}")
    reason = skip_reason(F.nanochat.value)
    if reason:
        print(f"skipped: {reason}")
        return
    seeds = [int(s) for s in F.seeds.value]
    multipliers = [float(m) for m in F.multipliers.value]
    args = (Path(F.nanochat.value).expanduser(), F.ours.value, seeds, multipliers,
            F.batch_lr_scale.value, F.budget_s.value, F.dtype.value, F.compile.value)
    if F.work.value:
        work = Path(F.work.value)
        work.mkdir(parents=True, exist_ok=False)
        s, detail = side_by_side(args[0], work, *args[1:])
    else:
        with tempfile.TemporaryDirectory() as tmp:
            s, detail = side_by_side(args[0], Path(tmp), *args[1:])
    print(report(s, seeds, detail))
    if F.record.value:
        from transformer.lab import records
        note = f"nanochat in {detail['dtype']}, rates x{s['nanochat']['lr_multiplier']:g} " + \
            ("of its batch rule's" if F.batch_lr_scale.value else "of its unscaled ones")
        records.append(F.record.value, as_record(s, seeds, sys.argv[1:], host.usable_cores(),
                                                 note))
    print(json.dumps(s))


if __name__ == "__main__":
    define_flags()
    app.run(main)
