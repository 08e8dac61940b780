"""One (config, target) compiled in a process of its own, for tests/test_host_independence.py.

    python tests/host_independence_check.py TARGET OUT.json [--cpu=avx2|amx] [--plant]

Writes the program's fingerprint (tools/program.py: the optimised HLO, metadata stripped)
and the stripped text. --cpu replaces what this host's /proc/cpuinfo says (host.read_cpuinfo)
with an AVX2-only or an AMX CPU; --plant decides the activations' dtype by the building
host's devices (more simulated devices, and the program changes), as a program built for the
host would: the failure the test must catch. (`model.matmul=auto` resolved by the host's CPU
was tried first and changed nothing on a TPU: XLA runs both fast modes' float32 and bfloat16
dots as the same bfloat16 passes there; remat chosen that way changed nothing either.)
"""

import json
import sys

CPUS = {"avx2": "flags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma\n",
        "amx": "flags\t\t: fpu sse sse2 avx avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"}


def main(target_name: str, out: str, args: list[str]) -> None:
    from transformer import host
    for arg in args:
        if arg.startswith("--cpu="):
            text = CPUS[arg.split("=", 1)[1]]
            host.read_cpuinfo = lambda *a, **k: text
    import jax
    jax.config.update("jax_platforms", "cpu")  # as the compile command does
    from configs.tiny import get_config
    from transformer.config import replace, validate
    from transformer.parallel import target as target_lib
    from transformer.tools import compile as compile_tool, program
    target = target_lib.parse(target_name)
    config = get_config()
    config.mesh.update(data=1, fsdp=target.chips, tensor=1)
    config = compile_tool.resolved_config(validate(config), target)
    if "--plant" in args:  # a host read: the building machine's devices decide the program
        config = replace(config, **{"model.dtype": "bfloat16" if len(jax.devices()) > 1
                                    else config.model.dtype})
    report, _ = compile_tool.compile_train(config, target)
    with open(out, "w") as f:
        json.dump({"fingerprint": report.fingerprint, "text": program.stripped(report.hlo),
                   "matmul": config.model.matmul, "built_under": report.built_under}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
