"""The ESM-2 alphabet (33 tokens, in ESM-2's order) so that real ESM-2 / DPLM checkpoints load unchanged.

Special ids: ``<cls>`` 0, ``<pad>`` 1, ``<eos>`` 2, ``<unk>`` 3, ``<mask>`` 32. A protein of length L is encoded
as ``[<cls>] + residues + [<eos>]`` (L + 2 tokens).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from icml24.common import validate as v

VOCAB: tuple[str, ...] = (
    "<cls>", "<pad>", "<eos>", "<unk>",
    "L", "A", "G", "V", "S", "E", "R", "T", "I", "D", "P", "K", "Q", "N", "F", "Y", "M", "H", "W", "C",
    "X", "B", "U", "Z", "O", ".", "-", "<null_1>", "<mask>",
)
CLS, PAD, EOS, UNK, MASK = 0, 1, 2, 3, 32
AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"
TOKEN_ID = {t: i for i, t in enumerate(VOCAB)}
AA_IDS = torch.tensor([TOKEN_ID[a] for a in AMINO_ACIDS])
SPECIAL_IDS = (CLS, PAD, EOS)
# Tokens the official decoder never emits (it sets their logits to -inf): <mask>, X, <pad>, <cls>, <eos>.
OFFICIAL_NEVER_SAMPLED = (MASK, VOCAB.index("X"), PAD, CLS, EOS)
# NOTE(deviation): this package's sampler bans by default every id outside the 20 amino acids (13 ids: the
# official 5 plus <unk>, B, U, Z, O, '.', '-', <null_1>), since its oracles are defined over residues only.
NEVER_SAMPLED = tuple(i for i, t in enumerate(VOCAB) if t not in AMINO_ACIDS)


def validate_sequence(owner: str, seq: str, *, max_length: int | None = None) -> str:
    """A protein string over the 20 standard amino acids (upper case); names the first bad position."""
    if not isinstance(seq, str):
        raise v.ArgumentTypeError(f"{owner}: a sequence must be a str, got {type(seq).__name__}")
    if len(seq) < 1:
        raise ValueError(f"{owner}: a sequence must have length >= 1, got an empty string")
    if max_length is not None and len(seq) > max_length:
        raise ValueError(f"{owner}: sequence length {len(seq)} exceeds the model's maximum {max_length}")
    for i, ch in enumerate(seq):
        if ch not in AMINO_ACIDS:
            raise ValueError(f"{owner}: character {ch!r} at position {i} is not one of the 20 amino acids "
                             f"{AMINO_ACIDS}")
    return seq


def encode(seqs: Sequence[str], *, owner: str = "dplm", max_length: int | None = None) -> torch.Tensor:
    """Encode equal-length or ragged proteins as ``[<cls>] seq [<eos>]``, right-padded with ``<pad>``; (B, Lmax+2)."""
    if isinstance(seqs, str):
        seqs = [seqs]
    seqs = [validate_sequence(owner, s, max_length=max_length) for s in seqs]
    width = max(len(s) for s in seqs) + 2
    out = torch.full((len(seqs), width), PAD, dtype=torch.long)
    for b, s in enumerate(seqs):
        out[b, 0] = CLS
        out[b, 1:len(s) + 1] = torch.tensor([TOKEN_ID[a] for a in s])
        out[b, len(s) + 1] = EOS
    return out


def decode(tokens: torch.Tensor) -> list[str]:
    """Residue strings of a (B, L) token batch: specials dropped, anything else non-residue shown as its token."""
    out = []
    for row in tokens.tolist():
        out.append("".join(VOCAB[t] for t in row if t not in SPECIAL_IDS))
    return out


def residue_ids_to_tokens(residues: torch.Tensor) -> torch.Tensor:
    """Map indices into ``AMINO_ACIDS`` (0..19), shape (B, L), to token ids with ``<cls>``/``<eos>`` added."""
    body = AA_IDS.to(residues.device)[residues]
    b = residues.shape[0]
    cls = torch.full((b, 1), CLS, dtype=torch.long, device=residues.device)
    eos = torch.full((b, 1), EOS, dtype=torch.long, device=residues.device)
    return torch.cat([cls, body, eos], dim=1)


def tokens_to_residue_ids(tokens: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`residue_ids_to_tokens` for fixed-length batches; non-residue tokens map to -1."""
    lut = torch.full((len(VOCAB),), -1, dtype=torch.long, device=tokens.device)
    lut[AA_IDS.to(tokens.device)] = torch.arange(20, device=tokens.device)
    return lut[tokens[:, 1:-1]]
