"""The folder layout is the architecture: which room may import which, and no cycles.

Each room of `transformer/` (a subpackage) may import only the rooms below it; the root
modules (`cli`, `checkpoint`, `host`) are shared by several rooms and import only what is
below them; `host` (the machine's facts) imports no room and every room may import it.
Nothing imports `transformer/tools/` (the one tools folder: no root `tools/`, no scripts in
docs/) or the package's `__main__`, and nothing in the package imports the command lines
(train.py, sample.py). Imports inside functions count too: a lazy
import is still a dependence. The checker reads source text only (AST), so a planted wrong
import is caught without running anything (test below).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "transformer"

# room -> the rooms it may import (itself always). A DAG: the order below is bottom-up.
ALLOWED = {
    "host": set(),  # the machine's facts (host.py): below every room, BELOW_ALL
    "config": set(),
    "model": {"config"},
    "data": {"config"},
    "parallel": {"config", "model"},
    "generate": {"config", "model", "parallel", "data"},
    "checkpoint": {"config", "model", "parallel", "data"},
    "cli": set(),
    "hf": {"config", "model", "data", "checkpoint", "cli"},
    "train": {"config", "model", "data", "parallel", "generate", "checkpoint", "hf"},
    "scaling": {"config", "model", "data", "parallel", "checkpoint", "train", "cli"},
    "serve": {"config", "generate", "data", "checkpoint", "hf", "cli"},
    "lab": {"config", "model", "data", "parallel", "generate", "checkpoint", "hf", "train",
            "scaling", "serve", "cli"},
    "tools": {"config", "model", "data", "parallel", "generate", "checkpoint", "hf", "train",
              "scaling", "serve", "cli", "lab"},
    "__main__": set(),  # runs commands by module name (runpy), imports none
}
BELOW_ALL = {"host"}  # root modules every room may import
ROOT_MODULES_AT_MOST = 6


def room_of(module: str) -> str:
    """'transformer.model.kernels.dense' -> 'model'; 'transformer.cli' -> 'cli'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(module: str, source: str) -> list[tuple[str, int]]:
    """(imported transformer module, line) for every import in `source`, top level or not."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.startswith("transformer")]
        elif isinstance(node, ast.ImportFrom):
            assert not node.level, f"{module}:{node.lineno}: the package uses absolute imports"
            name = node.module or ""
            if not name.startswith("transformer"):
                continue
            for a in node.names:  # a name or a submodule: callers try both
                out.append((f"{name}.{a.name}", node.lineno))
    return out


def violations(sources: dict[str, str]) -> list[str]:
    """Every import that crosses a room boundary the wrong way, as 'module:line -> target'."""
    bad = []
    for module, source in sources.items():
        here = room_of(module)
        for target, line in imports_of(module, source):
            there = room_of(target)
            if not there or there == here:
                continue
            if here not in ALLOWED:
                bad.append(f"{module}: not in a known room (add it to ALLOWED)")
            elif there not in ALLOWED[here] | BELOW_ALL:
                bad.append(f"{module}:{line} imports {target} ({here} may not import {there})")
    return bad


def cycles(sources: dict[str, str], top_level_only: bool) -> list[list[str]]:
    """Import cycles between modules (top-level imports: what runs at import time)."""
    graph = {}
    for module, source in sources.items():
        tree = ast.parse(source)
        nodes = tree.body if top_level_only else list(ast.walk(tree))
        targets = set()
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target, _ in imports_of(module, ast.unparse(node)):
                    for candidate in (target, target.rsplit(".", 1)[0]):
                        # A package's own __init__ is loaded before its submodules anyway.
                        if module.startswith(candidate + "."):
                            break
                        if candidate in sources and candidate != module:
                            targets.add(candidate)
                            break
        graph[module] = targets
    found, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def package_sources() -> dict[str, str]:
    return {module_name(p): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}


SOURCES = package_sources()


def test_every_module_sits_in_a_room_and_the_root_is_small():
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= ROOT_MODULES_AT_MOST, root
    rooms = {room_of(m) for m in SOURCES} - {""}
    assert rooms <= set(ALLOWED), rooms - set(ALLOWED)
    for room in rooms - {"cli", "checkpoint", "host", "__main__"}:
        doc = ast.get_docstring(ast.parse((PACKAGE / room / "__init__.py").read_text()))
        assert doc and "import" in doc, f"{room}/__init__.py: say what it holds and may import"


def test_rooms_import_only_the_rooms_below_them():
    assert not violations(SOURCES), "\n".join(violations(SOURCES))


def test_nothing_imports_the_tools_the_lab_or_the_command_lines():
    """The tools (user commands) and the lab (the project's instruments) are leaves: nothing
    imports them, but bench's --record appending through lab/records.py."""
    for module, source in SOURCES.items():
        for target, line in imports_of(module, source):
            if room_of(module) not in ("tools", "lab"):
                assert room_of(target) not in ("tools", "lab", "__main__"), \
                    f"{module}:{line} {target}"
            if room_of(module) == "tools" and room_of(target) == "lab":
                assert target.startswith("transformer.lab.records"), f"{module}:{line} {target}"
        tree = ast.parse(source)
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not names & {"train", "sample"}, f"{module} imports a command line"


def stray_scripts(root: Path) -> list[str]:
    """Programs outside the one tools folder: a root tools/ folder, Python files in docs/."""
    return sorted([str(p.relative_to(root)) for p in (root / "tools").rglob("*")] +
                  [str(p.relative_to(root)) for p in (root / "docs").rglob("*.py")])


def test_one_tools_folder(tmp_path):
    """Programs live in transformer/tools/ and transformer/lab/ (python -m transformer.X.NAME); the checker
    catches a planted root tools/ script and a script in docs/."""
    assert not stray_scripts(PACKAGE.parent), stray_scripts(PACKAGE.parent)
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "x.py").write_text("")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "figure.py").write_text("")
    assert stray_scripts(tmp_path) == ["docs/figure.py", "tools/x.py"]


@pytest.mark.parametrize("top_level_only", [True, False], ids=["import-time", "any"])
def test_no_import_cycles(top_level_only):
    assert not cycles(SOURCES, top_level_only)


@pytest.mark.parametrize("module,planted", [
    ("transformer.model.gpt", "from transformer.train import loop"),
    ("transformer.model.attention", "from transformer.data import corpus"),
    ("transformer.data.batches", "from transformer.model.gpt import GPT"),
    ("transformer.config.schema", "from transformer.model.kernels import auto"),
    ("transformer.train.run", "from transformer.tools import bench"),
    ("transformer.generate.decode", "import transformer.scaling.fit"),
])
def test_a_planted_wrong_import_is_caught(module, planted):
    """The checker works: the same sources with one wrong import (inside a function, where a
    lazy import would hide) fail it."""
    assert not violations(SOURCES)
    planted_sources = dict(SOURCES)
    planted_sources[module] += f"\n\ndef _planted():\n    {planted}\n"
    assert any(v.startswith(module) for v in violations(planted_sources))


def test_a_planted_cycle_is_caught():
    planted = dict(SOURCES)
    planted["transformer.model.flops"] = "from transformer.model import sizes\n" + \
        planted["transformer.model.flops"]
    assert cycles(planted, top_level_only=True)


# ---------------------------------------------------------------- each room's index

_INDEX_ENTRY = re.compile(r"^[A-Za-z_]\w*(\.py|/)$")


def index_of(doc: str) -> set[str]:
    """The modules and folders a room's docstring lists: the first column of its indented
    index lines (`    name.py[, other.py]   what it holds`); lines whose first column is not
    such names (usage examples) are not index lines."""
    names = set()
    for line in doc.splitlines():
        if not line.startswith("    ") or line.startswith("     "):
            continue
        column = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        entries = [e.strip() for e in column.split(",")]
        if all(_INDEX_ENTRY.match(e) for e in entries):
            names.update(entries)
    return names


def room_contents(folder: Path) -> set[str]:
    """What a room holds: its modules (not __init__.py) and its folders (subpackages, data)."""
    return ({p.name for p in folder.glob("*.py") if p.name != "__init__.py"} |
            {f"{p.name}/" for p in folder.iterdir() if p.is_dir() and p.name != "__pycache__"})


def index_errors(doc: str, folder: Path) -> list[str]:
    listed, there = index_of(doc), room_contents(folder)
    return ([f"{folder.name}: {n} is not listed" for n in sorted(there - listed)] +
            [f"{folder.name}: {n} is listed but not there" for n in sorted(listed - there)])


ROOMS = sorted(p.parent for p in PACKAGE.rglob("__init__.py")
               if p.parent != PACKAGE and "__pycache__" not in p.parts)


@pytest.mark.parametrize("folder", ROOMS, ids=[str(p.relative_to(PACKAGE)) for p in ROOMS])
def test_each_room_index_names_exactly_its_modules(folder):
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
    assert not index_errors(doc, folder), "\n".join(index_errors(doc, folder))


def test_a_planted_index_error_is_caught(tmp_path):
    """The checker works: a module the index misses and a listed module that is gone."""
    (tmp_path / "a.py").write_text("")
    (tmp_path / "b.py").write_text("")
    (tmp_path / "sub").mkdir()
    doc = ("The room.\n\n    a.py, b.py    two modules\n    sub/    a folder\n\n"
           "    python -m x  usage\n")
    assert index_errors(doc, tmp_path) == []
    (tmp_path / "c.py").write_text("")
    assert index_errors(doc, tmp_path) == [f"{tmp_path.name}: c.py is not listed"]
    (tmp_path / "b.py").unlink()
    assert index_errors(doc, tmp_path) == [f"{tmp_path.name}: c.py is not listed",
                                           f"{tmp_path.name}: b.py is listed but not there"]


# ---------------------------------------------------------------- functions short enough to read

MAX_FUNCTION_LINES = 100


def long_functions(sources: dict[str, str]) -> list[str]:
    """'module:line name (N lines)' for every function (methods and nested ones too) longer
    than MAX_FUNCTION_LINES, its docstring and decorators aside from the count's start."""
    out = []
    for module, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    out.append(f"{module}:{node.lineno} {node.name} ({lines} lines)")
    return out


def test_no_function_is_longer_than_a_screenful_or_two():
    assert not long_functions(SOURCES), "\n".join(long_functions(SOURCES))
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    planted = {"transformer.x": f"def f():\n{body}\n"}  # 101 lines
    assert long_functions(planted) == [f"transformer.x:1 f ({MAX_FUNCTION_LINES + 1} lines)"]
