"""Progress bars: tqdm on stderr, silent when stderr is not a TTY or when quiet mode is on."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")
_QUIET = False


def set_quiet(quiet: bool) -> None:
    """Silence (or re-enable) every progress bar of the package."""
    global _QUIET
    _QUIET = bool(quiet)


def progress(iterable: Iterable[T], *, desc: str = "", total: int | None = None, leave: bool = False) -> Iterator[T]:
    """Wrap ``iterable`` in a tqdm bar written to stderr."""
    disable = _QUIET or not sys.stderr.isatty()
    return iter(tqdm(iterable, desc=desc, total=total, leave=leave, file=sys.stderr, disable=disable, dynamic_ncols=True))
