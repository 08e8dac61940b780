"""The bench and the MFU arithmetic it and train.py share."""

import dataclasses
import functools
import json

import jax
import pytest

from tests.conftest import run_cli
from transformer.config import ModelConfig
from transformer.model import flops
from transformer.model.gpt import init_params
from transformer.train import metrics

# The shape and rounds of `python -m transformer device_check`'s CPU smoke bench: the same
# programs, so the session's compilation cache (conftest.py) builds them once for all three.
SMOKE = ["--config=configs/tiny.py", "--rounds=1", "--steps=2", "--warmup=1", "--decode_reps=1",
         "--new_tokens=8", "--config.data.corpus=random"]


def test_bench_and_training_count_flops_with_the_project_counter():
    """MFU's numerator is flops.py's 6N + causal attention: doubling the context adds only
    the attention term, 6·L·D per extra key position on average over the causal triangle."""
    L, D, F, V, T = 4, 256, 1024, 256, 256
    config = ModelConfig(vocab_size=V, d_model=D, n_layers=L, n_heads=4, d_ff=F, max_seq_len=T)
    # The real model's parameter tree, its shapes only (no arrays made: ~1.5 s less)
    params = jax.eval_shape(functools.partial(init_params, config), jax.random.key(0))
    n_matmul = sum(x.size for path, x in jax.tree_util.tree_leaves_with_path(params)
                   if "kernel" in jax.tree_util.keystr(path)) + V * D
    assert flops.train_flops_per_token(config) == 6 * n_matmul + 6 * L * D * (T + 1)
    longer = dataclasses.replace(config, max_seq_len=2 * T)
    assert flops.train_flops_per_token(longer) - flops.train_flops_per_token(config) == (
        6 * L * D * T)


def test_mfu_is_achieved_over_peak():
    assert metrics.mfu(1000.0, 2e9, 4e12) == pytest.approx(0.5)
    assert metrics.mfu(1000.0, 2e9, 1e12, n_devices=4) == pytest.approx(0.5)


def test_peak_comes_from_the_table_on_accelerators_and_is_measured_on_cpu():
    class FakeGPU:
        platform, device_kind = "gpu", "NVIDIA H100 80GB HBM3"
    assert metrics.peak_flops("bfloat16", FakeGPU()) == (989e12, "datasheet (H100)")
    # float32 matmuls run as TF32 at jax's default precision: that is the peak, not 67e12
    # (conftest asks for "highest" on a real GPU: the default is set here explicitly)

    class FakeTPU:
        platform, device_kind = "tpu", "TPU v4"
    with jax.default_matmul_precision("default"):
        peak, source = metrics.peak_flops("float32", FakeGPU())
        assert peak == 494.7e12 and "tf32" in source
        assert metrics.peak_flops("float32", FakeTPU())[0] == 275e12  # one bfloat16 pass
    with jax.default_matmul_precision("highest"):
        assert metrics.peak_flops("float32", FakeGPU()) == (67e12, "datasheet (H100)")
    peak, source = metrics.peak_flops("float32", jax.devices("cpu")[0])
    assert 1e8 < peak < 1e14 and source.startswith("measured")


@pytest.mark.parametrize("device_kind, entry", [
    ("NVIDIA L4", "L4"), ("NVIDIA L40S", None), ("NVIDIA L40", None),
    ("NVIDIA A10", "A10"), ("NVIDIA A100-SXM4-80GB", "A100"), ("NVIDIA H200", "H200"),
    ("TPU v5 lite", "TPU v5 lite"), ("TPU v5", "TPU v5"), ("TPU v6 lite", "TPU v6")])
def test_the_datasheet_entry_is_the_chip_named_not_a_prefix_of_its_name(device_kind, entry):
    """An L40S (362 TFLOP/s bfloat16) is not an L4 (121): taking the L4's peak would report
    3x its MFU. A chip the table lacks gets None (peak_flops then measures a matmul); v5p
    reports itself as "TPU v5" (jax's pallas tpu_info)."""
    assert metrics.datasheet(device_kind) == entry
    if entry == "TPU v5":
        assert metrics.PEAK_FLOPS[entry]["bfloat16"] == 459e12  # v5p's, not v5e's 197


def test_bench_json_has_the_figures_and_no_recompiles():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    result = run_cli("-m", "transformer", "bench", "--json", *SMOKE)
    assert result.returncode == 0, result.stderr[-2000:]
    r = json.loads(result.stdout)
    for key in ("train_tokens_per_s", "peer_train_tokens_per_s", "decode_tokens_per_s_b1",
                "peer_decode_tokens_per_s_b1", "decode_tokens_per_s_b8",
                "peer_decode_tokens_per_s_b8", "mfu", "compiles", "config",
                "train_tokens_per_s_bf16", "val_loss_ratio_bf16"):
        assert key in r, key
        if key not in ("compiles", "config"):
            assert r[key] > 0, key
    assert isinstance(r["page_faults_per_step"], float)
    assert isinstance(r["page_faults_per_step_bf16"], float)
    assert r["matmul_auto"]["mode"] in ("plain", "fast_f32", "fast_bf16")
    assert "xla_cpu_max_isa cap" in r["machine"]["isa"]
    assert r["config"]["model"]["d_model"] == 64
    # One program per shape: repeated steps and generations never compile again.
    assert r["recompiles_after_warmup"] == 0
    # Decoding compiles its cache allocation and the one program of its token budget;
    # prefilling (one token) runs the same budget's program here (8 and 1 tokens: budget 16).
    assert r["compiles"]["decode_b1"] <= 3 and r["compiles"].get("prefill_b1", 0) == 0
    # Batch 8 runs in the groups row_groups picks, every group the same program.
    assert r["decode_groups_b1"] == 1 and 8 % r["decode_groups_b8"] == 0
    assert r["compiles"]["decode_b8"] <= 3 and r["compiles"].get("prefill_b8", 0) == 0


def test_the_page_fault_figure_counts_the_pages_a_step_maps_in():
    """bench.minor_faults (each timed step's `page_faults_per_step`) is the process's count:
    64 MiB of fresh anonymous memory, written once, raises it by at least half its pages."""
    import mmap

    from transformer.tools import bench
    before = bench.minor_faults()
    region = mmap.mmap(-1, 64 << 20)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):  # 4 KiB pages even where THP is "always"
        region.madvise(mmap.MADV_NOHUGEPAGE)
    region.write(b"\x01" * (64 << 20))
    assert bench.minor_faults() - before >= (64 << 20) // mmap.PAGESIZE // 2
    region.close()


def test_bench_without_the_peer_prints_a_table_and_appends_a_record(tmp_path):
    path = tmp_path / "records" / "bench.jsonl"
    result = run_cli("-m", "transformer", "bench", "--no_peer", "--modes=f32", *SMOKE,
                     f"--record={path}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "train tokens/s, f32" in result.stdout and "decode tokens/s, batch 8" in result.stdout
    assert "isa: " in result.stdout and "model.matmul=auto picks " in result.stdout
    from transformer.lab import records
    [rec] = records.read(path)  # one line in docs/records/' schema
    assert rec["result"]["train_tokens_per_s"] > 0 and rec["machine"]["cores"] >= 1
    assert rec["command"].startswith("python -m transformer bench --no_peer")


def test_bench_refuses_a_bad_mode():
    result = run_cli("-m", "transformer", "bench", "--no_peer", "--modes=fp8")
    assert result.returncode == 2 and result.stderr.startswith("error: --modes=fp8")


def test_a_test_session_hands_its_measured_peaks_to_train_py(monkeypatch):
    """TRANSFORMER_TEST_MATMUL_PEAKS (set by tests/conftest.py, read by train.py) is taken as
    the process's measurement: peak_flops on the CPU returns it and measures nothing."""
    from transformer.train.faults import TestHooks
    hooks = TestHooks.from_env({"TRANSFORMER_TEST_MATMUL_PEAKS": "float32=1.5e11,bfloat16=6e11"})
    assert hooks.matmul_peaks == (("float32", 1.5e11), ("bfloat16", 6e11))
    assert TestHooks.from_env({}).matmul_peaks == ()
    monkeypatch.setattr(metrics, "_MEASURED_PEAK", {})
    hooks.install()
    cpu = jax.devices("cpu")[0]
    monkeypatch.setattr(jax, "jit", lambda *a, **k: pytest.fail("measured again"))
    assert metrics.peak_flops("float32", cpu) == (1.5e11, f"measured ({cpu.device_kind} matmul)")
    assert metrics.peak_flops("bfloat16", cpu)[0] == 6e11
