"""The device mesh, the logical-axis rules, and the shardings of state, batch and KV cache.

Modules only name their axes (`embed`, `heads`, `mlp`, ...; see model/gpt.py and kvcache.py).
This file maps those names onto a mesh of devices with three axes:

    data    the batch is split across it; parameters are copied          (data parallel)
    fsdp    the batch is split too, and parameters and optimizer state are split along
            `embed`, each device gathering a layer's weights just before using it   (ZeRO-3)
    tensor  attention heads, the MLP width and the vocabulary are split  (Megatron-style)

    mesh  = make_mesh(config.mesh)                      sizes checked against the devices
    rules = axis_rules(config)                          (logical name, mesh axes) pairs
    check_fits(config, mesh)                            sizes that do not divide fail here
    param_sh = param_shardings(model_config, mesh, rules)
    fn = jax.jit(constrained(f, mesh, rules), in_shardings=..., out_shardings=...)

Everything a program needs is passed as explicit shardings; nothing depends on a global mesh,
so one process can hold two meshes (train on one, restore onto another).
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from transformer.config import MESH_AXES, ConfigError, ModelConfig
from transformer.model import kvcache

BATCH_AXES = ("batch", "length")

# A logical axis and the config field that sets its size: checked for divisibility at start-up.
_SIZED_AXES = (("batch", "train.batch_size"), ("heads", "model.n_heads"),
               ("kv_heads", "model.n_kv_heads"), ("cache_heads", "model.n_kv_heads"),
               ("embed", "model.d_model"), ("mlp", "model.d_ff"),
               ("vocab", "model.vocab_size"), ("length", "model.max_seq_len"))


def mesh_shape(mesh_config, n_devices: int) -> tuple[int, ...]:
    """The sizes of (data, fsdp, tensor), with one -1 resolved to 'all remaining devices'."""
    sizes = [mesh_config[a] for a in MESH_AXES]
    named = ", ".join(f"mesh.{a}={s}" for a, s in zip(MESH_AXES, sizes))
    if sizes.count(-1) > 1:
        raise ConfigError(f"{named}: at most one mesh axis may be -1 (all remaining devices)")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if n_devices % known:
            raise ConfigError(f"{named}: the fixed axes take {known} devices, which does not "
                              f"divide the {n_devices} devices here; "
                              f"{_mesh_fix(sizes, n_devices)}")
        sizes[sizes.index(-1)] = n_devices // known
    if math.prod(sizes) != n_devices:
        raise ConfigError(f"{named}: {' x '.join(map(str, sizes))} = {math.prod(sizes)} devices, "
                          f"but there are {n_devices}; make the product {n_devices}, "
                          f"{_mesh_fix(sizes, n_devices)}")
    return tuple(sizes)


def _mesh_fix(sizes: list[int], n_devices: int) -> str:
    """One change that makes the mesh fit: an axis to -1 where none is and the others' product
    divides the devices, a fixed axis to 1 where one is -1, else every device on data."""
    for i, axis in enumerate(MESH_AXES):
        if sizes[i] in (-1, 1):
            continue
        rest = [1 if j == i else s for j, s in enumerate(sizes)] if -1 in sizes else \
            [s for j, s in enumerate(sizes) if j != i]
        if n_devices % math.prod(s for s in rest if s != -1) == 0:
            return f"e.g. set mesh.{axis}={1 if -1 in sizes else -1}"
    return f"e.g. set mesh.data={n_devices}, mesh.fsdp=1, mesh.tensor=1 (every device on data)"


def make_mesh(mesh_config, devices=None) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices` (default: every device of every process).

    Devices are laid out as jax.make_mesh lays them out: by physical topology on TPUs and GPUs
    (the inner axes, tensor above all, on the fastest links and inside a host), in list order
    on CPUs. Axes are `Auto`: XLA's partitioner propagates shardings between the ones we pin,
    which is what Flax's logical constraints expect (jax.make_mesh defaults to Explicit).
    """
    devices = jax.devices() if devices is None else list(devices)
    shape = mesh_shape(mesh_config, len(devices))
    slices = len({getattr(d, "slice_index", 0) or 0 for d in devices})
    if slices > 1:
        return _hybrid_mesh(shape, devices, slices)
    try:
        return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)
    except NotImplementedError:  # an axis that is no product of whole torus axes (32 on 8x8x16)
        from jax.experimental import mesh_utils
        grid = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
        return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * 3)


def _hybrid_mesh(shape, devices, slices: int) -> Mesh:
    """A mesh over several TPU slices (multi-slice): the data axis across slices, over the
    data-center network, as MaxText lays it out (data parallelism needs the least bandwidth);
    fsdp where data does not divide by the slices. Inside a slice, by physical topology."""
    from jax.experimental import mesh_utils
    axis = 0 if shape[0] % slices == 0 else 1 if shape[1] % slices == 0 else None
    if axis is None:
        raise ConfigError(f"a mesh of data {shape[0]} x fsdp {shape[1]} over {slices} slices: "
                          f"mesh.data or mesh.fsdp must be a multiple of {slices}")
    dcn = [1, 1, 1]
    dcn[axis] = slices
    ici = [n // d for n, d in zip(shape, dcn)]
    grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices, allow_split_physical_axes=True)
    return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * 3)


def platform(mesh) -> str:
    """What the mesh's devices are (cpu, gpu, tpu): what a program built for it is built for,
    whichever host builds it."""
    return mesh.devices.flat[0].platform


def axis_rules(config) -> tuple[tuple[str, tuple[str, ...] | None], ...]:
    """config.mesh.rules as Flax logical-axis rules: ((logical name, mesh axes or None), ...).

    Batch axes come first: Flax gives a mesh axis to the first logical axis that claims it, so
    an activation [batch, length, embed] splits its batch over (data, fsdp) and leaves embed
    whole, while a parameter [embed, mlp] (no batch axis) splits embed over fsdp.
    """
    pairs = []
    for name, value in config.mesh.rules.items():
        axes = tuple(a.strip() for a in value.split(",") if a.strip())
        pairs.append((name, axes or None))
    return tuple(sorted(pairs, key=lambda kv: kv[0] not in ("batch", "cache_batch")))


def shards(mesh: Mesh, rules, logical: str) -> int:
    """How many pieces the logical axis is cut into on this mesh."""
    axes = dict(rules).get(logical) or ()
    return math.prod(mesh.shape[a] for a in axes)


def check_fits(config, mesh: Mesh, checkpoint=None, processes: int | None = None) -> None:
    """Refuses, with the numbers, sizes that the mesh would have to cut unevenly.
    `checkpoint`: the workdir whose checkpoint fixes the model's sizes (a resume), so that
    the fix offered is another mesh, never another size. `processes`: the hosts of the
    target the mesh is built for (default: this run's, jax.process_count())."""
    rules = axis_rules(config)
    for logical, field in _SIZED_AXES:
        section, key = field.split(".")
        size, n = config[section][key], shards(mesh, rules, logical)
        what = f"{field}={size}"
        if logical == "mlp" and config.model.mlp == "swiglu":  # the width actually split
            size = ModelConfig.from_config(config).mlp_hidden
            what = (f"{field}={config.model.d_ff} (SwiGLU's hidden width 2/3 of it, rounded to "
                    f"a multiple of 8: {size})")
        if size and size % n:
            axes = " x ".join(f"mesh.{a}={mesh.shape[a]}" for a in dict(rules)[logical])
            fix = f"change {field} or the mesh"
            if checkpoint is not None and section == "model":
                fix = (f"the checkpoint in {checkpoint} fixes {key}: resume on a mesh that "
                       f"splits it, or keep the axis whole with --config.mesh.rules.{logical}=")
            elif logical == "vocab":  # padding rows are harmless: no token ever has those ids
                fix = (f"pad it, --config.model.vocab_size={-(-size // n) * n} (ids past the "
                       "tokenizer's are never used; 0 pads the tokenizer's to fit the mesh), "
                       "or keep the vocabulary whole with --config.mesh.rules.vocab=")
            raise ConfigError(f"{what} is not divisible by {n} ({axes}, which split "
                              f"the '{logical}' axis): {fix}")
    processes = jax.process_count() if processes is None else processes
    if config.train.batch_size % processes:
        raise ConfigError(f"train.batch_size={config.train.batch_size} is not divisible by the "
                          f"{processes} processes: each must hold a whole share")


def describe(mesh: Mesh, processes: int | None = None) -> str:
    """One line: the mesh's sizes, its devices and the processes (hosts) that drive them
    (default: this run's)."""
    processes = jax.process_count() if processes is None else processes
    sizes = " x ".join(f"{a} {mesh.shape[a]}" for a in MESH_AXES)
    return (f"mesh: {sizes} over {mesh.size} {platform(mesh)} devices"
            f" in {processes} process{'es' if processes > 1 else ''}")


def constrained(fn, mesh: Mesh, rules):
    """`fn` traced with the mesh and rules in scope, so the model's nn.with_logical_constraint
    calls turn into sharding constraints (without a mesh in scope they are no-ops)."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(rules):
            return fn(*args, **kwargs)
    return wrapped


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def logical_sharding(mesh: Mesh, rules, logical_axes) -> NamedSharding:
    """The sharding of one array whose dimensions have these logical names."""
    return NamedSharding(mesh, nn.logical_to_mesh_axes(logical_axes, rules))


def param_shardings(model_config: ModelConfig, mesh: Mesh, rules):
    """A NamedSharding for every parameter, from the logical names the model gives them."""
    from transformer.model.gpt import logical_axes  # the one place that asks the model
    with nn.logical_axis_rules(rules):
        specs = logical_axes(model_config)
    return nn.logical_to_mesh_sharding(specs, mesh, rules)


def tree_shardings_like(tree, param_sh, mesh: Mesh):
    """Shardings for a tree that holds copies of the params (an optimizer state): a leaf whose
    key path ends with a parameter's path and has its shape gets that parameter's sharding;
    everything else (step counts, scalars) is replicated. Every leaf gets one: a leaf left
    to chance lands on one device and the jitted step then refuses it."""
    by_path = {}
    for path, sharding in jax.tree_util.tree_flatten_with_path(param_sh)[0]:
        by_path[_dict_keys(path)] = sharding

    def pick(path, leaf):
        keys = _dict_keys(path)
        for start in range(len(keys)):
            sharding = by_path.get(keys[start:])
            if sharding is not None and leaf.ndim > 0:
                return sharding
        return replicated(mesh)

    return jax.tree_util.tree_map_with_path(pick, tree)


def _dict_keys(path) -> tuple:
    """The trailing run of dict keys of a key path (where the parameter names are)."""
    keys = []
    for entry in reversed(path):
        if not isinstance(entry, jax.tree_util.DictKey):
            break
        keys.append(entry.key)
    return tuple(reversed(keys))


def batch_sharding(mesh: Mesh, rules) -> NamedSharding:
    """[batch, length] arrays: rows split over the batch axes (data and fsdp)."""
    return logical_sharding(mesh, rules, BATCH_AXES)


def process_rows(sharding: NamedSharding, batch_size: int, seq_len: int) -> np.ndarray:
    """The global rows whose data this process must supply, in the order that
    jax.make_array_from_process_local_data expects them (sorted)."""
    index_map = sharding.addressable_devices_indices_map((batch_size, seq_len))
    rows = set()
    for index in index_map.values():
        rows.update(range(*index[0].indices(batch_size)))
    return np.asarray(sorted(rows))


def put_batch(local_batch: dict, sharding: NamedSharding, batch_size: int) -> dict:
    """Global arrays from this process's rows (see `process_rows`)."""
    return {k: jax.make_array_from_process_local_data(sharding, v, (batch_size,) + v.shape[1:])
            for k, v in local_batch.items()}


def decode_rules(rules, mesh: Mesh, batch: int):
    """The rules inside a program that decodes `batch` rows. Weights and activations are
    copied over `fsdp` (split over `tensor` as in training): a decode step is one token per
    row, so a weight left split over fsdp would be gathered again at every token of the loop
    (the program gathers each one once, at its top; each device then holds 1/tensor of the
    model, as on a tensor-only mesh). The rows stay split over the batch axes, unless those
    cannot split them evenly (one prompt on eight devices): then the batch is not split;
    heads still are."""
    keep = ("batch", "cache_batch", "length")
    rules = tuple((name, axes if name in keep or not axes else
                   tuple(a for a in axes if a != "fsdp") or None) for name, axes in rules)
    if batch % shards(mesh, rules, "batch") == 0 and batch % shards(mesh, rules, "cache_batch") == 0:
        return rules
    return tuple((name, None if name in ("batch", "cache_batch") else axes)
                 for name, axes in rules)


def cache_shardings(model_config: ModelConfig, mesh: Mesh, rules) -> list[dict]:
    """One sharding per KV-cache array. The arrays are [B·G, S, K] (kvcache.py): the merged
    axis is split over the mesh axes of both `cache_batch` and `cache_heads` (batch-major,
    as the rows are laid out), the rest as their logical names say."""
    sharding = NamedSharding(mesh, kvcache.row_spec(rules))
    out = [{"k": sharding, "v": sharding} for _ in range(model_config.n_layers)]
    if model_config.smear:  # the smear's embeddings, in the same layout (kvcache.init_cache)
        out[0]["x"] = sharding
    return out


def put_replicated(x, mesh: Mesh):
    """A host value (the same on every process) as an array copied on every device."""
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, replicated(mesh), lambda index: x[index])
