"""The tools: the commands a user runs beside training and sampling (`python -m transformer
COMMAND`), programs that use the library and that nothing in it imports.

    bench.py, bench_figures.py   speed side by side with the PyTorch peer; its figures
    cache.py                     the data cache of corpora named directly: list, clear
    compile.py                   a config's programs compiled for a TPU/GPU target on this machine
    compile_search.py            compile --search: the mesh, remat and accumulation that fit
    collectives.py               compile: each collective of the optimised HLO, counted once
    program.py                   compile: the program apart from its host (fingerprint, --hlo)
    compile_record.py            compile --record: one compiled program as a dated record
    device_check.py              a GPU/TPU end to end: device tests and the bench line
    explain.py                   one head's attention arithmetic, step by step, on real numbers
    fields.py                    every config field: base value, allowed values, meaning
    prepare.py                   tokenize a corpus into shards
    sizes.py                     parameters, FLOPs and memory of any config, without allocating
    trace.py                     where a train.profile trace's step time went, per op
    visualize.py                 attention maps of a trained run

May import any room of the library and `lab/records.py` (bench's --record); nothing imports
them. The project's own measuring instruments live in `transformer/lab/`.
"""
