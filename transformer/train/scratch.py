"""A train step's scratch memory on CPU, allocated so that the next step reuses it.

XLA on CPU allocates each execution's temporaries (the activations a step keeps for its
backward pass: 462 MB at configs/bench.py's shape, ~120 MB at the quick start's) as one block,
with malloc, from one of its own threads, and frees it when the step ends. glibc maps a block
that large afresh each time (`mmap`, then `munmap`: a thread's arena cannot hold it and the
mmap threshold stops at 32 MB), so every step the kernel zeroes and maps in each of its pages
again: 114,000 page faults a step at the bench's shape, about a fifth of the step's time, in
the middle of its matmuls. Two settings, together, let the second step reuse the first
step's pages (docs/performance.md, "page faults"):

- `compiler_options`: XLA's buffer assignment packs the temporaries into blocks of at most
  16 MiB (`xla_multiheap_size_constraint_per_heap`), which glibc serves from its heaps. It
  changes where buffers lie, never a number. Only where no single activation is larger (a
  larger one gets a block of its own, and XLA logs a warning for each at compile time).
- `keep_freed_memory`: glibc's mmap threshold fixed at its largest (32 MiB; left alone it
  starts at 128 KiB and moves), its heaps never trimmed, and 64 MiB of top padding, which
  also stops glibc from unmapping a thread's heap (64 MiB) the moment it empties: freed blocks
  stay mapped. Process-wide, so the command lines that train call it first thing (train.py,
  `python -m transformer bench` and `scaling`); a program that imports the library may call
  it itself.

Measured on a 2-vCPU Intel Xeon (Sapphire Rapids-class KVM, AVX-512 + AMX), `python train.py
--config.train.steps=150`: 4.7M page faults -> ~0.3M, the 150 steps ~0.77x the time.
What did not work, and why, is in docs/performance.md: one glibc arena (every thread then
queues on its lock), mmap disabled, transparent huge pages (the zeroing stays).
"""

from __future__ import annotations

import ctypes
import platform

HEAP_BYTES = 16 << 20  # the largest block XLA's buffer assignment packs a step's scratch into

# mallopt's parameter numbers (glibc's malloc.h) and the largest mmap threshold glibc takes
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_MMAP_THRESHOLD_MAX = 32 << 20
_TOP_PAD = 64 << 20  # a thread's whole heap
_INT_MAX = 2**31 - 1


def compiler_options(platform_name: str, largest_activation_bytes: int) -> dict | None:
    """The XLA options of a train step or evaluation (jax.jit(..., compiler_options=...)) on
    `platform_name` whose largest activation takes `largest_activation_bytes`; None for none."""
    if platform_name != "cpu" or largest_activation_bytes > HEAP_BYTES:
        return None
    return {"xla_multiheap_size_constraint_per_heap": HEAP_BYTES}


def largest_activation_bytes(model_config, rows: int) -> int:
    """The largest float32 array a step over `rows` sequences keeps (an estimate from the
    shapes: the logits, an MLP's hidden layer, or one block's attention weights)."""
    c = model_config
    T = c.max_seq_len
    return 4 * rows * T * max(c.vocab_size, c.mlp_hidden, c.n_heads * T, c.d_model)


def keep_freed_memory() -> bool:
    """Fix glibc's mmap threshold at 32 MiB, never trim its heaps and pad them by 64 MiB, so
    that freed blocks are reused rather than mapped again. True if set; False where the C library is not
    glibc, or where the user set malloc's environment variables (MALLOC_*), which win."""
    import os
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    if any(k.startswith("MALLOC_") for k in os.environ):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in (
        (_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX), (_M_TRIM_THRESHOLD, _INT_MAX),
        (_M_TOP_PAD, _TOP_PAD)))
