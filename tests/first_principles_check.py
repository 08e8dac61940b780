"""One (config, target, mesh) train step compiled in a process of its own, for
tests/test_first_principles.py: its collectives per kind, per chip per step, and the bytes
each chip sends (parallel/links.py), as JSON.

    python tests/first_principles_check.py CONFIG TARGET D,F,T LENGTH OUT.json [field=value ...]

CONFIG is a module of configs/ (gpt2_small, llama3_8b); LENGTH `tensor` for sequence
parallelism, `-` for none; field=value overrides (model.n_layers=2). GPU targets need the CUDA
plugin and JAX_PLATFORMS=cpu.
"""

import importlib
import json
import sys


def main(name, target_name, shape, length, out, overrides):
    import jax
    jax.config.update("jax_platforms", "cpu")
    from transformer.config import replace, validate
    from transformer.parallel import links, target as target_lib
    from transformer.tools import collectives, compile as compile_tool
    config = importlib.import_module(f"configs.{name}").get_config()
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = map(int, shape.split(","))
    config.mesh.rules.length = "" if length == "-" else length
    values = {}
    for item in overrides:
        key, value = item.split("=", 1)
        values[key] = value if not value.lstrip("-").isdigit() else int(value)
        values[key] = {"True": True, "False": False}.get(value, values[key])
    config = validate(replace(validate(config), **values))
    target = target_lib.parse(target_name)
    config = compile_tool.resolved_config(config, target)
    report, _ = compile_tool.compile_train(config, target)
    mesh = report.mesh
    ops, unknown = collectives.read(report.hlo, tuple(mesh.values()), tuple(mesh))
    dtypes = {}
    for op in ops:  # collective-permute bytes by dtype: the pieces of a windowed einsum's ring
        if op.kind == "collective-permute":
            dtype = op.shape.split("[")[0].lstrip("(")
            dtypes[dtype] = dtypes.get(dtype, 0) + op.bytes * op.runs
    c = config.model
    with open(out, "w") as f:
        json.dump({"totals": collectives.totals(ops), "permute_bytes_by_dtype": dtypes,
                   "unknown_loops": unknown, "top": collectives.top(ops, 12),
                   "sent": {k: v["sent"] for k, v in report.links.items()},
                   "fits": report.fits, "compile_s": report.compile_s,
                   "batch": config.train.batch_size, "accum": config.train.grad_accum,
                   "model": {k: getattr(c, k) for k in ("d_model", "n_layers", "vocab_size",
                                                        "max_seq_len", "dtype", "remat")}},
                  f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:6], sys.argv[6:])
