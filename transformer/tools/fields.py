"""Every config field from the command line: name, base value, allowed values, resume rule, meaning.

    python -m transformer fields                  all of them, section by section
    python -m transformer fields --section=train  one section (model, data, train, mesh, sample)

The table is `transformer/config/fields.py`, where each field is declared once. A base value
is base_config()'s (GPT-2's block with AdamW), not the default config's (configs/default.py,
the quick start: `python -m transformer sizes --config=configs/default.py` shows it). Set any of
them with --config.<section>.<field>=value (train.py, sizes, a sweep's --sweep.base...).
Resume rules: free (may change when a run resumes), fixed (never: the model's shape or its
tokens), change (only when named in train.py's --allow_change).
"""

from __future__ import annotations

from absl import flags

from transformer import cli
from transformer.config import fields


def rows(section: str | None = None) -> list[tuple[str, str, str, str, str]]:
    """(name, base value, allowed values, resume rule, meaning) of each field, in declared order."""
    out = []
    for f in fields.FIELDS:
        if section and f.name.split(".")[0] != section:
            continue
        allowed = " | ".join(map(str, f.choices)) if f.choices else type(f.default).__name__
        out.append((f.name, repr(f.default), allowed, f.resume, f.doc))
    return out


def table(section: str | None = None) -> str:
    found = rows(section)
    header = ("field", "base", "allowed", "resume", "meaning")
    widths = [max(len(r[i]) for r in [header, *found]) for i in range(4)]
    lines = []
    for r in [header, *found]:
        lines.append("  ".join(v.ljust(w) for v, w in zip(r[:4], widths)) + "  " + r[4])
    return "\n".join(lines)


def _main():
    section_flag = flags.DEFINE_string("section", None, "Only this section: "
                                       "model, data, train, mesh or sample.")

    def main(argv):
        if len(argv) > 1:
            cli.fail(f"unexpected arguments {argv[1:]}: flags look like --name=value")
        sections = list(dict.fromkeys(f.name.split(".")[0] for f in fields.FIELDS))
        if section_flag.value is not None and section_flag.value not in sections:
            cli.fail(f"--section={section_flag.value}: one of {', '.join(sections)}")
        print(table(section_flag.value))

    cli.run(main)


if __name__ == "__main__":
    _main()
