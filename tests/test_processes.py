"""The suite's own processes (tests/processes.py): a worker on a core of its own with jemalloc
where the machine has it, and the checks of a process's page faults and memory on glibc, as
users' processes run."""

import os

import pytest

import processes
from conftest import run_cli


def test_glibc_env_drops_the_preloaded_jemalloc_and_keeps_a_users_preload():
    path = processes.jemalloc()
    if path is None:
        pytest.skip("no libjemalloc.so.2 on this machine")
    env = {"A": "1", "LD_PRELOAD": f"/opt/mine.so:{path}"}
    assert processes.glibc_env(env) == {"A": "1", "LD_PRELOAD": "/opt/mine.so"}
    assert processes.glibc_env({"LD_PRELOAD": path, "B": "2"}) == {"B": "2"}
    assert processes.glibc_env({"B": "2"}) == {"B": "2"}


def test_a_process_check_runs_on_glibc():
    """run_cli(fork=False), where the page-fault and peak-memory checks run: no jemalloc."""
    result = run_cli("-c", "print('jemalloc' in open('/proc/self/maps').read())", fork=False)
    assert result.returncode == 0 and result.stdout.split() == ["False"], result


@pytest.mark.skipif(not os.environ.get("PYTEST_XDIST_WORKER") or processes.as_is(),
                    reason="set up in xdist workers only")
def test_a_worker_keeps_its_core_and_runs_on_jemalloc_where_the_machine_has_it():
    if processes.PINNED is not None:
        assert os.sched_getaffinity(0) == {processes.PINNED}
    mapped = "jemalloc" in open("/proc/self/maps").read()
    assert mapped == (processes.jemalloc() is not None)
