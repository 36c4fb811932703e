"""Offline byte-level data: Python standard-library sources and docs split by file, and a synthetic passkey task."""

from __future__ import annotations

import hashlib
import pathlib
import sysconfig

import torch

from icml24.common import validate as v
from icml24.lococo.compressor import OWNER

SPLITS = ("train", "val", "test")
_FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ")
_NEEDLE = "The pass key is {k}. Remember it. {k} is the pass key. "
_QUESTION = "What is the pass key? The pass key is {k}"
KEY_DIGITS = 5


def _split_of(name: str, val_fraction: float, test_fraction: float) -> str:
    u = int(hashlib.sha1(name.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "test" if u < test_fraction else "val" if u < test_fraction + val_fraction else "train"


def stdlib_documents(*, min_bytes: int = 512, max_bytes_per_split: int = 4_000_000, val_fraction: float = 0.1,
                     test_fraction: float = 0.1) -> dict[str, list[bytes]]:
    """Byte strings of the stdlib's ``*.py`` files and ``pydoc_data.topics``, split by a hash of the file name.

    Args:
        min_bytes: documents shorter than this are dropped.
        max_bytes_per_split: stop adding documents to a split past this many bytes (files in sorted order).
    Returns:
        ``{"train": [...], "val": [...], "test": [...]}``; the split of a document depends only on its name.
    """
    v.integer(OWNER, "min_bytes", min_bytes, minimum=1)
    v.integer(OWNER, "max_bytes_per_split", max_bytes_per_split, minimum=1)
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    items: list[tuple[str, bytes]] = []
    for f in sorted(list(root.glob("*.py")) + list(root.glob("*/*.py"))):
        if "test" in f.parts[-2:-1] or f.name.startswith("test_"):
            continue
        items.append((str(f.relative_to(root)), f.read_bytes()))
    from pydoc_data.topics import topics

    items += [(f"pydoc_data/{k}", t.encode("utf-8")) for k, t in sorted(topics.items())]
    out: dict[str, list[bytes]] = {s: [] for s in SPLITS}
    size = dict.fromkeys(SPLITS, 0)
    for name, data in items:
        s = _split_of(name, val_fraction, test_fraction)
        if len(data) >= min_bytes and size[s] < max_bytes_per_split:
            out[s].append(data)
            size[s] += len(data)
    return out


def sample_windows(docs: list[bytes], *, n: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """``n`` random byte windows of ``length`` tokens, each inside one document: LongTensor [n, length]."""
    n = v.integer(OWNER, "n", n, minimum=1)
    length = v.integer(OWNER, "length", length, minimum=2)
    long_docs = [d for d in docs if len(d) >= length]
    if not long_docs:
        raise ValueError(f"{OWNER}: no document has {length} bytes")
    w = torch.tensor([len(d) - length + 1 for d in long_docs], dtype=torch.float64)
    pick = torch.multinomial(w, n, replacement=True, generator=generator)
    rows = []
    for i in pick.tolist():
        d = long_docs[i]
        s = int(torch.randint(len(d) - length + 1, (1,), generator=generator))
        rows.append(torch.frombuffer(bytearray(d[s:s + length]), dtype=torch.uint8).long())
    return torch.stack(rows)


def passkey_batch(*, n: int, length: int, distance: int | None, generator: torch.Generator,
                  digits: int = KEY_DIGITS) -> tuple[torch.Tensor, int]:
    """Passkey recall: filler, a needle "The pass key is 12345 ...", filler, then the question and the answer.

    Args:
        distance: bytes from the needle's first key digit to the answer's first digit (None: random per row).
    Returns:
        (ids [n, length], answer_start): the answer's ``digits`` digits occupy ``ids[:, answer_start:]``.
    """
    n = v.integer(OWNER, "n", n, minimum=1)
    nd = v.integer(OWNER, "digits", digits, minimum=1, maximum=16)
    q_len = len(_QUESTION.format(k="0" * nd))
    ndl = len(_NEEDLE.format(k="0" * nd))
    key_off = _NEEDLE.index("{k}")
    lo, hi = ndl - key_off + q_len - nd, length - key_off - nd
    if distance is not None:
        v.integer(OWNER, "distance", distance, minimum=lo, maximum=hi)
    filler = _FILLER * (length // len(_FILLER) + 2)
    rows = []
    for _ in range(n):
        key = "".join(str(int(d)) for d in torch.randint(10, (nd,), generator=generator))
        d = distance if distance is not None else int(torch.randint(lo, hi + 1, (1,), generator=generator))
        # answer starts at length - 5; key at (answer - d); needle starts key_off earlier
        needle_at = length - nd - d - key_off
        gap = length - q_len - needle_at - ndl
        off = int(torch.randint(len(_FILLER), (1,), generator=generator))
        text = filler[off:off + needle_at] + _NEEDLE.format(k=key) + filler[off:off + gap] + _QUESTION.format(k=key)
        assert len(text) == length
        rows.append(torch.tensor(list(text.encode("ascii"))))
    return torch.stack(rows), length - nd


def repeat_batch(*, n: int, length: int, generator: torch.Generator, prefix: int = 0,
                 prefix_byte: int = 32) -> torch.Tensor:
    """Random printable bytes copied once at a fixed offset (the copy task): LongTensor [n, length].

    A row is ``prefix`` copies of ``prefix_byte`` (spaces) that are never copied, then L = ⌈(length − prefix)/2⌉
    random printable bytes y, then y again (cut to ``length``): token t of the copy equals token t − L. A prefix of
    at least M tokens keeps the copy's source out of reach of any cache that holds the first M tokens
    (StreamingLLM's sinks). A constant prefix (rather than random bytes) keeps the task learnable by a
    fixed-offset head: the one token it would copy wrongly is the filler byte itself.
    """
    n = v.integer(OWNER, "n", n, minimum=1)
    length = v.integer(OWNER, "length", length, minimum=2)
    prefix = v.integer(OWNER, "prefix", prefix, minimum=0, maximum=length - 2)
    prefix_byte = v.integer(OWNER, "prefix_byte", prefix_byte, minimum=0, maximum=255)
    half = (length - prefix + 1) // 2
    x = torch.randint(32, 127, (n, half), generator=generator)
    return torch.cat([torch.full((n, prefix), prefix_byte, dtype=x.dtype), x, x], 1)[:, :length]


def copied_half_mask(length: int, *, prefix: int = 0, skip: int = 1) -> torch.Tensor:
    """Which next-token targets of a :func:`repeat_batch` row are scored as the copied half: BoolTensor [T−1].

    Position i of a chunked NLL (``chunked_nll``) predicts token i + 1. A row of T tokens copies its L =
    ⌈(T − P)/2⌉ tokens after the prefix P at offset L, so token P + L + j equals token P + j. The copied half is the
    targets t ∈ [P + L + skip, T), i.e. NLL positions i ∈ [P + L + skip − 1, T − 1), each at distance L from its
    source P + (t − P − L). ``skip`` ≥ 1 leaves out the first copy (token P + L: nothing in the context marks where
    the copy starts); a larger ``skip`` also leaves out the copies whose sources are the first P + skip tokens (the
    ones a cache of StreamingLLM sinks keeps).
    """
    T = v.integer(OWNER, "length", length, minimum=3)
    P = v.integer(OWNER, "prefix", prefix, minimum=0, maximum=T - 3)
    L = (T - P + 1) // 2
    skip = v.integer(OWNER, "skip", skip, minimum=1, maximum=T - P - L)
    mask = torch.zeros(T - 1, dtype=torch.bool)
    mask[P + L + skip - 1:] = True
    return mask


def copy_loss(nll: torch.Tensor, *, prefix: int = 0, skip: int = 1) -> torch.Tensor:
    """Per-row mean NLL over the copied half (:func:`copied_half_mask`) of ``nll`` ∈ R^{b×(T−1)}: R^b."""
    v.tensor(OWNER, "nll", nll, ndim=2)
    return nll[:, copied_half_mask(nll.shape[1] + 1, prefix=prefix, skip=skip)].mean(1)


def packed_passkey_rows(*, n: int, length: int, generator: torch.Generator, digits: int = KEY_DIGITS,
                        min_piece: int = 96) -> torch.Tensor:
    """Training rows of ``length`` bytes packed with passkey samples of random lengths in [min_piece, length].

    Short pieces give the retrieval head a strong gradient early (a curriculum inside every row); each piece has
    its own key, so the rule learned is "the key of the latest needle".
    """
    n = v.integer(OWNER, "n", n, minimum=1)
    rows = []
    for _ in range(n):
        parts, left = [], length
        while left > 0:
            if left < 2 * min_piece:
                piece = left
            else:
                piece = int(torch.randint(min_piece, left - min_piece + 1, (1,), generator=generator))
            parts.append(passkey_batch(n=1, length=piece, distance=None, generator=generator, digits=digits)[0][0])
            left -= piece
        rows.append(torch.cat(parts))
    return torch.stack(rows)
