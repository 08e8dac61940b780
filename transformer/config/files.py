"""Config files by path: configs/ is a folder of data, not a package, so a config built on
another one (a scaling sweep on the quick start's recipe) loads it here, by its file.

    from transformer.config.files import quick_start
    base = quick_start()        # configs/default.py's get_config()
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def load(path) -> object:
    """The get_config() of the config file at `path` (relative paths from configs/)."""
    path = Path(path)
    path = path if path.is_absolute() else CONFIGS / path
    spec = importlib.util.spec_from_file_location(f"_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def quick_start():
    """configs/default.py's config: the quick start's block, optimizer and rates."""
    return load("default.py")
