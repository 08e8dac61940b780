"""Decoding under FSDP gathers each weight once per call, not once per token.

The decode program is compiled ahead of time for a real TPU topology (v5e:2x2, four chips,
libtpu's compiler; nothing runs, no TPU is needed) with every chip on the fsdp axis, and its
optimised HLO is read: no all-gather may sit inside a while loop (the per-token steps), and
the whole program may gather at most once per weight that training splits over fsdp.
Weights left split over fsdp are loop inputs, and XLA gathered every one of them inside the
loop, at every token (the tiny config's program below: 13 of its 29 all-gathers in the loop).

The loop check is strict (no all-gather of anything): on v5e the loop has none. XLA's GPU
compiler does gather each step's logits ([B, V] float32, an activation) inside the loop of
the same program built for 8 H100s; GPT-2 small there: 37 KB a token, where the weights were
~190 MB a token before this fix.

Reading the HLO: libtpu splits one collective across several fused computations ("async
collective fusions") that share its channel_id, so a collective is counted per channel_id,
not per line (the old program had 61 all-gather lines for its 29 all-gathers).
"""

from __future__ import annotations

import os
import re

import pytest

# Several processes may hold libtpu (xdist workers, another run): without this the second
# one to load it fails on libtpu's lockfile. Compiling needs no exclusive TPU.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
pytest.importorskip("libtpu", reason="libtpu is not installed: the TPU compile needs "
                                     "pip install 'jax[tpu]' (the test extra has it)")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from transformer.config import ModelConfig, base_config  # noqa: E402
from transformer.generate import decode  # noqa: E402
from transformer.model.gpt import init_params  # noqa: E402
from transformer.parallel import sharding  # noqa: E402

_HEADER = re.compile(r"^(?:ENTRY )?%(\S+) \(.*\{$")
_CALLEE = re.compile(
    r"\b(?:calls|to_apply|body|condition|true_computation|false_computation)=%([\w.\-]+)")
_CALLEES = re.compile(r"\b(?:branch_computations|called_computations)=\{([^}]*)\}")
_WHILE_BODY = re.compile(r" while\(.*?\bbody=%([\w.\-]+)")
_ALL_GATHER = re.compile(r"= (?:\(.*?\)|\S+) all-gather(?:-start)?\(.*?channel_id=(\d+)")


def computations(hlo: str) -> dict[str, list[str]]:
    """Each computation of an HLO module's text: name -> its instruction lines."""
    comps, name = {}, None
    for line in hlo.splitlines():
        if m := _HEADER.match(line):
            name = m.group(1)
            comps[name] = []
        elif name is not None and line.startswith("  "):
            comps[name].append(line)
    return comps


def loop_computations(comps: dict[str, list[str]]) -> set[str]:
    """Every while loop's body and whatever it calls (fusions, branches, nested loops)."""
    todo = [b for lines in comps.values() for line in lines for b in _WHILE_BODY.findall(line)]
    seen = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in comps:
            continue
        seen.add(name)
        for line in comps[name]:
            todo += _CALLEE.findall(line)
            for group in _CALLEES.findall(line):
                todo += [n.strip().lstrip("%") for n in group.split(",")]
    return seen


def all_gathers(hlo: str) -> tuple[set[int], set[int]]:
    """(the program's all-gathers, those inside a loop), as channel ids."""
    comps = computations(hlo)
    inside = loop_computations(comps)
    every, looped = set(), set()
    for name, lines in comps.items():
        for line in lines:
            if m := _ALL_GATHER.search(line):
                every.add(int(m.group(1)))
                if name in inside:
                    looped.add(int(m.group(1)))
    return every, looped


def test_fsdp_decode_gathers_each_weight_once_outside_the_loop():
    from jax.experimental import topologies
    devices = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2").devices
    c = base_config()
    c.model.update(vocab_size=256, d_model=64, n_layers=2, n_heads=4, d_ff=256, max_seq_len=64)
    c.mesh.update(data=1, fsdp=4, tensor=1)
    config = ModelConfig.from_config(c)
    mesh = sharding.make_mesh(c.mesh, devices=devices)
    rules = tuple(sharding.axis_rules(c))
    B, P, budget = 8, 16, 32  # 8 rows: the batch is split over fsdp too
    generate_fn, cache_fn, param_sh = decode.sharded_program(config, budget, mesh, rules, B)
    params = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
    params = jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
                          params, param_sh)
    rep = sharding.replicated(mesh)
    arg = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=rep)  # noqa: E731
    hlo = generate_fn.lower(
        params, cache_fn.eval_shape(), arg((B, P), jnp.int32), arg((B,), jnp.int32),
        arg((2,), jnp.uint32), arg((), jnp.float32), arg((), jnp.int32), arg((), jnp.float32),
        arg((), jnp.int32), arg((), jnp.int32)).compile().as_text()

    comps = computations(hlo)
    assert loop_computations(comps), "the program has no while loop: the parser lost it"
    every, looped = all_gathers(hlo)
    assert not looped, f"{len(looped)} all-gathers inside the decode loop (once per token)"
    split = sum("fsdp" in str(sh.spec) for sh in jax.tree.leaves(param_sh))
    assert split >= 10 and 0 < len(every) <= split, (
        f"{len(every)} all-gathers for {split} weights split over fsdp")
