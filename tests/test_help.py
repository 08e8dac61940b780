"""The conventions a user's scripts rely on, for every command: `--help` (and `-h`) exits 0
with the usage on stdout; a mistake exits non-zero with one `error:` line on stderr."""

import pytest

from tests.conftest import run_cli
from transformer.__main__ import COMMANDS

PROGRAMS = [["train.py"], ["sample.py"], *(["-m", "transformer", name] for name in COMMANDS)]
IDS = [" ".join(p) for p in PROGRAMS]


@pytest.mark.parametrize("program", PROGRAMS, ids=IDS)
def test_help_exits_0_with_the_usage_on_stdout(program):
    for flag in ("--help", "-h"):
        result = run_cli(*program, flag)
        assert result.returncode == 0, (flag, result.stderr)
        assert result.stdout.strip() and "Traceback" not in result.stderr, result.stderr


@pytest.mark.parametrize("program", PROGRAMS, ids=IDS)
def test_an_unknown_flag_is_one_error_line(program):
    result = run_cli(*program, "--no_such_flag=1")
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr


def test_the_package_lists_its_commands_on_help():
    result = run_cli("-m", "transformer", "--help")
    assert result.returncode == 0 and all(name in result.stdout for name in COMMANDS)
    result = run_cli("-m", "transformer", "no_such_command")
    assert result.returncode != 0 and len(result.stderr.strip().splitlines()) == 1
