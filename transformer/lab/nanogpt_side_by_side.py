"""The quick start and nanoGPT's README CPU recipe, one after the other, on the same bytes.

    python -m transformer.lab.nanogpt_side_by_side --nanogpt=path/to/nanoGPT   # a checkout of it
    python -m transformer.lab.nanogpt_side_by_side --nanogpt=... --ours=--config.train.steps=300

1. runs this project's `python train.py` (the README's first command's training, in a fresh
   workdir and a fresh data cache, so it prepares the quick start's data itself) and times it;
2. writes the same text's train and validation shards in nanoGPT's layout
   (`data/<dataset>/train.bin`, `val.bin` as uint16, `meta.pkl` with the vocabulary) inside a
   scratch folder that links to nanoGPT's own `train.py`, `model.py`, `configurator.py` and
   `config/` (nothing of nanoGPT is copied, here or into the project). nanoGPT's README recipe
   is character-level, so by default it gets the text as byte tokens (the quick start's text
   and split, prepared by our cache with `data.tokenizer=byte`: vocabulary 257);
   `--nanogpt_data=ours` hands it our run's own prepared set instead (BPE tokens since the
   quick start uses them), which tells the tokenizer's share of the gap from the recipe's;
3. runs nanoGPT's `train.py` there with its README's CPU flags, word for word, plus
   `--dataset` and `--out_dir`, and times it;
4. scores nanoGPT's saved checkpoint on the whole validation split (every token a target
   once, windows of its context) with nanoGPT's own model code, since its printed val loss is
   an estimate from 20 random batches; our run's final val loss covers the whole split too;
5. prints both val losses in nats per byte of the same validation text (each run's nats
   per token times its set's tokens per byte: the only unit in which runs with different
   tokenizers compare), both wall times and the CPU (model, family/model numbers, ISA).

It needs torch (the test extra) and a nanoGPT checkout; without either it prints one
`skipped:` line and exits 0. Run it on a quiet machine: the two runs share the same cores.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from absl import app, flags

from transformer import host
from transformer.lab.speedrun_rows import TRAINED  # train.py's `trained steps 0..N in T s`

ROOT = Path(__file__).resolve().parents[2]  # the project: train.py, configs/

# nanoGPT README's "I only have a macbook" CPU command, word for word (its config file and flags).
NANOGPT_CPU = ["config/train_shakespeare_char.py", "--device=cpu", "--compile=False",
               "--eval_iters=20", "--log_interval=1", "--block_size=64", "--batch_size=12",
               "--n_layer=4", "--n_head=4", "--n_embd=128", "--max_iters=2000",
               "--lr_decay_iters=2000", "--dropout=0.0"]
DATASET = "quickstart"


class _Flags:
    """The tool's absl flags, defined only when it runs as a program (`define_flags`): absl's
    flags are process-wide, and the tests import this module beside the bench, which has a
    --record of its own."""


F = _Flags()


def define_flags() -> None:
    F.nanogpt = flags.DEFINE_string("nanogpt", None,
                                    "A checkout of karpathy/nanoGPT (its train.py).")
    F.ours = flags.DEFINE_multi_string("ours", [], "Extra flags for our train.py (repeatable).")
    F.nano_extra = flags.DEFINE_multi_string(
        "nanogpt_flag", [], "Extra flags after nanoGPT's README ones (repeatable), e.g. "
        "--nanogpt_flag=--max_iters=20 for a quick try; the published comparison uses none.")
    F.data = flags.DEFINE_enum(
        "nanogpt_data", "byte", ["byte", "ours"],
        "What nanoGPT trains on: byte, the same text as byte tokens (its recipe is "
        "character-level; the published comparison), or ours, our run's own prepared set "
        "(its tokenizer).")
    F.record = flags.DEFINE_string("record", None, "Append the result as one line to this JSON "
                                   "Lines file (docs/records/side_by_side.jsonl; docs/records.md).")
    F.work = flags.DEFINE_string("work", None,
                                 "Scratch folder (default: a temporary one, removed).")


def skip_reason(nanogpt: str | None) -> str | None:
    if not nanogpt:
        return "no --nanogpt=PATH (a checkout of karpathy/nanoGPT) given"
    if not (Path(nanogpt) / "train.py").is_file() or not (Path(nanogpt) / "model.py").is_file():
        return f"{nanogpt} is not a nanoGPT checkout (no train.py and model.py)"
    return torch_missing()


def torch_missing() -> str | None:
    """Why a peer that runs on torch cannot run here, or None."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return "torch is not installed (pip install -e '.[bench]')"
    return None


def write_nanogpt_data(prepared: Path, out: Path) -> int:
    """A prepared folder's splits as nanoGPT reads a dataset: each split's shards one after
    another in one uint16 file, and meta.pkl's vocab_size. Returns the vocabulary."""
    manifest = json.loads((prepared / "manifest.json").read_text())
    vocab = int(manifest["tokenizer"]["vocab_size"])
    if vocab > np.iinfo(np.uint16).max + 1:
        raise SystemExit(f"error: vocabulary {vocab} does not fit nanoGPT's uint16 files")
    out.mkdir(parents=True, exist_ok=True)
    dtype = np.dtype(manifest["dtype"])
    for split, name in (("train", "train.bin"), ("val", "val.bin")):
        with open(out / name, "wb") as f:
            for shard in manifest["splits"][split]["shards"]:
                f.write(np.fromfile(prepared / shard["file"], dtype).astype(np.uint16).tobytes())
    with open(out / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": vocab}, f)
    return vocab


_NANOGPT_EVAL = r"""
import sys, numpy as np, torch
sys.path.insert(0, sys.argv[1])
from model import GPT, GPTConfig
ckpt = torch.load(sys.argv[2], map_location="cpu")
model = GPT(GPTConfig(**ckpt["model_args"]))
model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()})
model.eval()
val = np.fromfile(sys.argv[3], np.uint16).astype(np.int64)
T = ckpt["model_args"]["block_size"]
n = (len(val) - 1) // T  # windows of T + 1 tokens overlapping by one: each token a target once
x = torch.from_numpy(val[: n * T].reshape(n, T))
y = torch.from_numpy(val[1 : n * T + 1].reshape(n, T))
total = 0.0
with torch.no_grad():
    for i in range(0, n, 64):
        logits, _ = model(x[i:i + 64], y[i:i + 64])
        total += torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), y[i:i + 64].reshape(-1), reduction="sum").item()
print(f"{total / (n * T)} {n * T} {ckpt['iter_num']}")
"""


def byte_set(ours_flags: list[str]) -> Path:
    """The quick start's text and split as byte tokens: configs/default.py's data fields with
    ours' `--config.data.*` overrides, `data.tokenizer=byte`, prepared by our cache (under
    TRANSFORMER_CACHE, which the caller points at the scratch folder)."""
    from transformer import data
    from transformer.config.files import quick_start
    from transformer.train.resolve import resolve
    config = quick_start()
    for flag in ours_flags:
        key, _, value = flag.removeprefix("--config.").partition("=")
        if key.startswith("data."):
            field = key.removeprefix("data.")
            config.data[field] = type(config.data[field])(value)  # str, int or float fields
    config.data.tokenizer = "byte"
    config, _ = resolve(config)
    _, source = data.load(config)
    return source.folder


def tokens_per_byte(prepared: Path) -> float:
    """Validation tokens per byte of validation text, from the prepared set's manifest."""
    val = json.loads((prepared / "manifest.json").read_text())["splits"]["val"]
    return val["tokens"] / val["bytes"]


def nanogpt_val_estimates(log: str) -> list[tuple[int, float]]:
    """(step, val loss) from nanoGPT's 'step N: train loss X, val loss Y' lines."""
    return [(int(s), float(v)) for s, v in
            re.findall(r"^step (\d+): train loss [\d.]+, val loss ([\d.]+)", log, re.M)]


def _run(cmd, cwd, env=None) -> tuple[float, str]:
    begin = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - begin
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
        raise SystemExit(f"error: {' '.join(map(str, cmd))} exited {done.returncode}")
    return wall, done.stdout + done.stderr


def run_ours(workdir: Path, ours_flags: list[str], cache: Path) -> dict:
    """Our `python train.py` in a fresh `workdir`, its data prepared into (or read from)
    `cache`: its wall time, its training time (the `trained steps 0..N in T s` line:
    evaluation included, compile not; None if it trained no step) and its final val loss (nats
    per token and nats per byte; None without an evaluation)."""
    env = dict(os.environ, TRANSFORMER_CACHE=str(cache))
    cmd = [sys.executable, "train.py", f"--workdir={workdir}", "--no_progress", *ours_flags]
    print(f"... ours: {' '.join(cmd[1:])}", flush=True)
    wall, log = _run(cmd, ROOT, env)
    trained = [seconds for _, seconds in TRAINED.findall(log)]
    evals = [json.loads(line) for line in (workdir / "metrics.jsonl")
             .read_text().splitlines() if "val_bpb" in line]
    last = evals[-1] if evals else {}
    return {"command": "python train.py " + " ".join(ours_flags), "wall_s": wall,
            "train_s": float(trained[-1]) if trained else None, "val_loss": last.get("val_loss"),
            "nats_per_byte": last["val_bpb"] * math.log(2) if evals else None, "log": log}


def prepared_set(cache: Path) -> Path:
    """The one prepared set our run left in `cache` (its folder: manifest and shards)."""
    manifests = list(cache.rglob("manifest.json"))
    if len(manifests) != 1:
        raise SystemExit(f"error: expected one prepared set in {cache}, found {len(manifests)}")
    return manifests[0].parent


def side_by_side(nanogpt: Path, work: Path, ours_flags: list[str],
                 nanogpt_flags: list[str] = (), nanogpt_data: str = "byte") -> dict:
    ours = run_ours(work / "ours", ours_flags, work / "cache")
    ours.pop("log")
    prepared = prepared_set(work / "cache")
    if nanogpt_data == "byte":
        os.environ["TRANSFORMER_CACHE"] = str(work / "cache")
        prepared = byte_set(ours_flags)

    run_dir = work / "nanogpt"
    run_dir.mkdir()
    for name in ("train.py", "model.py", "configurator.py", "config"):
        (run_dir / name).symlink_to((nanogpt / name).resolve())
    vocab = write_nanogpt_data(prepared, run_dir / "data" / DATASET)
    flags_ = [*NANOGPT_CPU, *nanogpt_flags]
    cmd = [sys.executable, "train.py", *flags_, f"--dataset={DATASET}", "--out_dir=out"]
    print(f"... nanoGPT: {' '.join(cmd[1:])}", flush=True)
    nano_wall, nano_log = _run(cmd, run_dir)
    estimates = nanogpt_val_estimates(nano_log)
    _, scored = _run([sys.executable, "-c", _NANOGPT_EVAL, str(nanogpt.resolve()),
                         str(run_dir / "out" / "ckpt.pt"),
                         str(run_dir / "data" / DATASET / "val.bin")], run_dir)
    nano_val, val_tokens, ckpt_step = scored.split()[-3:]
    return {"cpu": host.cpu_line(), "vocab": vocab, "val_tokens": int(val_tokens),
            "nanogpt_data": nanogpt_data, "ours": ours,
            "nanogpt": {"command": "python train.py " + " ".join(flags_),
                        "wall_s": nano_wall, "val_loss_full": float(nano_val),
                        "nats_per_byte": float(nano_val) * tokens_per_byte(prepared),
                        "checkpoint_step": int(ckpt_step),
                        "val_loss_estimate": estimates[-1][1] if estimates else None}}


def report(r: dict) -> str:
    o, n = r["ours"], r["nanogpt"]
    return "\n".join([
        f"CPU: {r['cpu']}",
        f"data: the quick start's text; nanoGPT read "
        + ("it as byte tokens" if r["nanogpt_data"] == "byte" else "our prepared set")
        + f" (vocabulary {r['vocab']}, {r['val_tokens']:,} validation tokens scored)",
        "val loss: nats per byte of the same validation text (nats per token in brackets)",
        f"{'':10} {'val loss':>18} {'wall s':>8} {'train s':>8}",
        f"{'ours':10} {o['nats_per_byte']:9.4f} ({o['val_loss']:6.4f}) {o['wall_s']:8.1f} "
        f"{o['train_s'] or float('nan'):8.1f}",
        f"{'nanoGPT':10} {n['nats_per_byte']:9.4f} ({n['val_loss_full']:6.4f}) "
        f"{n['wall_s']:8.1f} {'':>8}"
        f"   (its own 20-batch estimate: {n['val_loss_estimate']}; checkpoint of step "
        f"{n['checkpoint_step']})",
        f"ratios ours/nanoGPT: val loss {o['nats_per_byte'] / n['nats_per_byte']:.3f}, "
        f"wall time {o['wall_s'] / n['wall_s']:.3f}",
    ])


def as_record(r: dict, argv: list[str]) -> dict:
    """The result as one docs/records/side_by_side.jsonl line (transformer.lab.records)."""
    from transformer.lab import records
    o, n = r["ours"], r["nanogpt"]
    seed = [int(f.split("=", 1)[1]) for f in o["command"].split()
            if f.startswith("--config.train.seed=")]
    figures = {"ours_val_loss": round(o["nats_per_byte"], 4), "ours_wall_s": round(o["wall_s"], 1),
               "ours_train_s": o["train_s"], "nanogpt_val_loss": round(n["nats_per_byte"], 4),
               "nanogpt_wall_s": round(n["wall_s"], 1),
               "loss_ratio": round(o["nats_per_byte"] / n["nats_per_byte"], 3),
               "wall_ratio": round(o["wall_s"] / n["wall_s"], 3)}
    return records.record({"cpu": r["cpu"], "cores": os.cpu_count()},
                          "python -m transformer.lab.nanogpt_side_by_side " + " ".join(argv),
                          seed[-1:] or [0], figures, f"nanoGPT data: {r['nanogpt_data']}")


def main(argv):
    if len(argv) > 1:
        raise SystemExit(f"error: unexpected arguments {argv[1:]}")
    reason = skip_reason(F.nanogpt.value)
    if reason:
        print(f"skipped: {reason}")
        return
    nanogpt = Path(F.nanogpt.value).expanduser()
    if F.work.value:
        work = Path(F.work.value)
        work.mkdir(parents=True, exist_ok=False)
        result = side_by_side(nanogpt, work, F.ours.value, F.nano_extra.value, F.data.value)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            result = side_by_side(nanogpt, Path(tmp), F.ours.value, F.nano_extra.value,
                                  F.data.value)
    print(report(result))
    print(json.dumps(result))
    if F.record.value:
        from transformer.lab import records
        records.append(F.record.value, as_record(result, sys.argv[1:]))


if __name__ == "__main__":
    define_flags()
    app.run(main)
