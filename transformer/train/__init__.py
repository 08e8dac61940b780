"""The train room: a run from start to end.

    resolve.py     a config file's config -> the concrete run's config: depth derived, `auto`
                   made concrete, vocab_size from the tokenizer (every tool calls it)
    start.py       prepare(config, workdir) -> Run: the config resolved, the mesh, the
                   checkpoint to continue from, the data, each worked out once
    run.py         train(run, Options): claim the workdir → state → loop
    trainer.py     the compiled step and evaluation of one run on one mesh
    scratch.py     on CPU, the step's scratch memory kept from one step to the next
    step.py        the train step over explicit state (loss, gradient accumulation)
    optimizer.py   AdamW (and Muon's pairing), decay by parameter role, learning-rate schedules
    muon.py        Muon's update, Newton-Schulz steps of same-shaped matrices batched together
    width_lr.py    learning rates that transfer across widths (muP's AdamW rule)
    loop.py        steps, evaluations, saves, an agreed stop
    workdir.py     one run per workdir (a lock)
    signals.py     a graceful stop on SIGINT/SIGTERM
    faults.py      the non-finite guard and the hooks tests use to provoke faults
    metrics.py     progress bar, metrics.jsonl, throughput, MFU
    profile.py     train.profile: a jax.profiler trace of a range of steps, in the workdir
    trackers.py    TensorBoard (always) and Weights & Biases (train.wandb): the same numbers

May import: config/, model/, data/, parallel/, hf/ (weights to start from), generate/,
checkpoint.py (what a checkpoint holds: save, find the newest good one, restore anywhere).
Never: scaling/, tools/ or the command lines.
"""
