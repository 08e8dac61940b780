"""The tools: programs that use the library and that nothing in it imports.

    bench.py, bench_figures.py   speed side by side with the PyTorch peer; its records
    device_check.py              a GPU/TPU end to end: device tests and the bench line
    fields.py                    every config field: default, allowed values, resume rule, meaning
    sizes.py                     parameters, FLOPs and memory of any config, without allocating
    visualize.py                 attention maps of a trained run
    explain.py                   one head's attention arithmetic, step by step, on real numbers
    prepare.py, cache.py         tokenize a corpus into shards; the data cache
    trace.py                     where a train.profile trace's step time went, per op
    records.py                   docs/records/*.jsonl rendered as docs/records.md
    nanogpt_side_by_side.py      the quick start and nanoGPT's CPU recipe on the same bytes
    nanochat_side_by_side.py     the quick start and nanochat's model and optimizer, same clock
    speedrun_steptime.py         step time of speedrun candidates, side by side in one process
    lr_transfer.py               the lr-transfer figures of docs/scaling.md: widths, depths
    zh_ru_corpus.py              the Chinese/Russian toy corpus of docs/inside.md

May import anything in the package; nothing imports them.
"""
