"""The data room: text in, integer batches out. Knows nothing of the model.

    tokenizers.py  byte, char and BPE tokenizers (saved with every checkpoint as JSON)
    corpus.py      the standard library's sources; what a run read, for its summary
    batches.py     synthetic tasks; a batch is a pure function of (seed, split, index, row)
    sources.py     documents from files, folders, globs: Parquet, JSON Lines, text
    split.py       which text is held out: whole documents by hash, else the tail (one rule)
    prepare.py     a corpus tokenized once into token shards + manifest (docs/data.md)
    durable.py     writes of the user's data that survive a power loss (fsync, rename, fsync)
    prepared.py    reading a prepared folder: windows, each epoch a keyed permutation
    cache.py       a corpus named directly, prepared on first use into a cache

`load(config)` turns the `data` section of a config into (tokenizer, batch source): a prepared
folder (its own tokenizer, its shards read window by window), a text corpus named directly
(prepared into the cache on first use, then read as a prepared folder: one loader) or a
synthetic task.
May import: config/. Never: model/, train/ or anything above them.
"""

from __future__ import annotations

from transformer.config.fields import SYNTHETIC_CORPORA as SYNTHETIC  # declared with data.corpus
from transformer.data import batches, cache, corpus, prepared, tokenizers
from transformer.data.corpus import CorpusError
from transformer.data.tokenizers import TokenizerError


def load(config, tokenizer=None):
    """(tokenizer, source) for `config.data`; pass a saved tokenizer to reuse it on resume."""
    d, seq_len = config.data, config.model.max_seq_len
    if d.corpus in SYNTHETIC:
        tokenizer = tokenizer or tokenizers.ByteTokenizer()
        vocab = config.model.vocab_size or tokenizer.vocab_size
        task = batches.CopyTask if d.corpus == "copy" else batches.RandomTokens
        return tokenizer, task(vocab, seq_len)
    if prepared.is_prepared(d.corpus):
        return _check_tokenizer(d.corpus, prepared.PreparedSet(d.corpus, seq_len), tokenizer)
    # Text named directly: prepared once into the cache (cache.py), then read the same way.
    return _check_tokenizer(d.corpus, cache.load(d, seq_len, tokenizer), tokenizer)


def _check_tokenizer(folder, source, tokenizer):
    """The set's tokenizer and the set; a resumed run's tokenizer must be the set's."""
    if tokenizer is not None and (tokenizers.fingerprint(tokenizer)
                                  != tokenizers.fingerprint(source.tokenizer)):
        raise CorpusError(
            f"data.corpus={folder}: its tokenizer ({source.tokenizer.kind}, vocabulary "
            f"{source.tokenizer.vocab_size}, {tokenizers.fingerprint(source.tokenizer)}) is not "
            f"the checkpoint's ({tokenizer.kind}, vocabulary {tokenizer.vocab_size}, "
            f"{tokenizers.fingerprint(tokenizer)}): the run's token ids would change meaning; "
            "resume on a folder prepared with the checkpoint's tokenizer, or use a new --workdir")
    return source.tokenizer, source


def describe(config, source) -> str:
    """What the run trains on, for the start-up summary."""
    if hasattr(source, "describe"):
        return source.describe(config)
    return corpus.describe(config.data.corpus)


def tokens_per_byte(tokenizer, source) -> float:
    """Tokens per UTF-8 byte of the validation text, what turns nats per token into bits per
    byte: counted when the set was prepared (end tokens count, with no bytes); 1 for the
    synthetic tasks (byte tokens)."""
    if hasattr(source, "tokens_per_byte"):
        return source.tokens_per_byte()
    return 1.0


__all__ = ["load", "describe", "tokens_per_byte", "CorpusError", "TokenizerError", "batches",
           "cache", "corpus", "prepared", "tokenizers"]
