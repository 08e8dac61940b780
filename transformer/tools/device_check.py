"""Checks an accelerator end to end in one command: the tests that mean something on a device,
then the bench's training line with tokens/s and MFU against the chip's datasheet peak.

    python -m transformer device_check                    # GPU / TPU: GPT-2 small in bfloat16
    python -m transformer device_check --bench_config=configs/default.py
    python -m transformer device_check --nobench          # only the tests
    python -m transformer device_check --tests_k=bfloat16  # only the device tests matching

The tests are the ones marked `@pytest.mark.device` (cached decoding equals the full forward,
a sharded step equals one device over the real devices, a bfloat16 training step, the decode
program, no recompiles, cuDNN attention where there is a GPU); they run in a pytest process of
their own, from the repository's `tests/` folder, which imports only the test modules whose
text names the marker (`device_test_files`), not every module of the suite. The bench then
runs in another process, so each gets the accelerator's memory to itself. On a CPU the same
command is a smoke test: the bench takes a tiny shape and few steps (CI runs it so, and the
command stays working).

Prints one summary line per part and exits non-zero when a part failed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from absl import flags

from transformer import cli

_ROOT = Path(__file__).resolve().parents[2]  # the checkout: transformer/tools/ -> .
_BENCH_CONFIG = flags.DEFINE_string(
    "bench_config", "", "Config file for the bench line (default: configs/gpt2_small.py on a "
    "GPU/TPU, configs/tiny.py with a few short rounds on a CPU).")
_TESTS = flags.DEFINE_bool("tests", True, "Run the tests marked `device`.")
_BENCH = flags.DEFINE_bool("bench", True, "Run the bench's bfloat16 training line.")
_TESTS_K = flags.DEFINE_string(
    "tests_k", "", "Only the device tests matching this pytest -k expression (a quick check; "
    "the test suite's CPU smoke run of this command uses it).")

# On a CPU the bench is a smoke test: one short round of a tiny shape.
_CPU_SMOKE = ["--config=configs/tiny.py", "--rounds=1", "--steps=2", "--warmup=1",
              "--decode_reps=1", "--new_tokens=8", "--config.data.corpus=random"]


def platform() -> tuple[str, str, int]:
    """(platform, device kind, device count), asked in a child process: this one must not
    hold an accelerator (JAX takes most of a GPU's memory when it first touches it)."""
    code = ("import jax, json; d = jax.devices(); "
            "print(json.dumps([d[0].platform, d[0].device_kind, len(d)]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=_ROOT, timeout=300)
    if out.returncode:
        cli.fail(f"JAX found no usable device: {out.stderr.strip().splitlines()[-1:]}", 1)
    kind, name, count = json.loads(out.stdout.strip().splitlines()[-1])
    return kind, name, count


def check_test_tools() -> None:
    """The device tests run under pytest (and its xdist plugin's -n flag): without the test
    extra they cannot start, which is one line, not a failed check."""
    missing = [m for m in ("pytest", "xdist") if importlib.util.find_spec(m) is None]
    if missing:
        cli.fail(f"the device tests need {' and '.join(missing)}, which this environment lacks: "
                 "pip install -e \".[test]\" (the test extra), or pass --notests")


def device_test_files(tests: Path) -> list[str]:
    """The test modules in `tests` whose text names the device marker (`mark.device`), or the
    folder itself if none does: pytest imports a module to read its marks, and importing
    every module of the suite for the few that mark device tests cost ~2 s of CPU (and, on
    a machine with a GPU, each module's imports before the first test)."""
    files = sorted(str(p) for p in tests.glob("test_*.py") if "mark.device" in p.read_text())
    return files or [str(tests)]


def run_tests() -> bool:
    tests = _ROOT / "tests"
    if not tests.is_dir():
        cli.fail(f"no tests/ folder next to the package ({tests}): run from a checkout of the "
                 "repository (pip install -e .), or pass --notests")
    # One pytest process (-n 0: no xdist workers): the tests then share the accelerator's
    # memory with nobody.
    cmd = [sys.executable, "-m", "pytest", "-m", "device", "-q", "-p", "no:cacheprovider",
           "-n", "0", *(["-k", _TESTS_K.value] if _TESTS_K.value else []),
           *device_test_files(tests)]
    print("$ python " + " ".join(cmd[1:]), flush=True)
    result = subprocess.run(cmd, cwd=_ROOT)
    return result.returncode == 0


def config_path(value: str) -> str:
    """--bench_config as the bench (run from the checkout) finds it: a file relative to where
    this command runs made absolute (a `:override` tail, as config files take, kept)."""
    path, colon, rest = value.partition(":")
    return os.path.abspath(path) + colon + rest if os.path.isfile(path) else value


def bench_command(kind: str) -> list[str]:
    cmd = [sys.executable, "-m", "transformer", "bench", "--modes=bf16", "--no_peer", "--json"]
    if _BENCH_CONFIG.value:
        return cmd + [f"--config={config_path(_BENCH_CONFIG.value)}"]
    return cmd + (_CPU_SMOKE if kind == "cpu" else ["--config=configs/gpt2_small.py"])


def bench_line(r: dict) -> str:
    m, mc = r["machine"], r["config"]["model"]
    return (f"bench: {m['device_kind']} x{m['device_count']} ({m['platform']}), "
            f"{mc['n_layers']} layers d_model {mc['d_model']} context {mc['max_seq_len']} "
            f"batch {r['config']['train']['batch_size']}, bf16: "
            f"{r['train_tokens_per_s_bf16']:,.0f} tokens/s, MFU {r['mfu_bf16']:.1%} of "
            f"{r['peak_flops_bf16'] / 1e12:.3g} TFLOP/s ({r['peak_source']}), "
            f"recompiles after warm-up: {r['recompiles_after_warmup']}")


def run_bench(kind: str) -> bool:
    cmd = bench_command(kind)
    print("$ python " + " ".join(cmd[1:]), flush=True)
    result = subprocess.run(cmd, cwd=_ROOT, capture_output=True, text=True)
    if result.returncode:
        print(result.stderr[-3000:], file=sys.stderr)
        print("bench: FAILED")
        return False
    r = json.loads(result.stdout.strip().splitlines()[-1])
    print(bench_line(r))
    return r["recompiles_after_warmup"] == 0


def main(argv):
    if len(argv) > 1:
        cli.fail(f"unexpected arguments {argv[1:]}: flags look like --name=value")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    if _TESTS.value:
        check_test_tools()
    kind, name, count = platform()
    print(f"device check: {count} x {name} ({kind})"
          + (" - a CPU: the bench runs as a smoke test" if kind == "cpu" else ""), flush=True)
    results = {}
    if _TESTS.value:
        results["tests"] = run_tests()
    if _BENCH.value:
        results["bench"] = run_bench(kind)
    print("device check: " + ", ".join(f"{k} {'ok' if ok else 'FAILED'}"
                                        for k, ok in results.items()))
    if not all(results.values()):
        sys.exit(1)


if __name__ == "__main__":
    cli.run(main)
