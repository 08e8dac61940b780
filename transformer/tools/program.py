"""What a compiled program is, apart from the host that built it: its optimised HLO with the
metadata stripped, a fingerprint of that text, the versions and flags it was built under,
and the files `compile --hlo=PATH` / `--save=PATH` write.

    text = program.stripped(compiled.as_text())     # no op names, source lines, stack frames
    program.fingerprint(compiled.as_text())          # 16 hex digits of sha256(stripped text)
    program.built_under()                            # {"jax", "jaxlib", "libtpu", ..., "XLA_FLAGS"}

Two builds of one (config, target) must give the same fingerprint whatever the host's CPU,
its ISA cap, its simulated device count or JAX_PLATFORMS (tests/test_host_independence.py):
a program that changes with the host was built for the host, not the target.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re

_METADATA = re.compile(r",?\s*metadata=\{[^{}]*\}")
_FRAMES = re.compile(r",?\s*stack_frame_id=\d+")
_TABLES = {"FileNames", "FunctionNames", "FileLocations", "StackFrames"}
# Plugins whose version decides what a program becomes (the compiler comes with them).
PACKAGES = ("jax", "jaxlib", "libtpu", "jax-cuda12-plugin", "jax-cuda12-pjrt", "flax")


def stripped(hlo: str) -> str:
    """The optimised HLO without what only says where ops came from (op names, source files
    and lines, stack frames): two builds of one program give the same text."""
    lines, table = [], False
    for line in hlo.splitlines():
        if line.strip() in _TABLES:  # source-location tables (TPU: before the computations)
            table = True
        elif table and not line.strip():
            table = False
        elif not table:
            lines.append(_FRAMES.sub("", _METADATA.sub("", line)))
    return "\n".join(lines)


def fingerprint(hlo: str) -> str:
    return hashlib.sha256(stripped(hlo).encode()).hexdigest()[:16]


def built_under() -> dict:
    """The versions of the packages that built the program, and the XLA/libtpu flags set."""
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    for flag in ("XLA_FLAGS", "LIBTPU_INIT_ARGS"):
        out[flag] = os.environ.get(flag, "")
    return out


def write_hlo(compiled, path: str) -> None:
    """--hlo=PATH: the optimised HLO as the compiler left it (metadata kept)."""
    with open(path, "w") as f:
        f.write(compiled.as_text())


def save(compiled, path: str) -> None:
    """--save=PATH: the compiled executable, serialised (jax.experimental.serialize_executable)
    with its argument and result trees, to be loaded on the target's hosts with
    `serialize_executable.deserialize_and_load(*pickle.load(f))`."""
    import pickle

    from jax.experimental import serialize_executable
    payload, in_tree, out_tree = serialize_executable.serialize(compiled)
    with open(path, "wb") as f:
        pickle.dump((payload, in_tree, out_tree), f)
