"""`python -m transformer compile`: the tiny config's train step built for a TPU topology
(v5e:2x2, four abstract chips from libtpu) on this CPU, in each mesh kind, and what the compiled
programs must show: it fits; XLA's peak per chip is near the project's own estimate; the
collectives are the ones the mesh means; no branch built for the host's CPU.
"""

import importlib.util
import re

import pytest
from conftest import run_cli

pytestmark = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                reason='libtpu is not installed: pip install -e ".[test]"')

MESHES = {"data": (4, 1, 1), "fsdp": (1, 4, 1), "tensor": (2, 1, 2)}
# XLA's peak over the project's estimate (state + gradient + flops.activation_bytes), measured
# 1.2-1.8x for these three: the estimate leaves out XLA's scratch (the gathered weights under
# fsdp, the f32 logits' fusions) and counts no padding to the TPU's (8, 128) tiles, which for
# a d_model of 64 doubles small arrays. A factor of 2.5 either way still catches a state that
# is not split (4x under fsdp) or activations kept whole.
BAND = (1 / 2.5, 2.5)


def tiny(shape):
    from configs.tiny import get_config
    config = get_config()
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = shape
    return config


@pytest.fixture(scope="module")
def compiled():
    from transformer.config import validate
    from transformer.parallel import target as target_lib
    from transformer.tools import compile as compile_tool
    target = target_lib.parse("v5e:2x2")
    out = {}
    for kind, shape in MESHES.items():
        config = compile_tool.resolved_config(validate(tiny(shape)), target)
        out[kind] = compile_tool.compile_train(config, target)[0]
    return out


def collective_ops(hlo: str) -> list[tuple[str, str]]:
    """(kind, op_name) of every collective instruction in a compiled program's text."""
    found = []
    for line in hlo.splitlines():
        match = re.search(r"\s(all-gather|all-reduce|reduce-scatter|all-to-all|"
                          r"collective-permute)(?:-start)?\(", line)
        if match:
            name = re.search(r'op_name="([^"]*)"', line)
            found.append((match.group(1), name.group(1) if name else ""))
    return found


def as_path(op_name: str) -> str:
    """An op_name naming a parameter as jax 0.12 does (state.params[\\'block_0\\'][\\'mlp\\']...)
    spelled as jax 0.10's path (.../block_0/mlp/...)."""
    return re.sub(r"/+", "/", re.sub(r"\[\\?'([^'\\]+)\\?'\]", r"/\1/", op_name))


@pytest.mark.parametrize("kind", MESHES)
def test_the_tiny_train_step_fits_and_xla_agrees_with_the_estimate(compiled, kind):
    r = compiled[kind]
    assert r.fits and r.peak_bytes_per_chip < r.hbm_bytes_per_chip
    assert r.chips == 4 and r.mesh == dict(zip(("data", "fsdp", "tensor"), MESHES[kind]))
    ratio = r.peak_bytes_per_chip / r.estimate_bytes_per_chip
    assert BAND[0] <= ratio <= BAND[1], (kind, r.peak_bytes_per_chip, r.estimate_bytes_per_chip)
    assert 0 < r.predicted_mfu <= 1 and r.predicted_step_s > 0


def test_data_parallel_reduces_gradients_and_gathers_no_weights(compiled):
    c = compiled["data"].collectives
    assert c["all-reduce"]["count"] > 0
    assert c["all-gather"]["count"] == c["reduce-scatter"]["count"] == 0
    forward = [op for op in collective_ops(compiled["data"].hlo) if "jvp(GPT)" in op[1]
               and "transpose" not in op[1]]
    assert forward == [], forward[:3]  # the forward pass of a data-parallel step is local


def test_fsdp_gathers_every_block_weight_and_scatters_the_gradients(compiled):
    """A rule that left the MLP kernel whole under fsdp (replicated, 4x its memory per chip)
    shows as no all-gather for it."""
    r = compiled["fsdp"]
    assert r.collectives["reduce-scatter"]["count"] > 0
    gathered = {as_path(name) for kind, name in collective_ops(r.hlo) if kind == "all-gather"}
    for weight in ("mlp/expand", "mlp/project", "attn/query", "attn/out"):
        assert any(f"/{weight}/" in name for name in gathered), (weight, sorted(gathered)[:8])


def test_tensor_parallel_moves_activations(compiled):
    """Megatron's row-parallel layers end in an all-reduce of their outputs in the forward."""
    ops = collective_ops(compiled["tensor"].hlo)
    forward = {name for kind, name in ops if kind == "all-reduce" and "jvp(GPT)" in name
               and "transpose" not in name}
    for layer in ("mlp/project", "attn/out"):
        assert any(f"/{layer}/" in name for name in forward), (layer, sorted(forward))


@pytest.mark.parametrize("kind", MESHES)
def test_the_tpu_program_has_no_cpu_branch(compiled, kind):
    """train/step.py skips a non-finite update with lax.cond only for a CPU mesh; a TPU
    program built on this CPU host must take the select (no `conditional`)."""
    from transformer.tools.compile import has_conditional
    assert not has_conditional(compiled[kind].hlo)


def test_save_writes_the_executable_with_its_trees(compiled, tmp_path):
    """--save=PATH (tools/program.py): the TPU executable built on this CPU, serialised with
    its argument and result trees for deserialize_and_load on the target's hosts. Loading
    needs the chips; here, that the payload is there and the trees are the step's: one leaf
    per state array and batch array in, the new state and the metrics out."""
    import pickle

    from transformer.tools import program
    path = tmp_path / "step.bin"
    program.save(compiled["data"].compiled, str(path))
    payload, in_tree, out_tree = pickle.loads(path.read_bytes())
    assert isinstance(payload, bytes) and len(payload) > 100_000
    assert in_tree.num_leaves > 10 and out_tree.num_leaves >= in_tree.num_leaves - 2


def test_refusals_are_one_line_with_their_exit_status(tmp_path):
    out = tmp_path / "r.json"
    bad = run_cli("-m", "transformer", "compile", "--config=configs/tiny.py", "--target=v5e:2y2")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr[-2000:]
    assert bad.stderr.startswith("error: --target=v5e:2y2: not a target name")
    uneven = run_cli("-m", "transformer", "compile", "--config=configs/tiny.py",
                     "--target=v5e:2x2", "--config.mesh.data=3")
    assert uneven.returncode == 2 and uneven.stderr.count("\n") == 1, uneven.stderr[-2000:]
    assert "mesh.data=3" in uneven.stderr and "there are 4" in uneven.stderr
    # A batch of 2^20 rows: its float32 logits alone are ~17 GiB per chip of 16.
    short = run_cli("-m", "transformer", "compile", "--config=configs/tiny.py",
                    "--target=v5e:2x2", "--config.train.batch_size=1048576", f"--json={out}")
    assert short.returncode == 1, short.stderr[-2000:]
    assert short.stderr.count("\n") == 1 and "short by" in short.stderr
    assert "mesh.fsdp" in short.stderr and "grad_accum" in short.stderr


def test_a_missing_plugin_names_the_install_line(monkeypatch):
    from transformer.parallel import target as target_lib
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(target_lib.TargetError, match=r'pip install -e "\.\[compile\]"'):
        target_lib.parse("v5p:2x2x1")
    with pytest.raises(target_lib.TargetError, match=r'pip install -e "\.\[cuda12\]".*JAX_PLATFORMS=cpu'):
        target_lib.parse("h100:1x1x8")


def test_search_says_none_fits_a_target_too_small_without_compiling():
    """GPT-3 175B on four v5e chips: the project's estimate rules out every mesh (the state
    alone is ~2.8 TB), so nothing is compiled and the answer is one line, exit 1."""
    r = run_cli("-m", "transformer", "compile", "--config=configs/gpt3_175b.py",
                "--target=v5e:2x2", "--search")
    assert r.returncode == 1, r.stderr[-2000:]
    assert "compiled 0 of" in r.stdout
    assert r.stderr.startswith("error: none of the") and r.stderr.count("\n") == 1


@pytest.mark.slow
def test_libtpu_reports_the_usable_hbm_the_targets_assume():
    """target.LIBTPU_HBM is what libtpu says a program may use ('exceeds available HBM
    (95.74G)'), below the datasheet: a 400 GiB program on one chip of each kind shows it."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    from transformer.parallel import target as target_lib
    for chip, usable in target_lib.LIBTPU_HBM.items():
        target = target_lib.parse(f"{chip}:2x2" if chip in ("v5e", "v6e") else f"{chip}:2x2x1")
        mesh = Mesh(np.array(target.devices[:1]), ("x",))
        big = jax.ShapeDtypeStruct((100 * 2**30,), jnp.float32,
                                   sharding=NamedSharding(mesh, PartitionSpec()))
        with pytest.raises(Exception, match="RESOURCE_EXHAUSTED") as refused:
            jax.jit(lambda a: a * 2 + 1).lower(big).compile()
        said = re.search(r"available HBM \(([\d.]+)G\)", str(refused.value))
        assert said and float(said.group(1)) * 2**30 == usable == target.memory_bytes, chip
