"""`python -m transformer device_check` on a CPU: the accelerator check as a smoke test (a
device-marked test in a pytest process of its own, then a tiny bench line), so the command
keeps working between GPU runs. The suite itself runs every device-marked test; here one,
chosen with --tests_k, shows that the command finds, runs and reports them."""

import pytest
from conftest import run_cli


@pytest.mark.slow  # ~18 s of CPU: a pytest and a bench process (docs/testing.md)
def test_device_check_runs_the_device_tests_and_the_bench_line():
    result = run_cli("-m", "transformer", "device_check",
                     "--tests_k=cudnn_attention_is_asked_for_only_by_its_name", timeout=600)
    out = result.stdout
    assert result.returncode == 0, (out + result.stderr)[-3000:]
    assert "-m device" in out and "1 passed" in out and "failed" not in out
    bench = next(line for line in out.splitlines() if line.startswith("bench: "))
    assert "tokens/s, MFU" in bench and "recompiles after warm-up: 0" in bench
    assert out.rstrip().endswith("device check: tests ok, bench ok")


def test_every_device_test_lies_in_a_file_device_check_hands_to_pytest(request):
    """device_check's pytest imports only the modules whose text names the device marker:
    every device-marked test this session collected (in the default run, the whole suite's)
    is in one of them."""
    from pathlib import Path

    from conftest import ROOT
    from transformer.tools import device_check
    files = {Path(f).name for f in device_check.device_test_files(ROOT / "tests")}
    marked = {item.path.name for item in request.session.items
              if item.get_closest_marker("device")}
    assert marked <= files, marked - files
    assert "test_device.py" in files and "test_bench.py" not in files


def test_device_check_fails_when_the_bench_fails():
    result = run_cli("-m", "transformer", "device_check", "--notests",
                     "--bench_config=configs/no_such_config.py")
    assert result.returncode == 1
    assert "bench: FAILED" in result.stdout
    assert result.stdout.rstrip().endswith("device check: bench FAILED")


def test_a_relative_bench_config_is_read_from_where_the_command_runs(tmp_path):
    # The bench runs from the checkout; a config named relative to the user's folder must
    # still be the one it reads (this one stops the bench at once, saying it was read).
    (tmp_path / "mine.py").write_text("def get_config():\n    raise ValueError('mine.py was read')\n")
    result = run_cli("-m", "transformer", "device_check", "--notests", "--bench_config=mine.py",
                     cwd=tmp_path)
    assert "mine.py was read" in result.stderr, result.stderr[-2000:]
    assert "No such file" not in result.stderr


def test_device_check_without_pytest_says_to_install_the_test_extra():
    hide_pytest = ("import importlib.util as u, runpy, sys; real = u.find_spec; "
                   "u.find_spec = lambda n, *a: None if n in ('pytest', 'xdist') else real(n, *a); "
                   "sys.argv = ['device_check']; "
                   "runpy.run_module('transformer.tools.device_check', run_name='__main__')")
    result = run_cli("-c", hide_pytest, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and '.[test]' in line and "--notests" in line
