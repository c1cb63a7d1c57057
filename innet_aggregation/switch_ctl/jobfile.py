"""Reading a job file: a one-switch job (``config.parse``) or, if it has [switches],
a tree (``tree.parse_tree``). Apart from config.py, so that config.py, which
tree.py builds on, imports neither."""

from __future__ import annotations

import tomllib
from pathlib import Path

from .config import Config, ConfigError, parse
from .tree import Tree, parse_tree


def load(path: Path | str, pool_size: int | None = None) -> Config | Tree:
    """A one-switch job (Config) or, if the file has [switches], a tree (Tree)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ConfigError([f"{path}: no such file"]) from None
    return load_text(text, pool_size, str(path), Path(path).resolve().parent)


def load_text(text: str, pool_size: int | None = None, where: str = "configuration",
              base: Path | None = None) -> Config | Tree:
    """``base``: the directory relative TLS paths start from (None: the current one)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{where}: not valid TOML: {exc}"]) from None
    if "switches" in raw:
        return parse_tree(raw, pool_size, base)
    return parse(raw, pool_size, base)
