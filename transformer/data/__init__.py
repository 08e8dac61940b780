"""Data: tokenizers, corpora and batches. Knows nothing of the model; hands out integer arrays.

`load(config)` turns the `data` section of a config into (tokenizer, batch source).
"""

from __future__ import annotations

from transformer.data import batches, corpus, tokenizers
from transformer.data.corpus import CorpusError
from transformer.data.tokenizers import TokenizerError
from transformer.fields import SYNTHETIC_CORPORA as SYNTHETIC  # declared with data.corpus


def load(config, tokenizer=None):
    """(tokenizer, source) for `config.data`; pass a saved tokenizer to reuse it on resume."""
    d, seq_len = config.data, config.model.max_seq_len
    if d.corpus in SYNTHETIC:
        tokenizer = tokenizer or tokenizers.ByteTokenizer()
        vocab = config.model.vocab_size or tokenizer.vocab_size
        task = batches.CopyTask if d.corpus == "copy" else batches.RandomTokens
        return tokenizer, task(vocab, seq_len)
    text = corpus.read_corpus(d.corpus, d.max_bytes)
    tokenizer = tokenizer or tokenizers.build(d.tokenizer, text, d.bpe_vocab_size)
    return tokenizer, batches.TokenStream(tokenizer.encode_array(text), seq_len, d.val_fraction)


__all__ = ["load", "CorpusError", "TokenizerError", "batches", "corpus", "tokenizers"]
