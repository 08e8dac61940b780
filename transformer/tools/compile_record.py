"""`compile --record=PATH`: one compiled program as a dated record (transformer/lab/records.py's
schema, a flat `result`); lab/accelerators_table.py makes docs/accelerators.md's table of them.

    python -m transformer compile --config=configs/llama3_8b.py --target=h100:1x2x8 \\
        --record=docs/records/compile.jsonl
    python -m transformer.lab.records      # rewrites docs/records.md and the table

Rows are the records whose result says `counter: operations` (each collective counted once,
priced on its links: tools/collectives.py, parallel/links.py); older records were read by a
line counter and stay in docs/records.md only.
"""

from __future__ import annotations

GiB = 2**30


def result(report, config, config_path: str) -> dict:
    """The flat figures of one report."""
    m = report.mesh
    seq = " seq" if config.mesh.rules.length else ""
    out = {"config": config_path, "target": report.target, "chips": report.chips,
           "mesh_dxfxt": f"{m['data']}x{m['fsdp']}x{m['tensor']}{seq}",
           "remat": config.model.remat, "grad_accum": config.train.grad_accum,
           "batch": config.train.batch_size, "dtype": config.model.dtype,
           "fits": report.fits, "usable_gib": round(report.hbm_bytes_per_chip / GiB, 2),
           "peak_gib": round(report.peak_bytes_per_chip / GiB, 2),
           "peak_tflops": round(report.peak_flops_per_chip / 1e12, 1),
           "compute_ms": round(report.compute_s * 1e3, 4),
           "predicted_step_ms": round(report.predicted_step_s * 1e3, 4),
           "predicted_mfu_pct": round(100 * report.predicted_mfu, 1)}
    for kind, v in report.collectives.items():
        if v["count"]:
            out[f"{kind}_gib"] = round(v["bytes"] / GiB, 4)
    for name, v in report.links.items():
        out[f"{name}_gib"] = round(v["bytes"] / GiB, 4)
        out[f"{name}_ms"] = round(v["seconds"] * 1e3, 4)
    if report.gpu_memory:
        out["fits_jax_default_pool"] = report.gpu_memory["fits_default"]
    out.update(compile_s=round(report.compile_s), fingerprint=report.fingerprint,
               counter="operations",
               **{k: v for k, v in report.built_under.items() if k in ("jax", "libtpu",
                                                                     "jax-cuda12-plugin")})
    return out
