"""`python -m transformer trace`: where the time of a `train.profile` trace went, per XLA op.

    python train.py --config.train.steps=40 --config.train.profile=20:25
    python -m transformer trace runs/default              # the newest trace of that run
    python -m transformer trace runs/default --top=25

Reads the `<host>.trace.json.gz` that jax.profiler wrote under <workdir>/plugins/profile/
(train/profile.py) and sums the duration of every XLA op of the most expensive compiled
program (the train step), per execution of it: the wall time of one execution, the op time
(summed over the threads that ran ops, so it can exceed the wall time), the op time by kind,
and the top ops by name. Control flow (the cond around the optimizer update, a while loop) is
no op of its own: its span is the ops it ran, each counted already. An op's name is its HLO instruction (e.g. `ynn_fusion.212`); what
it computes is in the compiled program's text (`jax.jit(f).lower(...).compile().as_text()`,
whose metadata op_name names the layer). Perfetto and TensorBoard show the same trace
interactively (docs/performance.md).
"""

from __future__ import annotations

import collections
import gzip
import json
from pathlib import Path

from absl import flags

from transformer import cli
from transformer.config import ConfigError

_TOP = flags.DEFINE_integer("top", 15, "How many ops to list.")

# Runtime bookkeeping events on the op threads, not ops.
_NOT_OPS = ("ThunkExecutor", "SlinkyThreadPool")


def kind(op: str) -> str:
    """The kind of an XLA CPU/GPU op, from its instruction name."""
    if op.startswith(("ynn_fusion", "dot", "onednn", "gemm", "cublas", "triton_gemm")):
        return "matmul"
    if "convert" in op:
        return "dtype casts (convert fusions)"
    if "copy" in op or "transpose" in op:
        return "copies and transposes"
    if "reduce" in op:
        return "reductions"
    return "other fusions (elementwise, norms, softmax, optimizer)"


def newest_trace(path) -> Path:
    """The newest *.trace.json.gz under `path` (a workdir, a profile folder or the file)."""
    path = Path(path)
    if path.is_file():
        return path
    found = sorted(path.rglob("*.trace.json.gz"), key=lambda p: p.parent.name)
    found = [p for p in found if p.name != "perfetto_trace.json.gz"] or found
    if not found:
        raise ConfigError(f"{path}: no *.trace.json.gz under it; train with "
                             "--config.train.profile=START:STOP first")
    return found[-1]


def containers(ops) -> set[int]:
    """The ids of op events that hold other op events on their own thread: control flow
    (a `lax.cond`'s conditional, a while loop), whose span is the time of the ops it ran,
    each of which the trace also records (on this thread or others). A kernel never holds
    another event, so counting a container too would count its body twice."""
    held, by_thread = set(), collections.defaultdict(list)
    for e in ops:
        by_thread[e.get("pid"), e.get("tid")].append(e)
    for events in by_thread.values():
        events.sort(key=lambda e: (e["ts"], -e["dur"]))
        open_ = []  # the enclosing events still running at the current one's start
        for e in events:
            while open_ and open_[-1]["ts"] + open_[-1]["dur"] <= e["ts"]:
                open_.pop()
            if open_ and e["ts"] + e["dur"] <= open_[-1]["ts"] + open_[-1]["dur"]:
                held.add(id(open_[-1]))
            open_.append(e)
    return held


def summarize(trace_file, top: int = 15) -> dict:
    """{"program", "executions", "wall_ms", "op_ms", "kinds": {kind: ms}, "ops": [(name, ms)]},
    every time per execution of the program that spent the most op time."""
    events = json.loads(gzip.decompress(Path(trace_file).read_bytes()))["traceEvents"]
    ops = [e for e in events if e.get("ph") == "X" and "hlo_op" in e.get("args", {})
           and not e["name"].startswith(_NOT_OPS)]
    by_program = collections.Counter()
    for e in ops:
        by_program[e["args"].get("hlo_module", "")] += e["dur"]
    if not by_program:
        raise ConfigError(f"{trace_file}: the trace holds no XLA op events")
    program = by_program.most_common(1)[0][0]
    ops = [e for e in ops if e["args"].get("hlo_module", "") == program]
    held = containers(ops)
    runs_of_program = ops  # a container still bounds its execution's wall time
    ops = [e for e in ops if id(e) not in held]
    runs = collections.defaultdict(list)
    for e in runs_of_program:
        runs[e["args"].get("run_id", "")].append(e)
    n = len(runs)
    wall = sum(max(e["ts"] + e["dur"] for e in r) - min(e["ts"] for e in r)
               for r in runs.values()) / n / 1000
    names, kinds = collections.Counter(), collections.Counter()
    for e in ops:
        names[e["name"]] += e["dur"] / n / 1000
        kinds[kind(e["name"])] += e["dur"] / n / 1000
    return dict(program=program, executions=n, wall_ms=wall, op_ms=sum(names.values()),
                kinds=dict(kinds.most_common()), ops=names.most_common(top))


def describe(s: dict) -> str:
    op = s["op_ms"]
    lines = [f"{s['program']}: {s['executions']} executions traced, {s['wall_ms']:.1f} ms wall "
             f"each (first op to last), {op:.1f} ms of op time each (summed over threads)", "",
             "| kind | ms per execution | share of op time |", "|---|---|---|"]
    lines += [f"| {k} | {ms:.1f} | {100 * ms / op:.1f}% |" for k, ms in s["kinds"].items()]
    lines += ["", "| op | ms per execution | share of op time |", "|---|---|---|"]
    lines += [f"| {name} | {ms:.2f} | {100 * ms / op:.1f}% |" for name, ms in s["ops"]]
    return "\n".join(lines)


def main(argv):
    if len(argv) != 2:
        cli.fail("give one workdir (or profile folder, or trace file): "
                 "python -m transformer trace runs/default")
    if _TOP.value < 1:
        cli.fail(f"--top={_TOP.value}: must be at least 1")
    trace_file = newest_trace(argv[1])
    print(f"trace: {trace_file}")
    print(describe(summarize(trace_file, _TOP.value)))


if __name__ == "__main__":
    cli.run(main)
