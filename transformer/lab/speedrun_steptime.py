"""Step time of speedrun candidates, measured side by side in one process (docs/speedrun.md).

    python -m transformer.lab.speedrun_steptime --steps=30 --rounds=3 \
        --variant="default:" \
        --variant="modern:--config.model.position=rope --config.model.norm=rmsnorm --config.model.mlp=swiglu"

Each variant is `configs/default.py` (or --config) plus its `--config.a.b=value` overrides.
All are compiled first; then each round times `--steps` train steps of every variant in
turn (the same real batches a run would read, state donated as in training), so a machine
whose load drifts slows every variant alike within a round. Prints each variant's median
seconds per step over the rounds (wall clock, and the process's CPU time, which other
processes' load disturbs less) and its ratio to the first variant: a clock cost to carry
from a loaded machine to a quiet one, where absolute timings are not. `--steps=1` with many
rounds interleaves the variants step by step.
"""

import argparse
import statistics
import time
from pathlib import Path

import jax


def _value(text: str):
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def load_config(path: str, overrides: str):
    from transformer.config import files
    from transformer.train.resolve import resolve
    config = files.load(Path(path).resolve())
    for item in overrides.split():
        key, value = item.removeprefix("--config.").split("=", 1)
        config.update_from_flattened_dict({key: _value(value)})
    config, _ = resolve(config)
    return config


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/default.py")
    parser.add_argument("--variant", action="append", required=True,
                        help="NAME:OVERRIDES, e.g. 'muon:--config.train.optimizer=muon'")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from transformer import data
    from transformer.train.resolve import resolve
    from transformer.train.trainer import Trainer
    runs = []
    for spec in args.variant:
        name, overrides = spec.split(":", 1)
        config = load_config(args.config, overrides)
        tokenizer, source = data.load(config)
        config, _ = resolve(config, tokenizer=tokenizer, validated=True)
        trainer = Trainer.build(config)
        state = trainer.init(config.train.seed)
        batches = [trainer.batch(source, config.train.seed, "train", i)
                   for i in range(args.steps)]
        state, metrics = trainer.step_fn(state, batches[0])  # compile
        jax.block_until_ready(metrics)
        runs.append({"name": name, "trainer": trainer, "state": state, "batches": batches,
                     "times": [], "cpu": [], "tokens": config.train.batch_size * config.model.max_seq_len})
    for _ in range(args.rounds):
        for r in runs:
            begin, cpu = time.perf_counter(), time.process_time()
            for batch in r["batches"]:
                r["state"], metrics = r["trainer"].step_fn(r["state"], batch)
            jax.block_until_ready((r["state"], metrics))
            r["times"].append((time.perf_counter() - begin) / args.steps)
            r["cpu"].append((time.process_time() - cpu) / args.steps)
    base = statistics.median(runs[0]["times"])
    base_cpu = statistics.median(runs[0]["cpu"])
    for r in runs:
        s, c = statistics.median(r["times"]), statistics.median(r["cpu"])
        print(f"{r['name']:>20s}  {s * 1000:7.1f} ms/step  {r['tokens'] / s:8.0f} tokens/s  "
              f"x{s / base:.3f}  | CPU {c * 1000:7.1f} ms/step x{c / base_cpu:.3f}  (wall "
              f"rounds: {', '.join(f'{t * 1000:.0f}' for t in r['times'][:8])}"
              f"{' ...' if len(r['times']) > 8 else ''})")


if __name__ == "__main__":
    main()
