"""`python -m transformer prepare INPUT... --out=DIR`: tokenize a corpus once into shards.

    python -m transformer prepare stdlib --out=data/stdlib
    python -m transformer prepare 'shards/*.parquet' --out=data/web --tokenizer=bpe \
        --vocab_size=32768

The work is transformer/data/prepare.py's (inputs, the split, the folder: docs/data.md); this
is its command line: flags, the summary line, and bad input as one `error:` line.
"""

from __future__ import annotations

import sys
import time

from absl import flags

from transformer import cli
from transformer.data import prepare as prepare_lib
from transformer.data import split

_OUT = flags.DEFINE_string("out", None, "The folder to write (refused if it exists).")
_TOKENIZER = flags.DEFINE_string("tokenizer", "byte", "byte | char | bpe | a tokenizer.json file.")
_VOCAB = flags.DEFINE_integer("vocab_size", 8192,
                              "bpe: the vocabulary, end-of-text token included.")
_FIELD = flags.DEFINE_string("text_field", "text", "JSONL/Parquet: the field holding the text.")
_VAL = flags.DEFINE_float("val_fraction", 0.05, "The fraction of documents held out (by hash; "
                          "docs/data.md).")
_SAMPLE = flags.DEFINE_integer("sample_bytes", prepare_lib.SAMPLE_BYTES,
                               "bpe: learn the merges from this much training text.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False,
                               "Replace --out if it is a prepared folder (or empty).")
_PROGRESS = flags.DEFINE_bool("progress", True, "Show progress (MB/s, ETA) on stderr.")


def main(argv) -> None:
    inputs = argv[1:]
    if not inputs:
        cli.fail("give INPUT... (files, folders, globs or stdlib) and --out=DIR")
    if not _OUT.value:
        cli.fail("--out=DIR is required: the folder to write")
    begin = time.perf_counter()
    manifest = prepare_lib.prepare(
        inputs, _OUT.value, _TOKENIZER.value, _VOCAB.value, _FIELD.value, _VAL.value,
        _SAMPLE.value, _OVERWRITE.value, _PROGRESS.value, command=sys.argv)
    print(summary(_OUT.value, manifest, time.perf_counter() - begin))


def summary(out, manifest: dict, seconds: float) -> str:
    s, tok, spent = manifest["splits"], manifest["tokenizer"], manifest["seconds"]
    mb = (s["train"]["bytes"] + s["val"]["bytes"]) / 1e6  # of text, whatever the compression
    line = (f"{out}: {s['train']['tokens']:,} train tokens ({s['train']['documents']:,} "
            f"documents), {s['val']['tokens']:,} val tokens ({s['val']['documents']:,} "
            f"documents); {tok['kind']} tokenizer, vocabulary {tok['vocab_size']:,}, "
            f"{manifest['dtype']}; {mb:,.1f} MB of text in {seconds:.1f}s "
            f"({mb / max(seconds, 1e-9):.1f} MB/s; tokenizer {spent['tokenizer']:.1f}s, "
            f"encoding {spent['encode']:.1f}s = {mb / max(spent['encode'], 1e-9):.1f} MB/s)")
    line += "; " + split.describe(manifest.get("split"), s["val"], mb * 1e6)
    return line + (f"; skipped: {manifest['skipped']}" if manifest["skipped"] else "")


if __name__ == "__main__":
    cli.run(main)
