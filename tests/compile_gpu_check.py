"""The tiny config's train step compiled for 8 abstract H100s (h100.txtpb), in a process of its own.

    JAX_PLATFORMS=cpu python tests/compile_gpu_check.py OUT.json

Needs the CUDA plugin (`pip install -e ".[cuda12]"`), no GPU: JAX_PLATFORMS=cpu makes the
plugin skip its driver check (without it, on a machine with no GPU, it registers no CUDA
topology). tests/test_compile_gpu.py runs it and asserts on the JSON: for attention_kernel
einsum and cudnn, the devices' kind, compile seconds, XLA's peak bytes per GPU and the
custom calls to cuDNN's fused attention in the optimised HLO; and the device count and kind
of every shipped target's 8-GPU topology (XLA parses each .txtpb).
"""

import json
import re
import sys
import time

import jax
import jax.numpy as jnp

from transformer.config import base_config, validate
from transformer.parallel import gpu_targets, sharding
from transformer.train.trainer import Trainer


def compile_step(devices, attention_kernel: str, options=None) -> dict:
    c = base_config()
    c.model.update(vocab_size=256, d_model=64, n_layers=2, n_heads=4, d_ff=256, max_seq_len=64,
                   dtype="bfloat16", matmul="plain", attention_kernel=attention_kernel)
    c.train.batch_size = 8
    c.mesh.update(data=1, fsdp=8, tensor=1)
    # validate, not train/start.resolve: resolve refuses cudnn unless *this host* is a GPU
    c = validate(c)
    trainer = Trainer.build(c, sharding.make_mesh(c.mesh, devices=devices))
    B, T = c.train.batch_size, c.model.max_seq_len
    batch = {k: jax.ShapeDtypeStruct((B, T), dtype, sharding=trainer.batch_sharding)
             for k, dtype in (("inputs", jnp.int32), ("targets", jnp.int32),
                              ("weights", jnp.float32))}
    begin = time.perf_counter()
    compiled = trainer.step_fn.lower(trainer.abstract_state(), batch).compile(options)
    hlo = compiled.as_text()
    return {"compile_s": time.perf_counter() - begin,
            "peak_bytes": compiled.memory_analysis().peak_memory_in_bytes,
            "cudnn_attention": sorted(set(re.findall(r'custom_call_target="(__cudnn\$fmha\w*)"',
                                                     hlo))),
            "all_gathers": len(re.findall(r" all-gather(?:-start)?\(", hlo)),
            "n_layers": c.model.n_layers}


def main(out_path):
    devices = gpu_targets.devices("h100", "1x1x8")
    report = {"devices": len(devices), "kind": devices[0].device_kind,
              "platform": devices[0].platform, "hbm_bytes": gpu_targets.chip("h100").hbm_bytes}
    for kernel in ("einsum", "cudnn"):
        report[kernel] = compile_step(devices, kernel)
    # every shipped target parses as XLA's GpuTargetConfigProto and names its devices
    report["targets"] = {}
    for name in gpu_targets.names():
        each = gpu_targets.devices(name, "1x1x8")
        report["targets"][name] = [len(each), each[0].device_kind]
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
