"""docs/accelerators.md's table, made from docs/records/compile.jsonl by `python -m
transformer.lab.records`: one row per record of `compile --record=PATH` whose result says
`counter: operations` (each collective counted once and priced on its links); records of
the older line counter stay in docs/records.md only.
"""

from __future__ import annotations

import re

BEGIN, END = "<!-- compile records: begin -->", "<!-- compile records: end -->"


def table(records: list[dict]) -> str:
    """docs/accelerators.md's table: one row per record of the new counter."""
    rows = ["| model | target (chips) | fits | peak / usable per chip | mesh d x f x t, remat, "
            "accum | compute | collectives (slow network) | step (roofline) | MFU at most |",
            "|---|---|---|---|---|---|---|---|---|"]
    for rec in records:
        r = rec["result"]
        if r.get("counter") != "operations":
            continue
        slow = next((k[:-3] for k in ("dcn_ms", "network_ms") if k in r), None)
        fast = sum(r.get(f"{k}_ms", 0) for k in ("ici", "nvlink"))
        comm = (f"{fast:.4g} ms" if r["fits"] else "-") + (f" + {r[slow + '_ms']:.4g} ms on {slow} "
                                   f"({r[slow + '_gib']:.3g} GiB)" if slow and r["fits"] else "")
        model = re.sub(r"^configs/|\.py$", "", r["config"])
        rows.append(f"| {model} ({r['dtype']}) | `{r['target']}` ({r['chips']:,}) | "
                    f"{'yes' if r['fits'] else 'no'} | {r['peak_gib']:.1f} / {r['usable_gib']:.2f}"
                    f" GiB | {r['mesh_dxfxt']}, {r['remat']}, {r['grad_accum']} | "
                    f"{r['compute_ms']:.4g} ms at {r['peak_tflops']:g} TF/s | {comm} | "
                    + (f"{r['predicted_step_ms']:.4g} ms | {r['predicted_mfu_pct']}% |"
                       if r["fits"] else "- | - |"))
    return "\n".join(rows)


def rewrite(page_text: str, records: list[dict]) -> str:
    """The page with the text between its markers replaced by the table."""
    if BEGIN not in page_text or END not in page_text:
        return page_text
    head, rest = page_text.split(BEGIN, 1)
    return head + BEGIN + "\n" + table(records) + "\n" + END + rest.split(END, 1)[1]
