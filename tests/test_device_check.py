"""`python -m transformer device_check` on a CPU: the accelerator check as a smoke test (a
device-marked test in a pytest process of its own, then a tiny bench line), so the command
keeps working between GPU runs. The suite itself runs every device-marked test; here one,
chosen with --tests_k, shows that the command finds, runs and reports them."""

from conftest import run_cli


def test_device_check_runs_the_device_tests_and_the_bench_line():
    result = run_cli("-m", "transformer", "device_check",
                     "--tests_k=cudnn_attention_is_asked_for_only_by_its_name", timeout=600)
    out = result.stdout
    assert result.returncode == 0, (out + result.stderr)[-3000:]
    assert "-m device" in out and "1 passed" in out and "failed" not in out
    bench = next(line for line in out.splitlines() if line.startswith("bench: "))
    assert "tokens/s, MFU" in bench and "recompiles after warm-up: 0" in bench
    assert out.rstrip().endswith("device check: tests ok, bench ok")


def test_device_check_fails_when_the_bench_fails():
    result = run_cli("-m", "transformer", "device_check", "--notests",
                     "--bench_config=configs/no_such_config.py")
    assert result.returncode == 1
    assert "bench: FAILED" in result.stdout
    assert result.stdout.rstrip().endswith("device check: bench FAILED")


def test_device_check_without_pytest_says_to_install_the_test_extra():
    hide_pytest = ("import importlib.util as u, runpy, sys; real = u.find_spec; "
                   "u.find_spec = lambda n, *a: None if n in ('pytest', 'xdist') else real(n, *a); "
                   "sys.argv = ['device_check']; "
                   "runpy.run_module('transformer.tools.device_check', run_name='__main__')")
    result = run_cli("-c", hide_pytest, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and '.[test]' in line and "--notests" in line
