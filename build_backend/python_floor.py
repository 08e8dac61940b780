"""The project's build backend: setuptools', after refusing a Python the dependencies do not
support. pip checks `requires-python` only once it has resolved the dependencies (2 minutes
of downloads on a fresh 3.10 machine before its one line, or minutes of backtracking), while
the backend is imported at once, in the interpreter pip installs for.
"""

import sys

from setuptools.build_meta import *  # noqa: F403 -- setuptools' hooks, as they are

OLDEST = (3, 11)  # jax 0.10 and flax 0.12 need it; pyproject.toml's requires-python says so

if sys.version_info[:2] < OLDEST:
    raise SystemExit(f"error: transformer needs Python {'.'.join(map(str, OLDEST))} or newer "
                     f"(jax 0.10 and flax 0.12 do); this is Python {sys.version.split()[0]}")
