"""The package's commands: `python -m transformer COMMAND [--flags]`.

    python -m transformer fields                                  every config field
    python -m transformer prepare stdlib --out=data/stdlib       tokenize once into shards
    python -m transformer sizes --config=configs/gpt3_175b.py     parameters, FLOPs, memory
    python -m transformer compile --config=configs/tiny.py --target=v5e:2x2   for a TPU, here
    python -m transformer scaling --sweep=configs/scaling/cpu_ladder.py --workdir=runs/ladder
    python -m transformer plot runs/tiny runs/default             loss curves of runs
    python -m transformer export --workdir=runs/tiny --out=hf/tiny
    python -m transformer visualize --workdir=runs/default        attention maps
    python -m transformer explain                                 one head's arithmetic
    python -m transformer bench                                   speed against PyTorch
    python -m transformer trace runs/default                      a train.profile trace, per op
    python -m transformer device_check                            a GPU/TPU end to end
    python -m transformer serve --workdir=runs/tiny               HTTP API and page

Each command is a module in its room (`COMMANDS` below) and runs as that module would run as
a program; `python -m transformer COMMAND --help` shows its flags. Training and sampling
are the top-level `train.py` and `sample.py`.
"""

from __future__ import annotations

import runpy
import sys

# command -> (module, one line for the list)
COMMANDS = {
    "fields": ("transformer.tools.fields", "every config field: base value, allowed values, "
               "meaning"),
    "prepare": ("transformer.tools.prepare", "tokenize a corpus once into token shards"),
    "cache": ("transformer.tools.cache", "the data cache of corpora named directly: list, clear"),
    "sizes": ("transformer.tools.sizes", "parameters, FLOPs and memory of a config"),
    "compile": ("transformer.tools.compile", "a config's programs compiled for a TPU/GPU "
                "topology on this machine: fits, collectives, step time"),
    "scaling": ("transformer.scaling", "train a sweep, report and fit it"),
    "plot": ("transformer.scaling.plot", "loss curves of runs (PNG)"),
    "export": ("transformer.hf.export", "a run as a Hugging Face folder"),
    "visualize": ("transformer.tools.visualize", "attention maps of a trained run (PNG)"),
    "explain": ("transformer.tools.explain", "one head's attention arithmetic, step by step"),
    "bench": ("transformer.tools.bench", "training and decoding speed against PyTorch"),
    "trace": ("transformer.tools.trace", "where a train.profile trace's step time went, per op"),
    "device_check": ("transformer.tools.device_check", "a GPU/TPU end to end"),
    "serve": ("transformer.serve", "an OpenAI-compatible HTTP server and a page showing attention"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: python -m transformer COMMAND [--flags]   (COMMAND --help for its flags)",
             "", "commands:"]
    lines += [f"  {name:<{width}}  {doc}" for name, (_, doc) in COMMANDS.items()]
    lines += ["", "training and sampling: python train.py, python sample.py"]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
        print(usage())
        return 0 if len(argv) >= 2 else 2
    name = argv[1]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}; one of: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module, _ = COMMANDS[name]
    # The command sees itself as the program: its flags are argv[2:], its name in --help.
    sys.argv = [f"python -m transformer {name}", *argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
