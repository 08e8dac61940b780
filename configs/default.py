"""The quick start: a small byte-level GPT on the Python standard library's sources.
About 4 minutes on 2 CPU cores; the sample at the end looks like Python."""

from transformer.config import base_config


def get_config():
    c = base_config()
    c.model.update(d_model=128, n_layers=4, n_heads=4, d_ff=512, max_seq_len=256)
    c.data.max_bytes = 4_000_000
    c.train.update(steps=1000, batch_size=16, lr=2e-3, warmup_steps=50, log_every=25,
                   eval_every=200, eval_batches=8, ckpt_every=250)
    c.sample.max_new_tokens = 200
    return c
