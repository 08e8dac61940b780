"""`python -m transformer.device_check` on a CPU: the accelerator check as a smoke test (the
device-marked tests, then a tiny bench line), so the command keeps working between GPU runs."""

from conftest import run_cli


def test_device_check_runs_the_device_tests_and_the_bench_line():
    result = run_cli("-m", "transformer.device_check", timeout=600)
    out = result.stdout
    assert result.returncode == 0, (out + result.stderr)[-3000:]
    assert "-m device" in out and " passed" in out and "failed" not in out
    bench = next(line for line in out.splitlines() if line.startswith("bench: "))
    assert "tokens/s, MFU" in bench and "recompiles after warm-up: 0" in bench
    assert out.rstrip().endswith("device check: tests ok, bench ok")


def test_device_check_fails_when_the_bench_fails():
    result = run_cli("-m", "transformer.device_check", "--notests",
                     "--bench_config=configs/no_such_config.py")
    assert result.returncode == 1
    assert "bench: FAILED" in result.stdout
    assert result.stdout.rstrip().endswith("device check: bench FAILED")
