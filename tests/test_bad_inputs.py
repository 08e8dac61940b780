"""Bad input through the real command lines: refused early, in one clear line, harmlessly.

Each row runs `train.py` or `sample.py` and checks: a non-zero exit, exactly one line on
stderr that starts with `error:` and names what is wrong (a phrase from it is the row's
expectation), no traceback, and the workdir exactly as it was (a fresh path not created; an
existing workdir byte for byte unchanged). The rows run as children of the suite's fork server, a
process that has imported jax and the rest once (tests/fork_server.py: ~1-2 s less each), a
few at a time; the rows in REAL also run as real processes (with -m slow), which must give
the same status and stderr.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import fork_run

ROOT = Path(__file__).resolve().parents[1]
MODEL = ["--config=configs/tiny.py", "--config.model.d_model=32", "--config.model.n_heads=2",
         "--config.model.n_layers=1", "--config.model.d_ff=64", "--config.model.max_seq_len=32",
         "--config.model.vocab_size=0", "--config.data.tokenizer=char",
         "--config.train.batch_size=4", "--config.train.steps=4", "--config.train.ckpt_every=4",
         "--config.train.eval_every=4", "--config.train.eval_batches=1",
         "--config.sample.prompt=the ", "--config.sample.max_new_tokens=0", "--no_progress"]

# (what, script, args, phrase the error line must hold, workdir kind)
# {W}: the row's workdir; {C}: a good text corpus; {D}: a folder of prepared bad files.
ROWS = [
    ("negative size", "train", ["--config.model.d_model=-8"], "model.d_model", "fresh"),
    ("wrong type", "train", ["--config.model.d_model=abc"], "d_model", "fresh"),
    ("float for int", "train", ["--config.train.steps=1.5"], "steps", "fresh"),
    ("bad bool", "train", ["--config.model.tie_embeddings=maybe"], "tie_embeddings", "fresh"),
    ("unknown key", "train", ["--config.model.nope=1"], "nope", "fresh"),
    ("heads do not divide d_model", "train", ["--config.model.d_model=33"], "divisible", "fresh"),
    ("zero learning rate", "train", ["--config.train.lr=0"], "train.lr", "fresh"),
    ("zero batch", "train", ["--config.train.batch_size=0"], "train.batch_size", "fresh"),
    ("val_fraction > 1", "train", ["--config.data.val_fraction=1.5"], "val_fraction", "fresh"),
    ("unknown dtype", "train", ["--config.model.dtype=float16"], "model.dtype", "fresh"),
    ("unknown nonfinite policy", "train", ["--config.train.nonfinite=ignore"],
     "train.nonfinite", "fresh"),
    ("synthetic corpus, char tokenizer", "train", ["--config.data.corpus=copy"],
     "data.tokenizer", "fresh"),
    ("vocab smaller than tokenizer", "train",
     ["--config.data.tokenizer=byte", "--config.model.vocab_size=100"], "vocab_size", "fresh"),
    ("sample temperature < 0", "train", ["--config.sample.temperature=-1"], "temperature",
     "fresh"),
    # Not UTF-8 ($'\xff'): the sample's prompt was a traceback after the whole run; a workdir
    # trained the whole run, then orbax could not write its checkpoint there (a traceback).
    ("sample prompt that is not UTF-8", "train", ["--config.sample.prompt=the \udcff"],
     "sample.prompt='the \\udcff': holds bytes that are not UTF-8", "fresh"),
    ("workdir that is not UTF-8", "train", [], "--workdir holds bytes that are not UTF-8",
     "not_utf8"),
    ("mesh that does not fit the devices", "train", ["--config.mesh.data=3"], "mesh.data=3",
     "fresh"),
    ("missing corpus", "train", ["--config.data.corpus={D}/missing.txt"], "no such file",
     "fresh"),
    ("empty corpus", "train", ["--config.data.corpus={D}/empty.txt"], "empty", "fresh"),
    ("binary corpus", "train", ["--config.data.corpus={D}/binary.bin"], "no UTF-8 text",
     "fresh"),
    # "holds no UTF-8 text" alone, for a text in Latin-1, did not say why or what to do
    ("Latin-1 corpus", "train", ["--config.data.corpus={D}/latin1.txt"],
     "(1 file skipped: a NUL byte or bytes that are not UTF-8 in the first 64 KB; convert",
     "fresh"),
    ("corpus shorter than a sequence", "train", ["--config.data.corpus={D}/short.txt"],
     "too few", "fresh"),
    ("missing config file", "train", ["--config={D}/missing_config.py"], "config", "fresh"),
    ("config file with a syntax error", "train", ["--config={D}/broken_config.py"], "config",
     "fresh"),
    ("unknown flag", "train", ["--bogus=1"], "bogus", "fresh"),
    ("stray argument", "train", ["stray"], "unexpected arguments", "fresh"),
    ("workdir is a file", "train", [], "is a file", "file"),
    ("workdir under a file", "train", [], "cannot write", "under_file"),
    ("checkpoint of another model", "train", ["--config.model.d_model=64"],
     "another model or tokenizer", "trained"),
    ("checkpoint of another tokenizer", "train", ["--config.data.tokenizer=byte"],
     "data.tokenizer", "trained"),
    ("changed config without --allow_change", "train", ["--config.train.lr=0.01"],
     "--allow_change=train.lr", "trained"),
    ("model change cannot be allowed", "train",
     ["--config.model.d_ff=128", "--allow_change=model.d_ff"], "cannot change", "trained"),
    ("--allow_change of no field", "train", ["--allow_change=train.nope"], "no such config field",
     "trained"),
    ("--allow_change of no field on a fresh run", "train", ["--allow_change=train.step"],
     "no such config field", "fresh"),
    ("sample: no workdir given", "sample", [], "workdir", None),
    ("sample: missing workdir", "sample", ["--workdir={W}"], "no such folder", "fresh"),
    ("mistyped field", "train", ["--config.train.step=5"], "did you mean --config.train.steps?",
     "fresh"),
    ("steps below the checkpoint's", "train",
     ["--config.train.steps=2", "--allow_change=train.steps"], "below the checkpoint", "trained"),
    ("sample: workdir without checkpoints", "sample", ["--workdir={W}"], "no checkpoints",
     "empty_dir"),
    ("sample: empty prompt", "sample", ["--workdir={W}", "--prompt="], "empty", "trained"),
    ("sample: symbol the tokenizer lacks", "sample", ["--workdir={W}", "--prompt=the €"],
     "not in this char tokenizer", "trained"),
    ("sample: temperature < 0", "sample", ["--workdir={W}", "--temperature=-1"], "temperature",
     "trained"),
    ("sample: temperature not a number", "sample", ["--workdir={W}", "--temperature=hot"],
     "temperature", "trained"),
    ("sample: top_p = 0", "sample", ["--workdir={W}", "--top_p=0"], "top_p", "trained"),
    ("sample: top_p > 1", "sample", ["--workdir={W}", "--top_p=1.5"], "top_p", "trained"),
    ("sample: top_k < 0", "sample", ["--workdir={W}", "--top_k=-1"], "top_k", "trained"),
    ("sample: no new tokens", "sample", ["--workdir={W}", "--max_new_tokens=0"],
     "max_new_tokens", "trained"),
    ("sample: zero samples", "sample", ["--workdir={W}", "--num_samples=0"], "num_samples",
     "trained"),
    # an empty --workdir trained in runs/<config> (train), or said ": no checkpoints folder"
    ("train: empty workdir", "train", [], "--workdir is empty", "flag_empty"),
    ("sample: empty workdir", "sample", ["--workdir="], "--workdir is empty", "fresh"),
    # 64 rows x 2**31 - 1 tokens: ~1.5 TiB of buffers in one call (XLA's out of memory was a
    # traceback, then an abort from decode_groups' threads); one streamed sample runs in chunks
    ("sample: buffers larger than the memory", "sample",
     ["--workdir={W}", "--num_samples=64", "--max_new_tokens=2147483647"],
     "GiB of buffers at once", "trained"),
    ("sample: no such step", "sample", ["--workdir={W}", "--step=999"], "no such checkpoint",
     "trained"),
    ("sample: empty stop", "sample", ["--workdir={W}", "--stop="], "--stop is empty", "trained"),
    # Orbax's "ERROR:absl:Failed to json parse Metadata file" lines came before the error line.
    ("sample: every checkpoint file emptied", "sample", ["--workdir={W}"],
     "no readable checkpoint", "emptied_checkpoint"),
    # $'\xed\xa0\x80' (a lone surrogate's UTF-8) and $'\xff' reach Python as surrogates that no
    # tokenizer encodes: a UnicodeEncodeError traceback for --prompt, a --stop never matched.
    ("sample: prompt that is not UTF-8", "sample",
     ["--workdir={W}", "--prompt=the \udced\udca0\udc80"],
     "--prompt holds bytes that are not UTF-8", "trained"),
    ("sample: stop that is not UTF-8", "sample", ["--workdir={W}", "--stop=\udcff"],
     "--stop holds bytes that are not UTF-8", "trained"),
    # Damaged prepared folders (damaged_folders plants them) and a damaged corpus named directly.
    ("prepared folder: manifest cut short", "train", ["--config.data.corpus={D}/p_cut_manifest"],
     "unreadable manifest.json", "fresh"),
    ("prepared folder: manifest without its splits", "train",
     ["--config.data.corpus={D}/p_no_splits"], "damaged manifest.json (its 'splits.train'",
     "fresh"),
    ("prepared folder: a shard missing", "train", ["--config.data.corpus={D}/p_no_shard"],
     "train_00000.bin", "fresh"),
    ("prepared folder: a shard cut short", "train", ["--config.data.corpus={D}/p_cut_shard"],
     "the manifest says", "fresh"),
    ("prepared folder: tokenizer.json damaged", "train",
     ["--config.data.corpus={D}/p_bad_tokenizer"], "tokenizer.json: damaged", "fresh"),
    ("resuming on a damaged prepared folder", "train",
     ["--config.data.corpus={D}/p_bad_tokenizer"], "tokenizer.json: damaged", "trained"),
    ("corpus named directly: a .gz cut short", "train", ["--config.data.corpus={D}/cut.jsonl.gz"],
     "cut.jsonl.gz: Compressed file ended", "fresh"),
]


def damaged_folders(d: Path) -> None:
    """A prepared folder of good.txt, copied with one part damaged in each copy; a cut .gz."""
    import gzip
    import json

    from transformer.data import prepare as prep
    prep.prepare([d / "good.txt"], d / "p_good", tokenizer="char")
    for name in ("p_cut_manifest", "p_no_splits", "p_no_shard", "p_cut_shard",
                 "p_bad_tokenizer"):
        shutil.copytree(d / "p_good", d / name)
    manifest = (d / "p_good" / "manifest.json").read_text()
    (d / "p_cut_manifest" / "manifest.json").write_text(manifest[: len(manifest) // 2])
    m = json.loads(manifest)
    del m["splits"]
    (d / "p_no_splits" / "manifest.json").write_text(json.dumps(m))
    (d / "p_no_shard" / "train_00000.bin").unlink()
    shard = (d / "p_good" / "train_00000.bin").read_bytes()
    (d / "p_cut_shard" / "train_00000.bin").write_bytes(shard[:-10])
    (d / "p_bad_tokenizer" / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    lines = "".join(json.dumps({"text": f"line {i}"}) + "\n" for i in range(3000)).encode()
    (d / "cut.jsonl.gz").write_bytes(gzip.compress(lines)[:-100])


def snapshot(path: Path):
    """Everything at `path`: its files' bytes, its folders; None when nothing is there."""
    if not path.exists():
        return None
    if path.is_file():
        return hashlib.sha256(path.read_bytes()).hexdigest()
    return {str(p.relative_to(path)): (hashlib.sha256(p.read_bytes()).hexdigest()
                                       if p.is_file() else "dir")
            for p in sorted(path.rglob("*"))}


def env():
    return {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3"}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("inputs")
    rng = random.Random(0)
    words = "the quick brown fox jumps over a lazy dog".split()
    (d / "good.txt").write_text("".join(" ".join(rng.choices(words, k=8)) + ".\n"
                                        for _ in range(300)))
    (d / "empty.txt").write_text("")
    (d / "binary.bin").write_bytes(bytes(range(256)) * 4)
    (d / "short.txt").write_text("too short.\n")
    (d / "latin1.txt").write_bytes("un café au lait.\n".encode("latin-1") * 50)
    (d / "broken_config.py").write_text("def get_config(:\n    return\n")
    (d / "a_file").write_text("not a folder\n")
    damaged_folders(d)
    trained = d / "trained"  # the rows' trained workdir: a fork-server child, like the rows
    out = fork_run("train.py", *MODEL, f"--config.data.corpus={d}/good.txt",
                   f"--workdir={trained}", cwd=ROOT, env=env(), timeout=300)
    assert out.returncode == 0, out.stderr
    return d


def prepare(row_index: int, kind, d: Path, tmp: Path) -> Path:
    workdir = tmp / f"row{row_index}"
    if kind == "trained":
        shutil.copytree(d / "trained", workdir)
    elif kind == "emptied_checkpoint":
        shutil.copytree(d / "trained", workdir)
        for file in (workdir / "checkpoints").rglob("*"):
            if file.is_file():
                file.write_bytes(b"")
    elif kind == "empty_dir":
        workdir.mkdir()
    elif kind == "file":
        workdir = tmp / f"row{row_index}.file"
        workdir.write_text("a file, not a folder\n")
    elif kind == "not_utf8":
        workdir = tmp / f"row{row_index}\udcff"
    elif kind == "under_file":
        (tmp / f"row{row_index}.file").write_text("a file\n")
        workdir = tmp / f"row{row_index}.file" / "run"
    return workdir


# Rows also run as real `python train.py` / `python sample.py` processes: the same status and
# stderr as through the fork server (tests/fork_server.py) show that its children behave as the real entry
# points (one of each script, early and late refusals, fresh and trained workdirs).
REAL = ("unknown flag", "missing corpus", "checkpoint of another model",
        "sample: missing workdir", "sample: symbol the tokenizer lacks",
        "prepared folder: a shard cut short")


def command(row, workdir: Path, d: Path) -> list[str]:
    _, script, args, _, _ = row
    args = [a.replace("{W}", str(workdir)).replace("{D}", str(d)) for a in args]
    if script == "train":
        own_corpus = any(a.startswith("--config.data.corpus=") for a in args)
        corpus = [] if own_corpus else [f"--config.data.corpus={d}/good.txt"]
        where = "" if row[4] == "flag_empty" else workdir
        return ["train.py", *MODEL, *corpus, *args, f"--workdir={where}"]
    return ["sample.py", *args]


def test_bad_inputs_are_refused_in_one_line_and_change_nothing(files, tmp_path):
    assert len(ROWS) >= 25 and set(REAL) <= {row[0] for row in ROWS}
    problems = run_rows(range(len(ROWS)), files, tmp_path)
    assert not problems, "\n".join(problems)


@pytest.mark.slow  # ~8 s of CPU; test_fork_server.py checks the same of other commands
def test_the_real_processes_refuse_as_the_forked_ones_do(files, tmp_path):
    problems = run_rows([i for i, row in enumerate(ROWS) if row[0] in REAL], files, tmp_path,
                        real=True)
    assert not problems, "\n".join(problems)


def run_rows(indices, files, tmp_path, real=False) -> list[str]:
    """ROWS[i] for i in `indices`, each in a workdir of its own, through the fork server, four
    at a time; with `real`, then also as a real process in the same workdir, which must give
    the same status and stderr. What went wrong, a line per problem."""
    indices = list(indices)
    workdirs = {i: prepare(i, ROWS[i][4], files, tmp_path) for i in indices}
    before = {i: snapshot(workdirs[i]) for i in indices}
    commands = {i: command(ROWS[i], workdirs[i], files) for i in indices}
    with ThreadPoolExecutor(max_workers=4) as pool:
        forked = dict(zip(indices, pool.map(
            lambda i: fork_run(*commands[i], cwd=ROOT, env=env(), timeout=300), indices)))
    real_runs = {}
    if real:
        with ThreadPoolExecutor(max_workers=4) as pool:
            real_runs = dict(zip(indices, pool.map(
                lambda i: subprocess.run([sys.executable, *commands[i]], cwd=ROOT, env=env(),
                                         capture_output=True, text=True, timeout=300),
                indices)))
    problems = []
    for i in indices:
        what, _, _, phrase, kind = ROWS[i]
        after = snapshot(workdirs[i]) if kind else None
        runs = [(forked[i].returncode, forked[i].stderr)]
        if i in real_runs:
            runs.append((real_runs[i].returncode, real_runs[i].stderr))
            if runs[0] != runs[1]:
                problems.append(f"{what}: forked {runs[0]!r} but the real process {runs[1]!r}")
        for returncode, stderr in runs:
            lines = stderr.strip().splitlines()
            ok = (returncode != 0 and len(lines) == 1 and lines[0].startswith("error: ")
                  and phrase in lines[0] and "Traceback" not in stderr
                  and (before[i] == after or not kind))
            if not ok:
                problems.append(f"{what}: exit {returncode}, stderr {stderr!r}, "
                                f"workdir {'unchanged' if before[i] == after else 'CHANGED'}")
    return problems
