"""A model that trains in seconds: for tests and for trying the commands."""

from transformer.config import base_config


def get_config():
    c = base_config()
    c.model.update(d_model=64, n_layers=2, n_heads=4, d_ff=256, max_seq_len=64)
    c.data.max_bytes = 300_000
    c.train.update(steps=50, batch_size=8, lr=3e-3, warmup_steps=10, log_every=10,
                   eval_every=25, eval_batches=2, ckpt_every=25)
    c.sample.max_new_tokens = 40
    return c
