"""The data room: text in, integer batches out. Knows nothing of the model.

    tokenizers.py  byte, char and BPE tokenizers (saved with every checkpoint as JSON)
    corpus.py      corpora: the standard library's sources, files, folders, synthetic tasks
    batches.py     a batch is a pure function of (seed, split, index, row)
    sources.py     documents from files, folders, globs: Parquet, JSON Lines, text
    prepare.py     a corpus tokenized once into token shards + manifest (docs/data.md)
    prepared.py    reading a prepared folder: windows, each epoch a keyed permutation

`load(config)` turns the `data` section of a config into (tokenizer, batch source): a prepared
folder (its own tokenizer, its shards read window by window), a text corpus named directly
(read into memory and tokenized whole: batches.TokenStream) or a synthetic task.
May import: config/. Never: model/, train/ or anything above them.
"""

from __future__ import annotations

from transformer.config.fields import SYNTHETIC_CORPORA as SYNTHETIC  # declared with data.corpus
from transformer.data import batches, corpus, prepared, tokenizers
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
        return _load_prepared(d.corpus, seq_len, tokenizer)
    text = corpus.read_corpus(d.corpus, d.max_bytes)
    if (tokenizer.kind if tokenizer is not None else d.tokenizer) == "bpe":
        # BPE's merges are statistics of the text: learned from the training blocks only, so
        # the held-out text is new to it (the split is made on the text, before tokenizing).
        train_text, val_text = batches.split_text(text, seq_len, d.val_fraction)
        tokenizer = tokenizer or tokenizers.build("bpe", train_text, d.bpe_vocab_size)
        source = batches.TokenStream(tokenizer.encode_array(train_text), seq_len,
                                     d.val_fraction, val_tokens=tokenizer.encode_array(val_text))
    else:  # bytes need nothing learned; a char tokenizer's alphabet is the whole corpus's
        tokenizer = tokenizer or tokenizers.build(d.tokenizer, text, d.bpe_vocab_size)
        source = batches.TokenStream(tokenizer.encode_array(text), seq_len, d.val_fraction)
    source.read = text.read  # how much text from how many files (the run's data: line)
    return tokenizer, source


def _load_prepared(folder, seq_len, tokenizer):
    """The folder's tokenizer and windows; a resumed run's tokenizer must be the folder's."""
    source = prepared.PreparedSet(folder, seq_len)
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
    return corpus.describe(config.data.corpus, getattr(source, "read", None))


def tokens_per_byte(tokenizer, source) -> float:
    """Tokens per UTF-8 byte of the validation text, what turns nats per token into bits per
    byte. Byte tokens are bytes; otherwise the held-out tokens are decoded and their bytes
    counted (a block boundary inside a character may miscount a byte or two)."""
    if hasattr(source, "tokens_per_byte"):
        return source.tokens_per_byte()  # a prepared set counted them when it was written
    if tokenizer.kind == "byte" or not hasattr(source, "splits"):
        return 1.0  # the byte tokenizer, and the synthetic tasks (which use it)
    val = source.splits["val"]
    return len(val) / max(1, len(tokenizer.decode(val).encode("utf-8")))


__all__ = ["load", "describe", "tokens_per_byte", "CorpusError", "TokenizerError", "batches",
           "corpus", "prepared", "tokenizers"]
