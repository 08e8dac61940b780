"""GPT-2's block (2019) at the quick start's size: learned positions, pre-norm LayerNorm, the
tanh GELU MLP, biases everywhere, the head tied to the embedding. The quick start
(configs/default.py) before it moves to a modern recipe, kept one config away: it exports as
GPT2LMHeadModel, and is what GPT-2 weights load into.

    python train.py --config=configs/gpt2.py
"""

from transformer.config import GPT2_BLOCK, base_config


def get_config():
    c = base_config()
    c.model.update(d_model=128, n_layers=4, n_heads=4, d_ff=512, max_seq_len=128, **GPT2_BLOCK)
    c.data.max_bytes = 4_000_000
    c.train.update(steps=900, batch_size=16, lr=2e-3, warmup_steps=50, log_every=25,
                   eval_every=150, eval_batches=8, ckpt_every=300)
    c.sample.max_new_tokens = 120
    return c
