"""GPT-2 small's shape (12 layers, 12 heads, d_model 768, d_ff 3072, context 1024) with the
byte-level vocabulary: the GPU line of the bench (bfloat16, MFU against the datasheet peak).

    python -m transformer bench --config=configs/gpt2_small.py --modes=bf16 --no_peer

About 85M non-embedding parameters; one training step (16 x 1024 tokens) is ~8.5 TFLOP, so
this is a GPU/TPU config: on a 2-core CPU a single step takes minutes.
"""

from transformer.config import GPT2_BLOCK, base_config


def get_config():
    c = base_config()
    # GPT-2's own block, whatever the field defaults are: fine-tuning from GPT-2 weights
    # (docs/huggingface.md) needs it.
    c.model.update(vocab_size=0, d_model=768, n_layers=12, n_heads=12, d_ff=3072,
                   max_seq_len=1024, **GPT2_BLOCK)
    c.data.max_bytes = 4_000_000
    c.train.update(batch_size=16, lr=6e-4, warmup_steps=2, eval_batches=2)
    return c
