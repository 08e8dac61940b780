"""transformer/lab/nanogpt_side_by_side.py: what it hands nanoGPT is the prepared set,
token for token, and it skips in one line when nanoGPT or torch is missing. (The side-by-side
run itself needs a nanoGPT checkout and minutes of quiet CPU: docs/records.md has its
results.)"""

from __future__ import annotations

import functools
import importlib.util
import pickle
import subprocess
import sys

import numpy as np

from tests.conftest import ROOT
from transformer.data import prepare as prep
from transformer.data import prepared

TOOL = ROOT / "transformer" / "lab" / "nanogpt_side_by_side.py"


@functools.cache
def _tool():  # loaded once: its absl flags may be defined only once per process
    spec = importlib.util.spec_from_file_location("nanogpt_side_by_side", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_nanogpt_reads_the_prepared_splits_token_for_token(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(40):
        (docs / f"{i}.txt").write_text(f"document {i}: " + "é中 text " * (i + 3))
    folder = tmp_path / "prepared"
    prep.prepare([docs], folder, shard_tokens=300)  # several shards per split
    vocab = _tool().write_nanogpt_data(folder, tmp_path / "nano")
    manifest = prepared.read_manifest(folder)
    assert vocab == manifest["tokenizer"]["vocab_size"] == 257
    for split in ("train", "val"):
        shards = manifest["splits"][split]["shards"]
        want = np.concatenate([np.fromfile(folder / s["file"], np.dtype(manifest["dtype"]))
                               for s in shards])
        # nanoGPT's own reader: np.memmap(..., dtype=np.uint16)
        got = np.memmap(tmp_path / "nano" / f"{split}.bin", dtype=np.uint16, mode="r")
        assert len(want) == manifest["splits"][split]["tokens"] > 0
        np.testing.assert_array_equal(got, want)
    with open(tmp_path / "nano" / "meta.pkl", "rb") as f:
        assert pickle.load(f) == {"vocab_size": 257}


def test_nanogpt_val_lines_are_parsed():
    log = ("step 0: train loss 5.5912, val loss 5.5903\niter 0: loss 5.59\n"
           "step 250: train loss 2.1, val loss 2.2\nstep 2000: train loss 1.5, val loss 1.611\n")
    assert _tool().nanogpt_val_estimates(log) == [(0, 5.5903), (250, 2.2), (2000, 1.611)]


def test_without_a_nanogpt_checkout_it_skips_in_one_line(tmp_path):
    for args in ([], [f"--nanogpt={tmp_path}"]):
        done = subprocess.run([sys.executable, "-m", "transformer.lab.nanogpt_side_by_side",
                               *args], capture_output=True, text=True, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("skipped: "), done.stdout


def test_the_cpu_line_names_family_and_isa():
    from transformer import host
    zen4 = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
            "model name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512f avx512_bf16\n")
    line = host.cpu_line(zen4)
    assert line.startswith("AMD EPYC, family 25 model 17, ") and "CPUs" in line
    assert line.endswith("avx2 avx512f avx512_bf16")
    assert host.cpu_line("model name\t: old\nflags\t: fpu sse2\n").endswith("no AVX2")


def test_a_result_becomes_one_record_line(tmp_path):
    """--record appends the side by side in docs/records/' schema: the figures the report
    prints (nats per byte, wall seconds, the two ratios) and the seed of our run."""
    from transformer.lab import records
    result = {"cpu": "a CPU", "vocab": 257, "val_tokens": 10, "nanogpt_data": "byte",
              "ours": {"command": "python train.py --config.train.seed=1", "wall_s": 80.0,
                       "train_s": 70.0, "val_loss": 3.4, "nats_per_byte": 1.2},
              "nanogpt": {"command": "python train.py", "wall_s": 100.0, "val_loss_full": 1.8,
                          "nats_per_byte": 1.8, "checkpoint_step": 2000,
                          "val_loss_estimate": 1.83}}
    rec = _tool().as_record(result, ["--nanogpt=x"])
    records.append(tmp_path / "side_by_side.jsonl", rec)
    [back] = records.read(tmp_path / "side_by_side.jsonl")
    assert back["seeds"] == [1] and back["machine"]["cpu"] == "a CPU"
    assert back["result"]["loss_ratio"] == 0.667 and back["result"]["wall_ratio"] == 0.8
    assert back["command"].endswith("--nanogpt=x")
