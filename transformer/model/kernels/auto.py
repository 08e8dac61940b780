"""What `model.matmul = "auto"` means for a program's target, and why: a pure decision from the
target's facts, which this module never reads (parallel/target.py reads them: the target knows
when it is this CPU, and what its flags are).

    choice = matmul_auto.choose("cpu", {"avx512_bf16", ...}, isa_cap=None)  # Choice("fast_bf16", ...)
    choice = matmul_auto.choose("tpu")                                      # plain
    config, choice = matmul_auto.resolve(config, choice)    # a new config with a concrete mode
    config, choice = target.resolve_matmul(config, "cpu")   # the same, this host's facts read

The run set-up (train.py via training.train, sample.py, the bench) resolves `auto` once, prints
the choice and its reason, and saves the resolved mode with the run; an explicit
`model.matmul=...` always wins. The modes use the same parameters, so a checkpoint loads
under any of them; but fast_bf16 computes in another precision, so resuming a run under a
mode of the other precision must be allowed (resume.py).

How the CPU choice is made: by the CPU's features, not by timing. `fast_bf16` casts matmul
inputs to bfloat16; that is only faster where the CPU multiplies bfloat16 natively
(AVX512_BF16 or AMX-BF16: 2.0x the float32 rate on a Zen 5, 393 against 199 GFLOP/s at
1024³; but equal, 455 against 466, on a CI Xeon whose XLA dot did not use AMX tiles, where
VDPBF16PS issues on one port: there bf16 halves the activations, not the multiplies). Without them (AVX2-only CPUs such as
AMD Zen 3) bf16 inputs are converted in software and the matmul runs at ~60% of float32, so
`fast_f32` wins. Why features rather than a timed probe: XLA's dots are done by a library
that picks its own kernels, so `XLA_FLAGS=--xla_cpu_max_isa=AVX2` does not slow them (measured
on an AVX512_BF16 CPU: the bf16 matmul ran as fast with the cap as without), and a probe would
never see the older CPU the flag emulates; a probe also costs start-up time and, on a loaded
2-core machine, times vary by 2x between back-to-back runs. The flag is honoured here: the CPU
is treated as having at most the ISA it names, which is how the AVX2 branch is tested on a
newer machine. On accelerators XLA's autodiff is already fast: `plain`. The platform is the
target's (the mesh's devices), never assumed from the host: a TPU program compiled on a CPU
(tools/compile.py) gets `plain`, as it would on the TPU.
"""

from __future__ import annotations

import dataclasses

# XLA's --xla_cpu_max_isa values for x86, oldest first (ARM's NEON/SVE never run bf16 here).
ISA_ORDER = ("SSE4_2", "AVX", "AVX2", "AVX512", "AVX512_VNNI", "AVX512_BF16", "AMX",
             "AMX_FP16")
# /proc/cpuinfo flags that make bf16-input matmuls native, with the ISA level they belong to.
BF16_FLAGS = (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512_BF16"))


@dataclasses.dataclass(frozen=True)
class Choice:
    mode: str       # a concrete model.matmul: plain | fast_f32 | fast_bf16
    reason: str     # one line, for the start-up summary and the saved run


def decide_cpu(flags: set[str], cap: str | None) -> Choice:
    """fast_bf16 where the CPU multiplies bf16 natively (within the ISA cap), else fast_f32."""
    for flag, level in BF16_FLAGS:
        if flag not in flags:
            continue
        if cap in ISA_ORDER and ISA_ORDER.index(cap) < ISA_ORDER.index("AVX512_BF16"):
            return Choice("fast_f32", f"the CPU has {flag}, but XLA_FLAGS caps the ISA at "
                                      f"{cap}: bf16 matmuls would not be native")
        return Choice("fast_bf16", f"the CPU has {flag}: bf16-input matmuls run natively")
    return Choice("fast_f32", "the CPU has no avx512_bf16 or amx_bf16: bf16-input matmuls "
                              "would be slower than float32")


def choose(platform: str, cpu_flags: set[str] | frozenset = frozenset(),
           isa_cap: str | None = None) -> Choice:
    """What auto means for a program built for `platform` (cpu, gpu, tpu: the mesh's
    devices), given the target CPU's flags and XLA's ISA cap (parallel/target.py's
    matmul_choice reads them from this host, the only CPU a program is built for)."""
    if platform != "cpu":
        return Choice("plain", f"{platform}: XLA's own backward is fast there")
    return decide_cpu(set(cpu_flags), isa_cap)


def resolve(config, choice: Choice):
    """(a copy of config with model.matmul concrete, the Choice): `choice` for `auto`; an
    explicit mode wins."""
    from transformer import config as config_lib

    mode = config.model.matmul
    if mode != "auto":
        return config, Choice(mode, "set in the config")
    return config_lib.replace(config, **{"model.matmul": choice.mode}), choice


def describe(choice: Choice) -> str:
    """The start-up summary's line."""
    return f"matmul: {choice.mode} ({choice.reason})"
