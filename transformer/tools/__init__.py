"""The tools: programs that use the library and that nothing in it imports.

    bench.py, bench_figures.py   speed side by side with the PyTorch peer; its records
    device_check.py              a GPU/TPU end to end: device tests and the bench line
    fields.py                    every config field: default, allowed values, resume rule, meaning
    sizes.py                     parameters, FLOPs and memory of any config, without allocating
    visualize.py                 attention maps of a trained run
    explain.py                   one head's attention arithmetic, step by step, on real numbers

May import anything in the package; nothing imports them.
"""
