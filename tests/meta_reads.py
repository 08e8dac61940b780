"""Runs a command-line script with every checkpoint meta read counted:

    python tests/meta_reads.py train.py --config=configs/tiny.py ...

as `python train.py ...` would, then says on its last stderr line how many metas it read
(tests/test_cli.py: a fresh train.py run samples at its end with nothing read back)."""

import runpy
import sys

from transformer import checkpoint

reads = []
_read_meta = checkpoint.Checkpoints.read_meta


def _counted(self, step=None):
    reads.append(step)
    return _read_meta(self, step)


checkpoint.Checkpoints.read_meta = _counted
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    print(f"checkpoint metas read: {len(reads)}", file=sys.stderr, flush=True)
