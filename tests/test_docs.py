"""The README and docs/ are the user's manual: their commands must work as written.

Every `python ...` command in README.md, docs/*.md and the configs' docstrings is extracted.
For each: the script or module exists, every `--flag` is a flag that program defines, every
`--config.a.b` names a declared config field, and every file under configs/ it names
exists. The cheap commands (those that read no run and train nothing) are run for real and
must exit 0. Paths to the project's own files mentioned anywhere in the docs must exist.
A field set in prose
(`model.norm=rmsnorm`, in the docs or a config's docstring) exists and takes that value.
"""

import re
import shlex
from functools import lru_cache

import pytest

from tests.conftest import ROOT, run_cli
from transformer.config import fields

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CONFIG_FILES = sorted((ROOT / "configs").rglob("*.py"))  # their docstrings show commands too


def cheap(cmd: str) -> bool:
    """Run for real: they build nothing big and read no workdir."""
    return cmd.startswith(("-m transformer sizes", "-m transformer explain")) and \
        "--workdir" not in cmd


def commands() -> list[tuple[str, str]]:
    """(page name, command line) for every python command in the docs."""
    out = []
    for page in [*PAGES, *CONFIG_FILES]:
        text = re.sub(r"\\\n\s*", " ", page.read_text())  # join continuation lines
        for line in text.splitlines():
            line = line.strip().lstrip("$").strip()
            line = re.sub(r"^(\S+=\S+\s+)+", "", line)  # leading VAR=value assignments
            match = re.match(r"(?:\.venv/bin/)?python3? (.*)", line)
            if match and not match.group(1).startswith(("-m venv", "-c ", "-m pip")):
                cmd = match.group(1).split(" #")[0].split("`")[0].split(" &")[0].strip()
                out.append((page.name, cmd))
    return out


def _program(args: list[str]) -> list[str]:
    if args[:2] == ["-m", "transformer"]:  # python -m transformer COMMAND
        return args[:3]
    return args[:2] if args[0] == "-m" else args[:1]


def _source(program: list[str]):
    if program[:2] == ["-m", "transformer"]:
        from transformer.__main__ import COMMANDS
        if len(program) < 3 or program[2] not in COMMANDS:
            return ROOT / "transformer" / "no-such-command"
        return _module_file(COMMANDS[program[2]][0])
    if program[0] == "-m":
        return _module_file(program[1])
    return ROOT / program[0]


def _module_file(module: str):
    """A module's file: name.py, or a package's name/__main__.py (python -m runs that)."""
    path = ROOT / module.replace(".", "/")
    package = path / "__main__.py"
    return package if package.exists() else path.with_suffix(".py")


@lru_cache(maxsize=None)
def _flags(program: tuple) -> frozenset:
    """The flags the program's own file defines (absl DEFINE_* or argparse add_argument)."""
    text = _source(list(program)).read_text()
    return frozenset(re.findall(r'DEFINE_\w+\(\s*"(\w+)"', text) +
                     re.findall(r'add_argument\(\s*"--(\w+)"', text))


FIELDS = {f.name for f in fields.FIELDS}
ALL = commands()


def test_the_docs_have_commands_to_check():
    assert len(ALL) >= 30, ALL  # the extraction itself works


@pytest.mark.parametrize("page,cmd", ALL, ids=[f"{p}:{c[:50]}" for p, c in ALL])
def test_documented_command_names_real_programs_flags_fields_and_files(page, cmd):
    args = shlex.split(cmd)
    program = _program(args)
    assert _source(program).exists(), f"{page}: {cmd}: no such program"
    known = _flags(tuple(program))
    for arg in args[len(program):]:
        if not arg.startswith("--"):
            continue
        name = arg[2:].split("=")[0]
        if name.startswith("config."):
            assert name[len("config."):] in FIELDS, f"{page}: {cmd}: no config field {name}"
        elif name.startswith("sweep."):
            continue  # overrides inside a sweep file, checked when the sweep loads
        else:
            assert name in known or name.removeprefix("no") in known, \
                f"{page}: {cmd}: {program} has no flag --{name}"
        value = arg.split("=", 1)[1] if "=" in arg else ""
        if value.startswith("configs/"):  # FILE.py:ARG passes ARG to get_config (ml_collections)
            value = value.split(":", 1)[0]
            assert (ROOT / value).exists(), f"{page}: {cmd}: {value} does not exist"


@pytest.mark.parametrize("cmd", sorted({c for _, c in ALL if cheap(c)}))
def test_cheap_documented_commands_run(cmd):
    result = run_cli(*shlex.split(cmd), timeout=300)
    assert result.returncode == 0, f"{cmd}: {result.stderr[-1000:]}"


def test_paths_the_docs_mention_exist():
    missing = []
    for page in PAGES:
        for path in re.findall(r"(?<![\w/.])((?:docs|transformer|configs|tests)/[\w./-]+\.(?:md|py|png))",
                               page.read_text()):
            if not (ROOT / path).exists():
                missing.append(f"{page.name}: {path}")
    assert not missing, missing


def _count(overrides: dict, base: str = "configs/default.py") -> int:
    """Total parameters of a config file plus --config overrides, by the code that
    `python -m transformer sizes` prints them with."""
    import importlib.util

    from transformer import config as config_lib
    from transformer.model import flops
    from transformer.model.sizes import model_config_of
    spec = importlib.util.spec_from_file_location("_docs_config", ROOT / base)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    config.update_from_flattened_dict({k: _parse(v) for k, v in overrides.items()})
    return flops.param_counts(model_config_of(config_lib.validate(config)))["total"]


def _parse(value: str):
    if value in ("True", "False"):  # as absl parses a bool field's flag
        return value == "True"
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def test_the_variant_table_counts_the_parameters_the_code_counts():
    """docs/inside.md: every row's Params equals the config its command names."""
    text = (ROOT / "docs" / "inside.md").read_text()
    table = text.split("## What the variants do on the default run")[1]
    base = dict(re.findall(r"--config\.([\w.]+)=(\S+)", table.split("```")[1]))  # the command
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    checked = 0
    for row in rows[1:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        flags = dict(re.findall(r"--config\.([\w.]+)=([^\s`]+)", cells[1]))
        want = int(cells[2].replace(",", ""))
        assert _count({**base, **flags}) == want, row
        checked += 1
    assert checked >= 10


def test_quick_start_and_sizes_pages_state_the_counts_of_todays_code():
    quick = (ROOT / "docs" / "quickstart.md").read_text()
    [stated] = re.findall(r"([\d,]{7,}) parameters", quick)
    assert int(stated.replace(",", "")) == _count({})
    # docs/scaling.md shows `sizes` output: its params line is what the command prints today.
    block = (ROOT / "docs" / "scaling.md").read_text().split("$ python -m transformer sizes ")[1]
    cmd, printed = block.split("\n", 1)
    result = run_cli("-m", "transformer", "sizes", *shlex.split(cmd), timeout=120)
    assert result.returncode == 0, result.stderr
    params = next(line for line in result.stdout.splitlines() if line.startswith("params:"))
    assert params in printed, (params, printed[:300])


def test_fields_set_in_prose_exist_and_take_the_value_written():
    """`model.norm=rmsnorm`, `train.lr_base_width=96`, `--config.model.matmul=fast_bf16` ...
    written anywhere in the docs or in a config file's docstring (commands are checked above,
    names only): the field exists and, where it has a fixed set of values, the value is one."""
    problems, checked = [], 0
    for page in [*PAGES, *CONFIG_FILES]:
        for name, value in re.findall(
                r"(?<![\w/-])(?:--config\.)?((?:model|data|train|mesh|sample)\.[a-z_]+"
                r"(?:\.[a-z_]+)?)=([\w.+-]*)", page.read_text()):
            checked += 1
            field = fields.BY_NAME.get(name)
            if field is None:
                problems.append(f"{page.name}: {name}: no such config field")
            elif field.choices and value and value not in field.choices:
                problems.append(f"{page.name}: {name}={value}: not one of {field.choices}")
    assert checked >= 100 and not problems, problems


def test_the_quick_start_pages_state_the_default_configs_optimizer():
    """README.md and docs/quickstart.md spell out configs/default.py's Adam betas and Muon
    settings; quickstart.md still said beta1 0.9 after the config moved to 0.8 (row 19)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("_default", ROOT / "configs" / "default.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    t = module.get_config().train
    quick = (ROOT / "docs" / "quickstart.md").read_text().split("## The goal")[0]
    readme = (ROOT / "README.md").read_text().split("## Using it")[0]
    assert f"betas ({t.b1:g}, {t.b2:g})" in " ".join(quick.split())
    assert f"betas {t.b1:g}/{t.b2:g}" in readme
    assert f"Muon at lr {t.muon_lr:g} with momentum {t.muon_momentum:g}" in " ".join(quick.split())
    assert f"{t.steps} steps" in quick and f"{t.steps}" in readme


# The README is a user's manual (issue 48): short, narrow, and free of lab-notebook history.
# Dated figures, machines and commits live in docs/records/ (docs/records.md).
MONTHS = ("January|February|March|April|May|June|July|August|September|October|November|"
          "December|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec")
README_RULES = {
    "a date": re.compile(rf"\b(?:19|20)\d\d-\d\d-\d\d\b|\b(?:{MONTHS})\.? (?:\d{{1,2}},? )?"
                         r"(?:19|20)\d\d\b"),
    "a CPU family or model": re.compile(
        r"\bfamily \d+|\bmodel \d+\b|\bZen ?\d\b|\bEPYC\b|\bXeon\b|\b\w+ Rapids\b|"
        r"\b(?:Ice|Cascade|Coffee|Alder|Raptor) Lake\b|\bi[3579]-\d{4,5}|\bRyzen\b", re.I),
    "a commit hash": re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b"),
    "internal history": re.compile(r"\bround \d+|\brows? \d+|\bsince that day\b",
                                   re.I),
}
README_MAX_LINES, README_MAX_WIDTH = 250, 100


def readme_problems(text: str) -> list[str]:
    lines = text.splitlines()
    problems = [f"{len(lines)} lines (at most {README_MAX_LINES})"] \
        if len(lines) > README_MAX_LINES else []
    for n, line in enumerate(lines, 1):
        if len(line) > README_MAX_WIDTH:
            problems.append(f"line {n}: {len(line)} characters (at most {README_MAX_WIDTH})")
        for rule, pattern in README_RULES.items():
            found = pattern.search(line)
            if found:
                problems.append(f"line {n}: {rule}: {found.group(0)!r}")
    for link in re.findall(r"\]\((docs/[^)#\s]+\.md)", text):
        if not (ROOT / link).exists():
            problems.append(f"a link to {link}, which does not exist")
    return problems


def test_the_readme_is_a_manual():
    """At most 250 lines of at most 100 characters; no dates, CPU models, commit hashes or
    internal history; every docs/*.md it links exists (its commands: the tests above)."""
    text = (ROOT / "README.md").read_text()
    assert not readme_problems(text), readme_problems(text)


@pytest.mark.parametrize("planted,rule", [
    ("\n".join(["x"] * 251), "lines"),
    ("x" * 101, "characters"),
    ("The suite took 4 min on 2026-12-05.", "a date"),
    ("measured in December 2026", "a date"),
    ("on Dec 5, 2026", "a date"),
    ("a 2-vCPU AMD EPYC (family 26 model 2)", "a CPU family or model"),
    ("on a Zen 4", "a CPU family or model"),
    ("on a Sapphire Rapids Xeon", "a CPU family or model"),
    ("fixed in bd86eb0", "a commit hash"),
    ("at " + "3edd05f1" * 5, "a commit hash"),
    ("earlier in round 4", "internal history"),
    ("row 18: 0.646 in 0.875x", "internal history"),
    ("the noise is threefry's since that day", "internal history"),
    ("see [the page](docs/no-such-page.md)", "does not exist"),
])
def test_each_readme_rule_fails_on_a_planted_violation(planted, rule):
    text = (ROOT / "README.md").read_text()
    if planted.count("\n") > 200:
        text = planted
    else:
        text = text.replace("## Using it", f"{planted}\n\n## Using it", 1)
    assert any(rule in p for p in readme_problems(text)), (planted, readme_problems(text))


@pytest.mark.parametrize("innocent", ["1,049,536 parameters", "a decade of tokens",
                                      "the first 100 rows", "bucketed prompts, rounded up",
                                      "model.dtype=bfloat16", "deadbeef"])
def test_the_readme_rules_pass_ordinary_prose(innocent):
    assert not [p for p in readme_problems(innocent)], innocent


@pytest.mark.parametrize("path", CONFIG_FILES, ids=[str(p.relative_to(ROOT)) for p in CONFIG_FILES])
def test_each_config_says_what_it_is_in_ten_lines(path):
    """A config's docstring: what it is and when to use it, ten lines or fewer (history lives
    in docs/speedrun.md, docs/records/ and git)."""
    import ast
    doc = ast.get_docstring(ast.parse(path.read_text()))
    assert doc and len(doc.splitlines()) <= 10, f"{path.name}: {len((doc or '').splitlines())}"


# Every docs page is a manual too (issue 48): no commit hashes, no internal history, no prose
# line a reader must scroll sideways, and no relative link to a file that is not there.
# docs/records.md is generated from the records (its cells are the data); accelerators.md is
# being rewritten elsewhere and joins when that lands.
DOC_PAGES = [p for p in sorted((ROOT / "docs").glob("*.md"))
             if p.name not in ("records.md", "accelerators.md")]
DOCS_MAX_WIDTH = 120
# "row N" is history in any page but the speedrun's: there the rows are the page's own table,
# numbered for good (a row keeps its number as rows are added, records say "speedrun row 17"),
# and its prose points at them ("Rows before 12 ran with ...") as a table's notes do. "round N"
# is session history everywhere.
ROW_RULE_EXEMPT = {"speedrun.md"}


def _prose_lines(text: str):
    """(line number, line) of the prose: not fenced or indented code, not a table row, not a
    line that is only an image."""
    fence = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if fence or line.startswith(("    ", "\t", "|")) or re.fullmatch(r"!\[.*\]\(.*\)", line):
            continue
        yield n, line


def docs_page_problems(name: str, text: str) -> list[str]:
    problems = []
    for n, line in _prose_lines(text):
        if len(line) > DOCS_MAX_WIDTH:
            problems.append(f"{name}:{n}: {len(line)} characters (at most {DOCS_MAX_WIDTH})")
        found = README_RULES["a commit hash"].search(line)
        if found:
            problems.append(f"{name}:{n}: a commit hash: {found.group(0)!r}")
        history = re.search(r"\bround \d+|\bsince that day\b", line, re.I) or \
            (name not in ROW_RULE_EXEMPT and re.search(r"\brows? \d+", line, re.I))
        if history:
            problems.append(f"{name}:{n}: internal history: {history.group(0)!r}")
    for link in re.findall(r"\]\(([^)\s]+)\)", text):
        path = link.split("#")[0]
        if not path or re.match(r"[a-z]+:", path):  # an anchor on the page, or a URL
            continue
        if not (ROOT / "docs" / path).exists():
            problems.append(f"{name}: a link to {link}, which does not exist")
    return problems


@pytest.mark.parametrize("page", DOC_PAGES, ids=[p.name for p in DOC_PAGES])
def test_each_docs_page_is_a_manual(page):
    """No commit hashes, no "round N" (nor "row N" outside the speedrun's table), no prose
    line over 120 characters, and every relative link names a file that exists."""
    problems = docs_page_problems(page.name, page.read_text())
    assert not problems, problems


@pytest.mark.parametrize("page,planted,rule", [
    ("performance.md", "x" * 121, "characters"),
    ("performance.md", "measured at 3adf61e", "a commit hash"),
    ("speedrun.md", "fixed by " + "bd86eb0c" * 5, "a commit hash"),
    ("scaling.md", "as in round 4 of the session", "internal history"),
    ("speedrun.md", "as in round 4 of the session", "internal history"),
    ("data.md", "see row 18 for the figures", "internal history"),
    ("sampling.md", "see [the page](no-such-page.md)", "does not exist"),
    ("sampling.md", "see [the figure](missing.png#top)", "does not exist"),
])
def test_each_docs_rule_fails_on_a_planted_violation(page, planted, rule):
    text = (ROOT / "docs" / page).read_text()
    text = text.replace("\n## ", f"\n{planted}\n\n## ", 1)
    assert any(rule in p for p in docs_page_problems(page, text)), (planted, page)


@pytest.mark.parametrize("innocent", [
    "| 17 | 880 steps, as row 17 of the table | `python train.py` |",  # a table row
    "```\nx = '" + "y" * 130 + "'\n```",  # code
    "    python train.py " + "--config.train.steps=880 " * 6,  # an indented command
    "see [the speedrun](speedrun.md#the-rows) and [jax](https://jax.readthedocs.io/x)",
    "rows before 12 ran with the float32 head",  # the speedrun's own rows
])
def test_the_docs_rules_pass_what_is_not_prose_history(innocent):
    assert not docs_page_problems("speedrun.md", innocent), innocent


def test_the_speedrun_table_matches_its_records_and_its_commands_are_real():
    """Each row of docs/speedrun.md's table: its command names real flags and fields (as the
    commands above), and its seeds, mean, spread and p against its `vs` row are those of the
    rows' records in docs/records/speedrun.jsonl (the figures are data, the table quotes them;
    speedrun_rows.cells computes them, Welch's p included). Every row has three seeds."""
    from transformer.lab import records, speedrun_rows
    recs = speedrun_rows.row_records(records.FOLDER / "speedrun.jsonl")
    rows = speedrun_rows.table()
    assert len(rows) >= 20
    for row in rows:
        rec = recs[row["#"]]
        assert row["command"] == rec["command"], (row["#"], row["command"], rec["command"])
        test_documented_command_names_real_programs_flags_fields_and_files(
            "speedrun.md", row["command"].removeprefix("python "))
        got = speedrun_rows.cells(row, recs)
        assert {k: row[k] for k in got} == got, row["#"]
        assert len(rec["seeds"]) >= 3, row["#"]
