"""The scaling room: sweeps over sizes and budgets, and what their results say.

    sweep.py       ladders and grids of runs: one member per size × budget, trained by train/
    rules.py       a member's batch, rates, weight decay and warm-up from its width and tokens
    report.py      what finished members say: tables, fits, plots, the compute-optimal prediction
    __main__.py    the command: python -m transformer scaling
    fit.py         scaling-law fits (power laws, L(N, D)) with bootstrap intervals
    chinchilla.py  Chinchilla's approaches 2 and 3; predict, holdout
    gate.py        whether Approach 3 fits well enough to predict from (else Approach 2 does)
    isoflop.py     the IsoFLOP report of a sweep; the ladder's real FLOPs per token
    verify.py      --verify: train the predicted compute-optimal run, measured vs predicted
    plot.py        loss curves, scaling and IsoFLOP plots (`python -m transformer plot`)

May import: config/, model/, data/, train/, parallel/. Never: tools/ or the command lines.
"""
