"""tests/fork_server.py, through which the suite runs most of its command lines (conftest's
fork_run), runs them as a new Python would: the same exit status, stdout and stderr as a real
subprocess for the same command line and environment."""

import os
import subprocess
import sys

import pytest
from conftest import ROOT, fork_run

ECHO = ("import os, sys; print(sys.argv, sys.path[0], os.getcwd(),"
        " os.environ.get('TRANSFORMER_FORK_X')); print('to stderr', file=sys.stderr); sys.exit(3)")


@pytest.mark.parametrize("argv", [
    ["-c", ECHO, "a", "b"],
    ["-c", "raise ValueError('boom')"],
    ["-c", "import jax; print(jax.device_count(), jax.devices()[0].platform)"],
    ["-m", "transformer", "sizes", "--config=configs/tiny.py"],
    ["-m", "transformer", "sizes"],
    ["train.py", "--config=configs/tiny.py", "--config.train.stepz=3"],
    ["sample.py"],
], ids=["argv-env-exit", "traceback", "xla-flags", "module", "module-error", "train-flag",
        "sample-no-workdir"])
def test_a_forked_command_gives_what_a_new_process_gives(argv, tmp_path):
    # TRANSFORMER_* and XLA_FLAGS go with the request (XLA reads its flags when the child
    # starts its backend): a device count set there is the child's.
    env = {**os.environ, "TRANSFORMER_FORK_X": "1", "XLA_FLAGS": " ".join(filter(None, [
        os.environ.get("XLA_FLAGS"), "--xla_force_host_platform_device_count=3"]))}
    cwd = tmp_path if argv[0] == "-c" else ROOT
    forked = fork_run(*argv, cwd=cwd, env=env, timeout=120)
    real = subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)
    assert (forked.returncode, forked.stdout, forked.stderr) == \
        (real.returncode, real.stdout, real.stderr)
    if argv[1:2] == ["import jax; print(jax.device_count(), jax.devices()[0].platform)"]:
        assert real.stdout.split()[0] == "3"


def test_a_command_past_its_timeout_is_killed():
    with pytest.raises(subprocess.TimeoutExpired):
        fork_run("-c", "import time; time.sleep(60)", timeout=1)
