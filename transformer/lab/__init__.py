"""The lab: the project's own measuring instruments, not commands a user needs to train,
sample or plan. They produce the figures in docs/ and the dated rows in docs/records/.

    records.py                   docs/records/*.jsonl rendered as docs/records.md; appending a row
    accelerators_table.py        docs/accelerators.md's table, from compile records
    isoflop_refit.py             a published IsoFLOP sweep refitted from its records alone
    sweep_records.py             a sweep workdir's finished members appended as records
    nanogpt_side_by_side.py      the quick start and nanoGPT's CPU recipe on the same bytes
    nanochat_side_by_side.py     the quick start and nanochat's model and optimizer, same clock
    speedrun_rows.py             the speedrun's rows over seeds: mean, spread, p-value
    speedrun_steptime.py         step time of speedrun candidates, side by side in one process
    lr_transfer.py               the lr-transfer figures of docs/scaling.md: widths, depths
    zh_ru_corpus.py              the Chinese/Russian toy corpus of docs/inside.md

Run as `python -m transformer.lab.NAME`. May import any room of the library, not the tools;
nothing imports it but `tools/bench.py`'s `--record`, which appends through records.py.
"""
