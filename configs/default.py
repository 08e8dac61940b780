"""The quick start: a small GPT on the Python standard library's sources with a 2,048-token
BPE learned from them, sized as a speedrun for 4 minutes of training on a 2-core AVX2 laptop
or server (docs/quickstart.md).

The recipe is the last row of docs/speedrun.md, each change measured there over the one
before it (two seeds each, validation over the whole held-out split):
- the modern block, RoPE + RMSNorm + SwiGLU (1.681 -> 1.315 nats per byte at 900 steps);
- Muon for the blocks' matrices, AdamW for embeddings, norms and biases (-> 1.198 at 900);
- 620 steps instead of 900: Muon's Newton-Schulz steps make a step ~1.3x dearer on a CPU,
  and 620 is what fits 240 s of training on the Zen 3 the budget is set on (-> 1.262);
- AdamW (embedding, norms, biases) at lr 6e-3 instead of 2e-3 (-> 1.247);
- Muon at lr 0.01 instead of optax's usual 0.02 (-> 1.227).
On the validation set as it ships (whole held-out documents, harder text: those rows read
1.873 -> 1.423), then:
- Muon's momentum 0.9 instead of 0.95 (-> 1.415);
- BPE tokens instead of bytes: a 2,048-token vocabulary learned from the training documents
  when the text is prepared (~3 s), so each step of 2,048 tokens reads ~6,300 bytes of text
  instead of 2,048; the larger head makes a step ~1.27x dearer, so 490 steps keep the clock
  (-> 1.263 nats per byte);
- AdamW (embedding, norms) at lr 1.5e-2 instead of 6e-3 (-> 1.239);
- the step made ~11% cheaper (batched Newton-Schulz, RoPE, attention backward), spent on the
  wall clock rather than on steps (-> 1.239/1.243, seeds 0/1): on an AMX Xeon nanoGPT's
  README CPU run takes 61-69 s and the whole train.py should stay within 1.2x of it
  (issue 29): 540 steps reach 1.222 but take 1.27x; 490 take 1.225x, 460 (1.252) 1.24x;
- the Newton-Schulz matmuls in bf16 where the model's are (train.muon_ns_dtype=auto, now the
  field's default; float32 on a Zen 3): the same loss (1.2393/1.2431), 4.5% less a step;
- SwiGLU's hidden width 512 -> 256 (2x d_model, not 4x): a step 0.84x the CPU, spent on
  540 steps and the wall clock around them (-> 1.2361/1.2378);
- the head's matmul in bf16 through the kernel seam like every other layer (it ran in
  float32): the same loss, a step 0.88x;
- an untied head (its own [128, 2048] matrix, AdamW) - with the bf16 head no dearer than the
  tied one - and 610 steps with the time saved (-> 1.2019/1.2014);
- Adam's beta2 0.95 -> 0.99 (-> 1.1972/1.1986 nats per byte);
- the step made ~0.77x the time on CPU (the update in place, the scratch memory reused from
  step to step: docs/performance.md), spent on 800 steps (-> 1.1858/1.1862), what fits 240 s on
  the Zen 3 by the estimate in docs/quickstart.md;
- 880 steps (-> 1.1730/1.1745): timed on a 2-vCPU AMD EPYC Zen 4 in the Zen 3's own float32
  arithmetic (XLA_FLAGS=--xla_cpu_max_isa=AVX2) and scaled by the bench's PyTorch peer, as
  issue 29's budget rule says: ~182-196 s of the Zen 3's 240 (docs/speedrun.md, row 17;
  ~182-219 s with the slowest float32 runs of rows 18-19, same step);
- Muon's decoupled weight decay 0.2 (times its lr; 0 before), the same step cost
  (-> 1.1623/1.1702; 0.1 gave 1.1675, 0.3 1.1623/1.1746, 0.4 1.1649: row 18);
- Adam's beta1 0.9 -> 0.8 for the AdamW half (embedding, head, norms; Muon's momentum is its
  own), the same program with another constant (-> 1.1586/1.1627; 0.7 gave 1.1601, 0.85
  1.1594: row 19); 1.1645/1.1588 on the data since pieces are never cut mid-line (its BPE
  changed with them: docs/speedrun.md).
Context 128 and 2,048 tokens per step: early in training the loss falls with the number of
steps more than with the tokens in each, and a shorter context makes every token cheaper;
the cosine schedule ends at the last step. GPT-2's block, for the Hugging Face GPT-2 tests
and fine-tuning, is one config away (model.position=learned, norm=layernorm, mlp=gelu)."""

from transformer.config import base_config


def get_config():
    c = base_config()
    c.model.update(d_model=128, n_layers=4, n_heads=4, d_ff=256, max_seq_len=128,
                   position="rope", norm="rmsnorm", mlp="swiglu", tie_embeddings=False)
    c.data.update(max_bytes=4_000_000, tokenizer="bpe", bpe_vocab_size=2048)
    c.train.update(steps=880, batch_size=16, optimizer="muon", muon_lr=0.01, lr=1.5e-2,
                   b1=0.8, b2=0.99, muon_momentum=0.9, muon_weight_decay=0.2, warmup_steps=50,
                   log_every=25, eval_every=150, eval_batches=8, ckpt_every=300)
    # BPE tokens carry a word's leading space (" main", " self"): a prompt ending in a space
    # asks for what follows a lone space token, which the training text rarely has ("def "
    # began "def  Multipart"), and "def" alone, at a document's start, read as "defects".
    # A file's first line is what the model has seen at position 0.
    # 100 new tokens fit the context after the prompt's 16-slot bucket: the sample's program
    # then has no window loop to compile (decode.token_budget).
    c.sample.update(prompt="import os", max_new_tokens=100)
    return c
