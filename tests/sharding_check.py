"""Sharded runs against a one-device run, in a process of its own with 8 simulated CPU devices.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/sharding_check.py OUT.json [MODERN.json]
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/sharding_check.py --one_mesh OUT.json

tests/test_sharding.py launches it as a child of the suite's fork server (the pytest process
keeps its own device count; one process pays the backend's 8 devices once, and none the
imports again) and asserts on the JSON files it writes. OUT.json: for each mesh shape the
largest loss and parameter differences from one device, whether every parameter is split as
the rules say, whether greedy decoding gives the same tokens, and whether a checkpoint written
on (2, 2, 2) restores exactly onto one device and onto (1, 2, 4). MODERN.json, when named: the
modern recipe's pieces on (2, 2, 2) against one device (`modern` below), checked after the
rest. --one_mesh: the same report for the (2, 2, 2) mesh alone (every axis split at once),
restored onto one device: the default run's check, ~1/3 of the whole one's CPU (the whole
one runs with `-m slow`).
"""

import json
import re
import sys
import tempfile
import time

import flax.linen as nn
import jax
import numpy as np

from transformer import checkpoint
from transformer.config import base_config, validate
from transformer.data import batches
from transformer.generate import decode
from transformer.parallel import sharding
from transformer.train.trainer import Trainer

SHAPES = [(8, 1, 1), (1, 8, 1), (2, 2, 2), (1, 2, 4)]
DECODE_SHAPES = [(2, 2, 2), (1, 2, 4)]
# Muon orthogonalises whole matrices whose rows or columns the mesh splits: fsdp splits the
# embed axis of every kernel, tensor the heads of q/k/v/out and the MLP width.
MUON_SHAPES = [(1, 8, 1), (1, 2, 4)]  # each decode compile costs seconds: two meshes suffice
STEPS = 3
PROMPTS = [[5, 6, 7], [9], [1, 2, 3, 4, 5], [8, 8]]


# The modern recipe's pieces (issue 29), checked sharded == single by `modern` below: ids
# 61 .. 63 are padding, so the copy task draws below 61. Not zero_init_out: the first
# gradient of W_Q, W_K, W_V is then exactly 0, and Adam divides its rounding noise (which
# differs with the summation order of each mesh) by its own size, into lr-sized updates.
MODERN = dict(position="rope", norm="rmsnorm", mlp="relu2", qk_norm=True, bias=False,
              logit_softcap=5.0, tie_embeddings=False, n_kv_heads=2, vocab_used=61)


def tiny_config(shape=(1, 1, 1), model=None, z_loss=0.0, optimizer="adamw", rules=None):
    c = base_config()
    c.mesh.rules.update(**(rules or {}))
    c.train.optimizer = optimizer
    c.model.update(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=32,
                   matmul="plain")  # float32 throughout: sharded must equal unsharded to 1e-5
    c.model.update(**(model or {}))
    c.train.update(steps=STEPS, batch_size=8, lr=3e-3, warmup_steps=1, z_loss=z_loss)
    c.data.corpus = "copy"
    c.sample.max_new_tokens = 8
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = shape
    return validate(c)


def run(shape, devices, **variant):
    config = tiny_config(shape, **variant)
    trainer = Trainer.build(config, sharding.make_mesh(config.mesh, devices))
    source = batches.CopyTask(config.model.vocab_used or config.model.vocab_size,
                              config.model.max_seq_len)
    state, losses, times = trainer.init(config.train.seed), [], []
    for step in range(STEPS):
        begin = time.perf_counter()
        state, metrics = trainer.step_fn(state, trainer.batch(source, 0, "train", step))
        losses.append(float(metrics["train_loss"]))
        times.append(time.perf_counter() - begin)
    return trainer, state, losses, times


def max_diff(a, b):
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def split_as_ruled(trainer, params):
    """Every parameter's sharding is the rules' spec, and each device holds a piece of the
    size that spec implies (so the array really is cut, not just labelled)."""
    from transformer.model.gpt import logical_axes
    names = logical_axes(trainer.model_config)
    flat_names = jax.tree.leaves(names, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    bad = []
    for (path, x), logical in zip(jax.tree_util.tree_flatten_with_path(params)[0], flat_names):
        spec = nn.logical_to_mesh_axes(logical, trainer.rules)
        piece = list(x.shape)
        for dim, axes in enumerate(spec):
            for axis in (axes,) if isinstance(axes, str) else (axes or ()):
                piece[dim] //= trainer.mesh.shape[axis]
        if tuple(x.sharding.spec) != tuple(spec) or \
                x.addressable_shards[0].data.shape != tuple(piece):
            bad.append(f"{jax.tree_util.keystr(path)}: {x.sharding.spec} vs {spec}")
    return bad


def greedy(trainer, params, prompts, mesh=None):
    return decode.generate(trainer.model_config, params, prompts, max_new_tokens=6,
                           temperature=0.0, mesh=mesh, rules=trainer.rules if mesh else None)


def cache_moves(trainer, params, batch):
    """Collectives that move attention's data (the KV cache and the K/V written into it)
    between devices in the compiled decode program for `batch` rows: none when the cache
    lives where each step reads and writes it. (All-gathers are left out: under fsdp the
    attention weights are gathered before use, as designed.) The program is the one
    `greedy` runs for `batch` prompts (PROMPTS' bucket of 16 slots, its token budget): where
    greedy already ran it (4 rows on both meshes, 1 row on (2, 2, 2)) it is not traced,
    lowered or compiled again (jit's own cache), and the program checked is the one whose
    tokens were compared."""
    config = trainer.model_config
    prompt_len = decode.prompt_bucket(max(map(len, PROMPTS)), config.max_seq_len)
    budget = decode.token_budget(6, config.max_seq_len - prompt_len)
    generate_fn, cache_fn, param_sh = decode.sharded_program(
        config, budget, trainer.mesh, tuple(trainer.rules), batch)
    put = lambda x: sharding.put_replicated(x, trainer.mesh)  # noqa: E731
    key = np.asarray(jax.random.key_data(jax.random.key(0)))
    args = (jax.device_put(params, param_sh), cache_fn(),
            put(np.zeros((batch, prompt_len), np.int32)), put(np.zeros(batch, np.int32)),
            put(key), put(np.float32(0)), put(np.int32(0)), put(np.float32(1)),
            put(np.int32(-1)), put(np.int32(6)))
    hlo = generate_fn.lower(*args).compile().as_text()
    return [line.strip()[:200] for line in hlo.splitlines()
            if re.search(r"(all-to-all|collective-permute)(-start)?\(", line)
            and re.search(r'op_name="[^"]*/attn/', line)]


def main(out_path, shapes=SHAPES):
    """The report for `shapes` (all four, or (2, 2, 2) alone: then no Muon, no sequence
    parallelism, and the checkpoint restored onto one device only)."""
    devices = jax.devices()
    assert len(devices) == 8, f"needs 8 devices, has {len(devices)}"
    ref_trainer, ref_state, ref_losses, ref_times = run((1, 1, 1), devices[:1])
    ref_tokens = greedy(ref_trainer, ref_state.params, PROMPTS)
    ref_one = greedy(ref_trainer, ref_state.params, PROMPTS[:1])
    report = {"reference": {"losses": ref_losses, "step_s": ref_times}, "meshes": {}}
    kept = {}
    for shape in shapes:
        trainer, state, losses, times = run(shape, devices)
        report["meshes"][str(shape)] = {
            "loss_diff": max(abs(a - b) for a, b in zip(losses, ref_losses)),
            "param_diff": max_diff(state.params, ref_state.params),
            "opt_diff": max_diff(state.opt_state, ref_state.opt_state),
            "misplaced": split_as_ruled(trainer, state.params),
            "step_s": times,
        }
        if shape in DECODE_SHAPES:
            report["meshes"][str(shape)]["decode_same"] = (
                greedy(trainer, state.params, PROMPTS, trainer.mesh) == ref_tokens)
        kept[shape] = (trainer, state)
    if shapes == SHAPES:
        muon_and_sequence(report, devices, ref_state, ref_losses)
    # One prompt cannot be split over 4 batch shards: decoded unsplit on batch, split on heads.
    trainer, state = kept[(2, 2, 2)]
    report["decode_one_same"] = greedy(trainer, state.params, PROMPTS[:1], trainer.mesh) == ref_one
    # Batches whose shards hold one row, several rows, or (batch 1) the whole batch.
    report["cache_moves"] = {
        f"{shape} batch {b}": cache_moves(kept[shape][0], kept[shape][1].params, b)
        for shape in DECODE_SHAPES if shape in shapes for b in (1, 4, 8)}

    # A checkpoint written on (2, 2, 2) restores onto one device and onto (1, 2, 4).
    writer, state = kept[(2, 2, 2)]
    with tempfile.TemporaryDirectory() as workdir:
        ckpts = checkpoint.Checkpoints(workdir)
        ckpts.save(STEPS, state.params, {"step": state.step, "opt_state": state.opt_state},
                   {"step": STEPS})
        ckpts.wait()
        restored = {}
        targets = [("one_device", ref_trainer)] + (
            [("(1, 2, 4)", kept[(1, 2, 4)][0])] if (1, 2, 4) in kept else [])
        for name, trainer in targets:
            target = trainer.abstract_state()
            params, rest = ckpts.restore(STEPS, target.params,
                                         {"step": target.step, "opt_state": target.opt_state})
            same = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(
                jax.tree.leaves((state.params, state.opt_state)),
                jax.tree.leaves((params, rest["opt_state"]))))
            placed = all(a.sharding == b.sharding for a, b in zip(
                jax.tree.leaves(params), jax.tree.leaves(target.params)))
            restored[name] = {"identical": same, "placed": placed,
                              "step": int(rest["step"])}
        ckpts.close()
    report["restore"] = restored
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1)


def muon_and_sequence(report, devices, ref_state, ref_losses):
    """Muon on one device and on the meshes that split its matrices; sequence parallelism."""
    # Muon (train.optimizer=muon) on one device and on meshes that split its matrices.
    _, muon_ref, muon_ref_losses, _ = run((1, 1, 1), devices[:1], optimizer="muon")
    report["muon"] = {"moved": max_diff(muon_ref.params, ref_state.params)}
    for shape in MUON_SHAPES:
        trainer, state, losses, _ = run(shape, devices, optimizer="muon")
        report["muon"][str(shape)] = {
            "loss_diff": max(abs(a - b) for a, b in zip(losses, muon_ref_losses)),
            "param_diff": max_diff(state.params, muon_ref.params),
            "opt_diff": max_diff(state.opt_state, muon_ref.opt_state),
            "misplaced": split_as_ruled(trainer, state.params)}
    # Sequence parallelism: activations' length axis split over tensor (mesh.rules.length),
    # with the heads and MLP width still split over it where length has not claimed it.
    _, state, losses, _ = run((1, 2, 4), devices, rules={"length": "tensor"})
    report["sequence"] = {"loss_diff": max(abs(a - b) for a, b in zip(losses, ref_losses)),
                          "param_diff": max_diff(state.params, ref_state.params),
                          "opt_diff": max_diff(state.opt_state, ref_state.opt_state)}


def modern(out_path):
    """QK-norm, ReLU², no biases, soft-cap, untied head, grouped K/V, padded ids and the z-loss
    on (2, 2, 2) against one device: losses, parameters and greedy
    tokens."""
    devices = jax.devices()
    variant = dict(model=MODERN, z_loss=1e-2)
    ref_trainer, ref_state, ref_losses, _ = run((1, 1, 1), devices[:1], **variant)
    trainer, state, losses, _ = run((2, 2, 2), devices, **variant)
    tokens = greedy(trainer, state.params, PROMPTS, trainer.mesh)
    report = {"loss_diff": max(abs(a - b) for a, b in zip(losses, ref_losses)),
              "param_diff": max_diff(state.params, ref_state.params),
              "misplaced": split_as_ruled(trainer, state.params),
              "decode_same": tokens == greedy(ref_trainer, ref_state.params, PROMPTS),
              "max_token": max(t for row in tokens for t in row)}
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    if sys.argv[1] == "--one_mesh":
        main(sys.argv[2], shapes=[(2, 2, 2)])
    else:
        main(sys.argv[1])
        if sys.argv[2:]:
            modern(sys.argv[2])
