"""The collectives of a compiled program, each counted once per time it runs, read from the
optimised HLO text (`compiled.as_text()`).

    ops, loops = collectives.read(hlo, mesh_shape=(1, 4, 1), axis_names=("data", "fsdp", "tensor"))
    totals = collectives.totals(ops)          # {kind: {"count", "bytes"}} per chip per call
    collectives.top(ops, 5)                   # the five largest, bytes x runs

What counts as one operation: libtpu splits one collective over several async collective
fusions (a start, updates, a done) that each print the same instruction with the same
`channel_id`; XLA's own async forms print `all-gather-start` / `-done` or an `async-start`
whose `calls=` is a computation wrapping the collective. An operation is keyed by its
channel_id (or, without one, by the instruction itself) and counted once per run of the
computation it sits in. Every edge to another computation is followed (`calls=`, `body=`,
`condition=`, `to_apply=`, `branch_computations=`, `true_computation=`, `false_computation=`,
...): a collective in a `conditional`'s branch is counted (marked `in_branch`: only one branch
runs). A while loop runs its body XLA's `known_trip_count` times, else the count worked out
from its counter (start, step, and the compare LT/LE/GT/GE/NE against a constant); where that
cannot be read the loop is listed in `loops` as unknown and its body counted once, never
silently.

Bytes per chip per run: an all-gather's and all-reduce's result, a reduce-scatter's operand
(the bytes it reduces), an all-to-all's and collective-permute's result.
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
               "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
               "f8e4m3fn": 1, "f8e5m2": 1, "s4": 1, "u4": 1}
_ARRAY = re.compile(r"\b([a-z]+\d*[a-z0-9]*)\[([\d,]*)\]")
_EDGE = re.compile(r"\b([a-z_]+)=(\{%[^}]*\}|%[\w.\-]+)")
_KIND = re.compile(r"^(" + "|".join(KINDS) + r")(-start)?$")


@dataclasses.dataclass
class Op:
    """One collective operation: what it moves each time, and how often it runs per call."""
    kind: str
    name: str          # the instruction (the first piece seen)
    op_name: str       # the JAX source op it came from (metadata op_name)
    shape: str         # its result, e.g. bf16[4096,1024]
    bytes: int         # per chip per run
    runs: int          # per call of the program (loops' trips multiplied in)
    group: int | None  # devices per replica group (None: not readable)
    axes: tuple = ()   # mesh axes the group spans (() when the groups were not readable)
    groups: object = None  # the replica groups, [G, S] device ids (None: not readable)
    in_branch: bool = False
    network: str = ""  # "dcn": a multi-slice transfer between slices (megascale send)

    def row(self) -> dict:
        return {"kind": self.kind, "op_name": self.op_name, "shape": self.shape,
                "bytes": self.bytes, "runs": self.runs, "total_bytes": self.bytes * self.runs,
                "group": self.group, "axes": list(self.axes), "in_branch": self.in_branch,
                "network": self.network}


@dataclasses.dataclass
class _Inst:
    name: str
    shape: str
    opcode: str
    operands: list
    args: str          # the text between the opcode's parentheses (a constant's value)
    attrs: str
    root: bool


def parse(hlo: str) -> tuple[dict, str | None, dict]:
    """({computation: [instructions]}, the entry's name, {computation: {param: shape}})."""
    comps, params, entry, name = {}, {}, None, None
    for line in hlo.splitlines():
        if not line.startswith(" ") and line.rstrip().endswith("{"):
            head = re.match(r"^(ENTRY )?%?([\w.\-]+)\s*\((.*)\)\s*->", line)
            if head:
                name = head.group(2)
                entry = name if head.group(1) else entry
                comps[name] = []
                params[name] = dict(re.findall(r"([\w.\-]+): ([a-z0-9]+\[[\d,]*\])", head.group(3)))
            continue
        if name is not None and line.startswith(" "):
            inst = _instruction(line)
            if inst:
                comps[name].append(inst)
    return comps, entry, params


def _instruction(line: str) -> _Inst | None:
    m = re.match(r"\s*(ROOT )?%?([\w.\-]+) = ", line)
    if not m:
        return None
    rest = line[m.end():]
    if rest.startswith("("):
        end = _closing(rest, 0)
        shape, rest = rest[:end + 1], rest[end + 1:].lstrip()
    else:
        shape, _, rest = rest.partition(" ")
    op = re.match(r"([\w\-]+)\(", rest)
    if not op:
        return None
    close = _closing(rest, op.end() - 1)
    operands = re.findall(r"%([\w.\-]+)", rest[op.end():close])
    return _Inst(m.group(2), shape, op.group(1), operands, rest[op.end():close],
                 rest[close + 1:], bool(m.group(1)))


def _closing(text: str, start: int) -> int:
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
    return len(text) - 1


def array_bytes(shape: str) -> list[int]:
    return [DTYPE_BYTES[d] * math.prod(int(x) for x in dims.split(",") if x)
            for d, dims in _ARRAY.findall(shape) if d in DTYPE_BYTES]


def edges(inst: _Inst, known) -> list[tuple[str, str]]:
    """(role, computation) for every computation the instruction calls."""
    out = []
    for role, value in _EDGE.findall(inst.attrs):
        for callee in re.findall(r"%([\w.\-]+)", value):
            if callee in known:
                out.append((role, callee))
    return out


# ---------------------------------------------------------------- walking the call graph

def read(hlo: str, mesh_shape: tuple = (), axis_names: tuple = ()) -> tuple[list, list]:
    """(every collective operation as an Op, the while loops whose trip count is unknown).
    `mesh_shape`/`axis_names`: the mesh the program was built over (its devices in order are
    the program's device ids), to name the axes each replica group spans."""
    comps, entry, params = parse(hlo)
    named = {c: {i.name: i for i in insts} for c, insts in comps.items()}
    found, unknown = {}, []

    def walk(comp, runs, in_branch, depth):
        if depth > 64:
            return
        for inst in comps[comp]:
            if inst.opcode == "send" and "_xla_megascale_transfer_type" in inst.attrs:
                _record_dcn(found, inst, runs, in_branch)
            kind = _kind(comp, inst)
            if kind:
                _record(found, comp, inst, kind, runs, in_branch, named, params, mesh_shape,
                        axis_names)
            trips = 1
            if inst.opcode == "while":
                trips = trip_count(inst, comp, comps, named)
                if trips is None:
                    unknown.append({"loop": inst.name, "in": comp, "runs": runs})
                    trips = 1
            branch = in_branch or inst.opcode == "conditional"
            for role, callee in edges(inst, comps):
                walk(callee, runs * (trips if role == "body" else 1), branch, depth + 1)

    if entry is not None:
        walk(entry, 1, False, 0)
    return list(found.values()), unknown


def _kind(comp: str, inst: _Inst) -> str | None:
    match = _KIND.match(inst.opcode)
    if not match:
        return None  # -done and -update pieces belong to their start
    if match.group(1) == "all-reduce" and comp.startswith("all-reduce-scatter"):
        return "reduce-scatter"  # TPU's fused form: an all-reduce whose result is cut
    return match.group(1)


def _record(found, comp, inst, kind, runs, in_branch, named, params, mesh_shape, axis_names):
    channel = re.search(r"\bchannel_id=(\d+)", inst.attrs)
    key = ("channel", kind, channel.group(1)) if channel else ("instruction", comp, inst.name)
    shape = _result_shape(inst)
    size = sum(array_bytes(shape))
    groups = replica_groups(inst.attrs, math.prod(mesh_shape) if mesh_shape else None)
    group = int(groups.shape[1]) if groups is not None else None
    if inst.opcode == "reduce-scatter-start" and inst.shape.startswith("("):
        size = sum(array_bytes(_top_level(inst.shape[1:-1])[0]))  # (operands, results): reduced
    elif kind == "reduce-scatter" and inst.opcode == "reduce-scatter":
        operands = [named[comp].get(o).shape if o in named[comp] else params[comp].get(o)
                    for o in inst.operands]
        if all(operands) and operands:
            size = sum(sum(array_bytes(s)) for s in operands)
        elif group:
            size *= group
    axes = spanned(groups, mesh_shape, axis_names) if groups is not None and mesh_shape else ()
    op_name = re.search(r'op_name="([^"]*)"', inst.attrs)
    op = found.get(key)
    if op is None:
        found[key] = Op(kind, inst.name, op_name.group(1) if op_name else "", shape, size, runs,
                        group, axes, groups, in_branch)
    else:  # another piece of the same operation (an async update, a split fusion)
        op.runs, op.bytes = max(op.runs, runs), max(op.bytes, size)


_MEGASCALE = {"ALL_REDUCE": "all-reduce", "ALL_GATHER": "all-gather",
              "REDUCE_SCATTER": "reduce-scatter", "ALL_TO_ALL": "all-to-all"}


def _record_dcn(found, inst, runs, in_branch):
    """A multi-slice program's collective between slices: libtpu compiles one slice's program,
    and what crosses the data-center network is a host-transfer `send` to the megascale
    runtime (with its `recv`), keyed by its rendezvous; its first operand is what each chip
    contributes (the in-slice part ran before it, over ICI)."""
    kind = re.search(r'_xla_megascale_transfer_type="(\w+)"', inst.attrs).group(1)
    key = re.search(r'_xla_host_transfer_rendezvous="([^"]*)"', inst.attrs)
    key = ("dcn", key.group(1) if key else inst.name)
    shape = _top_level(inst.shape[1:-1])[0] if inst.shape.startswith("(") else inst.shape
    op_name = re.search(r'op_name="([^"]*)"', inst.attrs)
    if key in found:
        found[key].runs = max(found[key].runs, runs)
        return
    found[key] = Op(_MEGASCALE.get(kind, kind.lower()), inst.name,
                    op_name.group(1) if op_name else "", shape, sum(array_bytes(shape)), runs,
                    None, ("slices",), None, in_branch, network="dcn")


def _result_shape(inst: _Inst) -> str:
    """The result of an async start's tuple (operand, result, contexts...), else the shape."""
    if not inst.opcode.endswith("-start") or not inst.shape.startswith("("):
        return inst.shape
    parts = _top_level(inst.shape[1:-1])
    if inst.opcode.startswith("all-reduce"):
        return inst.shape
    return parts[1] if len(parts) >= 2 else inst.shape


def _top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1, "{": 1, "}": -1, "[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return [re.sub(r"/\*.*?\*/", "", p).strip() for p in parts if p]


# ---------------------------------------------------------------- replica groups

def replica_groups(attrs: str, devices: int | None = None):
    """The replica groups as a [G, S] array of device ids, or None when not readable. Forms:
    mesh['axis_0'=4,'axis_1'=2] {'axis_0'}; [G,S]<=[dims]T(perm); {{0,1},{2,3}}; {} (all);
    a collective-permute's source_target_pairs."""
    named = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*(?:,\s*device_ids=(\S+)\s*)?"
                      r"\{([^}]*)\}", attrs)
    if named:
        sizes = [(a, int(n)) for a, n in re.findall(r"'(\w+)'=(\d+)", named.group(1))]
        grouped = re.findall(r"'(\w+)'", named.group(3))
        names = [a for a, _ in sizes]
        ids = _device_ids(named.group(2), math.prod(n for _, n in sizes))
        if not sizes or ids is None or any(a not in names for a in grouped):
            return None
        ids = ids.reshape([n for _, n in sizes])
        order = [i for i, a in enumerate(names) if a not in grouped] + \
                [names.index(a) for a in grouped]
        size = math.prod(dict(sizes)[a] for a in grouped)
        return ids.transpose(order).reshape(-1, size)
    iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", attrs)
    if iota:
        dims = [int(d) for d in iota.group(3).split(",")]
        ids = np.arange(math.prod(dims)).reshape(dims)
        if iota.group(4):
            ids = ids.transpose([int(p) for p in iota.group(4).split(",")])
        return ids.reshape(int(iota.group(1)), int(iota.group(2)))
    listed = re.search(r"(?:replica_groups|source_target_pairs)=\{(\{[\d,]+\}(?:,\{[\d,]+\})*)\}",
                       attrs)
    if listed:
        rows = [[int(x) for x in g.split(",")] for g in re.findall(r"\{([\d,]+)\}", listed.group(1))]
        if len({len(r) for r in rows}) == 1:
            return np.array(rows)
        return None
    if re.search(r"replica_groups=\{\}", attrs) and devices:
        return np.arange(devices).reshape(1, devices)
    return None


def _device_ids(text: str | None, n: int):
    """The device of each mesh position: `([2,8]T(1,0))` (an iota reshaped and transposed),
    `[3,1,0,2]` (listed), or none given (in order); None if not readable."""
    if not text:
        return np.arange(n)
    iota = re.fullmatch(r"\(?\[([\d,]+)\](?:T\(([\d,]+)\))?\)?", text)
    if iota:
        dims = [int(d) for d in iota.group(1).split(",")]
        ids = np.arange(math.prod(dims)).reshape(dims)
        if iota.group(2):
            ids = ids.transpose([int(p) for p in iota.group(2).split(",")])
        return ids.reshape(-1) if ids.size == n else None
    listed = re.fullmatch(r"[\[{(]?([\d,]+)[\]})]?", text)
    if listed and len(listed.group(1).split(",")) == n:
        return np.array([int(x) for x in listed.group(1).split(",")])
    return None


def spanned(groups, mesh_shape: tuple, axis_names: tuple) -> tuple:
    """The mesh axes along which the devices of a replica group differ."""
    if groups.max() >= math.prod(mesh_shape):
        return ()
    coords = np.stack(np.unravel_index(groups, mesh_shape), axis=-1)  # [G, S, axes]
    varies = (coords != coords[:, :1]).any(axis=(0, 1))
    return tuple(name for name, v in zip(axis_names, varies) if v)


# ---------------------------------------------------------------- while loops' trip counts

_FLIP = {"LT": "GT", "GT": "LT", "LE": "GE", "GE": "LE", "NE": "NE", "EQ": "EQ"}


def trip_count(loop: _Inst, caller: str, comps: dict, named: dict) -> int | None:
    """How many times a while loop runs its body: XLA's known_trip_count, else worked out
    from the counter its condition compares with a constant (its start in the loop's initial
    tuple, its step in the body's), else None (unknown)."""
    known = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', loop.attrs)
    if known:
        return int(known.group(1))
    roles = dict(edges(loop, comps))
    cond, body = roles.get("condition"), roles.get("body")
    if cond is None or body is None or not loop.operands:
        return None
    compare = _compare(cond, comps, named)
    if compare is None:
        return None
    index, limit, direction = compare
    start = _value(named[caller], _element(named[caller], loop.operands[0], index), None)
    step = _step(body, index, comps, named)
    if not start or start[0] != "const" or step is None:
        return None
    return _trips(start[1], step, limit, direction)


def _value(insts: dict, name, outer):
    """What an s32 scalar is: ("const", v), ("counter", i) (element i of the loop's state),
    ("state",), or None. `outer(k)`: a fused computation's parameter k, from its caller."""
    inst = insts.get(name) if name else None
    if inst is None:
        return None
    if inst.opcode == "constant":
        m = re.fullmatch(r"\s*(-?\d+)\s*", inst.args)
        return ("const", int(m.group(1))) if m else None
    if inst.opcode == "parameter":
        k = int(inst.args.strip() or 0)
        return outer(k) if outer else ("state",)
    if inst.opcode in ("convert", "copy", "bitcast") and inst.operands:
        return _value(insts, inst.operands[0], outer)
    if inst.opcode == "get-tuple-element":
        index = re.search(r"index=(\d+)", inst.attrs)
        if index and _value(insts, inst.operands[0], outer) == ("state",):
            return ("counter", int(index.group(1)))
    return None


def _compare(cond: str, comps: dict, named: dict):
    """(counter index, constant, direction with the counter on the left) of the condition's
    root compare, looking through one fusion."""
    root = next((i for i in comps[cond] if i.root), None)
    insts, outer = named[cond], None
    if root is not None and root.opcode == "fusion":
        fused = dict(edges(root, comps)).get("calls")
        if fused is None:
            return None
        operands = root.operands
        outer = lambda k: _value(named[cond], operands[k], None) if k < len(operands) else None  # noqa: E731
        insts, root = named[fused], next((i for i in comps[fused] if i.root), None)
    if root is None or root.opcode != "compare" or len(root.operands) != 2:
        return None
    direction = re.search(r"direction=(\w+)", root.attrs)
    left, right = (_value(insts, o, outer) for o in root.operands)
    if not direction or not left or not right:
        return None
    if left[0] == "counter" and right[0] == "const":
        return left[1], right[1], direction.group(1)
    if right[0] == "counter" and left[0] == "const":
        return right[1], left[1], _FLIP[direction.group(1)]
    return None


def _element(insts: dict, name: str, index: int):
    inst = insts.get(name)
    while inst is not None and inst.opcode in ("copy", "bitcast"):
        inst = insts.get(inst.operands[0])
    if inst is None or inst.opcode != "tuple" or index >= len(inst.operands):
        return None
    return inst.operands[index]


def _step(body: str, index: int, comps: dict, named: dict) -> int | None:
    root = next((i for i in comps[body] if i.root), None)
    if root is None:
        return None
    update = named[body].get(_element(named[body], root.name, index))
    if update is None or update.opcode not in ("add", "subtract") or len(update.operands) != 2:
        return None
    a, b = (_value(named[body], o, None) for o in update.operands)
    sign = 1 if update.opcode == "add" else -1
    if a == ("counter", index) and b and b[0] == "const":
        return sign * b[1]
    if update.opcode == "add" and b == ("counter", index) and a and a[0] == "const":
        return a[1]
    return None


def _trips(start: int, step: int, limit: int, direction: str) -> int | None:
    if step == 0:
        return None
    if direction in ("LT", "LE") and step > 0:
        end = limit + (1 if direction == "LE" else 0)
        return max(0, -(-(end - start) // step))
    if direction in ("GT", "GE") and step < 0:
        end = limit - (1 if direction == "GE" else 0)
        return max(0, -(-(start - end) // -step))
    if direction == "NE" and (limit - start) % step == 0 and (limit - start) // step >= 0:
        return (limit - start) // step
    return None


# ---------------------------------------------------------------- summaries

def totals(ops: list) -> dict:
    """{kind: {"count", "bytes"}}: operations run per call, and their bytes per chip."""
    out = {kind: {"count": 0, "bytes": 0} for kind in KINDS}
    for op in ops:
        out[op.kind]["count"] += op.runs
        out[op.kind]["bytes"] += op.runs * op.bytes
    return out


def top(ops: list, n: int) -> list[dict]:
    """The n operations that move the most bytes per call (bytes x runs), largest first."""
    return [op.row() for op in sorted(ops, key=lambda o: -o.bytes * o.runs)[:n]]


def by_axes(ops: list) -> dict:
    """{(kind, "fsdp+tensor"): bytes per chip per call}: where the traffic goes."""
    out = {}
    for op in ops:
        key = (op.kind, "+".join(op.axes) if op.group is not None else "unknown groups")
        out[key] = out.get(key, 0) + op.bytes * op.runs
    return out
