"""Page faults per train step, in a process of its own (glibc's settings are process-wide).

    python tests/scratch_check.py kept       # scratch.keep_freed_memory() and XLA's options
    python tests/scratch_check.py as_is      # neither: glibc and XLA as they come

Prints {"faults_per_step": F, "scratch_pages": P}: the median minor page faults of steps 9..24
("kept"; 3..8 "as_is", which faults every step) of a one-block model whose step keeps ~100 MB
of scratch, and that scratch in 4 KiB pages.
tests/test_training.py compares the two. The first steps are left out because each of XLA's
threads allocates from a glibc arena of its own, which maps its pages the first time that
thread frees a step's scratch: on an idle machine the same threads run every step and the
faults stop by step 3, but under load the steps move between threads and arenas keep warming
up until step ~12 (seen here: a whole step's 24,800 faults at steps 3-7 in 2 of 4 runs with
two busy processes on the 2 cores; 0 by step 13 in all).
"""

import json
import resource
import statistics
import sys

from transformer.train import scratch

kept = sys.argv[1] == "kept"
# As glibc and XLA come, every step after the first maps its scratch again: steps 3..8 show it.
STEPS, WARMUP = (24, 8) if kept else (8, 2)
if kept:
    assert scratch.keep_freed_memory()
else:
    scratch.compiler_options = lambda *args: None  # as before scratch.py

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from transformer.config import base_config  # noqa: E402
from transformer.train.trainer import Trainer  # noqa: E402

c = base_config()
c.model.update(vocab_size=256, d_model=128, n_layers=1, n_heads=4, d_ff=512, max_seq_len=256,
               matmul="fast_f32")
c.train.update(batch_size=16, steps=STEPS)
t = Trainer.build(c)
state = t.init(0)
B, T = 16, 256
batch = {"inputs": jnp.ones((B, T), jnp.int32), "targets": jnp.ones((B, T), jnp.int32),
         "weights": jnp.ones((B, T), jnp.float32)}
scratch_bytes = t.step_fn.lower(state, batch).compile().memory_analysis().temp_size_in_bytes
faults = []
for i in range(STEPS):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    state, metrics = t.step_fn(state, batch)
    jax.block_until_ready((state, metrics))
    if i >= WARMUP:
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"faults_per_step": statistics.median(faults),
                  "scratch_pages": scratch_bytes // 4096}))
