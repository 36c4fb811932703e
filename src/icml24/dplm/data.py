"""Real protein data that ships inside PyPI packages (extra ``bio``; notes §5.1), and the HMM oracle.

* ``pyhmmer``'s test data: Pfam profile HMMs (PF02826, the NAD-binding domain of 2-hydroxyacid dehydrogenases,
  with a DSSP consensus-structure line) from which family members are emitted, and ``hmmsearch`` as the
  plausibility oracle (fraction of sequences hitting the family at E < 1e-5).
* ``modlamp``'s labelled peptide sets (antimicrobial vs transmembrane/random/UniProt peptides).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from icml24.common import validate as v
from icml24.dplm.tokens import AMINO_ACIDS

OWNER = "dplm.data"
PEPTIDE_SETS = ("AMPvsTMset", "AMPvsUniProt", "ACP_CancPPD_vs_Random", "ACP_CancPPD_vs_TM")
_DSSP_3 = {"H": 0, "G": 0, "I": 0, "E": 1, "B": 1}  # else coil (2), the SS_CLASSES order H, E, C


def _pyhmmer():
    try:
        import pyhmmer
    except ImportError as e:
        raise ImportError("this part of icml24.dplm needs pyhmmer: pip install 'icml24[bio]'") from e
    return pyhmmer


def pfam_hmm(name: str = "PF02826"):
    """A profile HMM shipped with pyhmmer's test data (``PF02826``, ``Thioesterase``, ``KR``, ``LuxC``...)."""
    pyhmmer = _pyhmmer()
    folder = Path(pyhmmer.__file__).parent / "tests" / "data" / "hmms" / "txt"
    path = folder / f"{name}.hmm"
    if not path.exists():
        names = sorted(p.stem for p in folder.glob("*.hmm"))
        raise ValueError(f"{OWNER}: no HMM named {name!r} in pyhmmer's data; available: {', '.join(names)}")
    with pyhmmer.plan7.HMMFile(str(path)) as f:
        return f.read()


def emit_family(hmm, n: int, *, seed: int, max_length: int) -> tuple[list[str], list[np.ndarray]]:
    """Emit ``n`` family members of at most ``max_length`` residues with per-residue 3-state structure labels.

    Labels come from the HMM's consensus structure (DSSP letters of the match state each residue is emitted
    by: H/G/I → helix, E/B → strand, else coil); insert residues are coil.
    """
    pyhmmer = _pyhmmer()
    v.integer(OWNER, "n", n, minimum=1)
    v.integer(OWNER, "max_length", max_length, minimum=1)
    cs = hmm.consensus_structure
    if cs is None:
        raise ValueError(f"{OWNER}: HMM {hmm.name!r} has no consensus-structure line")
    rng = pyhmmer.easel.Randomness(seed + 1)  # Easel reads seed 0 as "seed from the clock"
    seqs: list[str] = []
    labels: list[np.ndarray] = []
    while len(seqs) < n:
        msa = hmm.emit_alignment(min(256, 2 * (n - len(seqs))), rng).textize()
        match_cols = [c == "x" for c in msa.reference]
        for row in msa.alignment:
            res, lab, state = [], [], 0
            for col, ch in enumerate(row):
                if match_cols[col]:
                    state += 1
                if ch in "-.":
                    continue
                res.append(ch.upper())
                lab.append(_DSSP_3.get(cs[state - 1], 2) if match_cols[col] and state else 2)
            s = "".join(res)
            if 0 < len(s) <= max_length and all(c in AMINO_ACIDS for c in s) and len(seqs) < n:
                seqs.append(s)
                labels.append(np.array(lab))
    return seqs, labels


def hmm_hits(hmm, seqs: list[str], *, evalue: float = 1e-5) -> tuple[np.ndarray, np.ndarray]:
    """Per sequence: hit (E < ``evalue`` against the family HMM) and bit score (−inf when not reported)."""
    pyhmmer = _pyhmmer()
    v.positive(OWNER, "evalue", evalue)
    alphabet = pyhmmer.easel.Alphabet.amino()
    digital = [pyhmmer.easel.TextSequence(name=f"s{i}".encode(), sequence=s).digitize(alphabet)
               for i, s in enumerate(seqs)]
    block = pyhmmer.easel.DigitalSequenceBlock(alphabet, digital)
    hits = np.zeros(len(seqs), dtype=bool)
    bits = np.full(len(seqs), -np.inf)
    for top in pyhmmer.hmmer.hmmsearch([hmm], block, E=1e3, cpus=1):
        for hit in top:
            name = hit.name.decode() if isinstance(hit.name, bytes) else hit.name
            i = int(name[1:])
            bits[i] = hit.score
            hits[i] = hit.evalue < evalue
    return hits, bits


def peptides(name: str = "AMPvsTMset") -> tuple[list[str], np.ndarray]:
    """A modlamp peptide set: sequences and binary labels (1 = antimicrobial / anticancer)."""
    v.one_of(OWNER, "name", name, PEPTIDE_SETS)
    try:
        import modlamp
    except ImportError as e:
        raise ImportError("the peptide sets need modlamp: pip install 'icml24[bio]'") from e
    path = Path(modlamp.__file__).parent / "data" / f"{name}.csv"
    with open(path, newline="") as f:
        rows = list(csv.reader(f))[1:]
    seqs, labels = [], []
    for row in rows:
        s = row[0].strip().upper()
        if s and all(c in AMINO_ACIDS for c in s):
            seqs.append(s)
            labels.append(int(row[1]))
    return seqs, np.array(labels)


def peptide_split(name: str = "AMPvsUniProt", *, seed: int, max_length: int,
                  fractions: tuple[float, float] = (0.6, 0.2)
                  ) -> dict[str, tuple[list[str], np.ndarray]]:
    """A modlamp peptide set split into train / val / test (stratified by label, shuffled with ``seed``).

    Peptides longer than ``max_length`` are cropped to their first ``max_length`` residues
    (NOTE(deviation): AMPvsUniProt has 3% of its 5,200 peptides above 64 residues; the model's maximum length).
    Duplicate peptides are kept once (AMPvsUniProt lists 5,200 rows but 4,642 distinct sequences).

    Returns:
        ``{"train": (seqs, labels), "val": ..., "test": ...}`` with ``fractions`` of each class in train and val.
    """
    v.integer(OWNER, "max_length", max_length, minimum=1)
    f_train, f_val = fractions
    if not (0 < f_train and 0 < f_val and f_train + f_val < 1):
        raise ValueError(f"{OWNER}: fractions must be two positive numbers summing to < 1, got {fractions!r}")
    raw, raw_labels = peptides(name)
    by_seq: dict[str, set[int]] = {}
    for s, y in zip(raw, raw_labels, strict=False):
        by_seq.setdefault(s[:max_length], set()).add(int(y))
    # duplicates would leak between the splits: keep each (cropped) peptide once, drop those with both labels
    seqs = [s for s, ys in by_seq.items() if len(ys) == 1]
    labels = np.array([next(iter(by_seq[s])) for s in seqs])
    rng = np.random.default_rng(seed)
    parts: dict[str, list[int]] = {"train": [], "val": [], "test": []}
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        a, b = int(round(f_train * len(idx))), int(round((f_train + f_val) * len(idx)))
        parts["train"] += idx[:a].tolist()
        parts["val"] += idx[a:b].tolist()
        parts["test"] += idx[b:].tolist()
    out = {}
    for k, idx in parts.items():
        idx = rng.permutation(idx)
        out[k] = ([seqs[i] for i in idx], labels[idx])
    return out


def real_proteins() -> list[str]:
    """The 2,100 real bacterial proteins shipped with pyhmmer's test data (``938293.PRJEB85.HG003687.faa``;
    682,583 residues), in file order, stop codons (``*``) stripped."""
    pyhmmer = _pyhmmer()
    path = Path(pyhmmer.__file__).parent / "tests" / "data" / "seqs" / "938293.PRJEB85.HG003687.faa"
    seqs, cur = [], []
    for line in path.read_text().splitlines():
        if line.startswith(">"):
            if cur:
                seqs.append("".join(cur).rstrip("*"))
            cur = []
        else:
            cur.append(line.strip().upper())
    if cur:
        seqs.append("".join(cur).rstrip("*"))
    return seqs


def protein_windows(seqs: list[str], length: int) -> list[str]:
    """Non-overlapping windows of exactly ``length`` residues of each protein (windows with a non-standard
    residue are dropped; a protein's tail shorter than ``length`` is dropped)."""
    v.integer(OWNER, "length", length, minimum=1)
    out = []
    for s in seqs:
        for i in range(0, len(s) - length + 1, length):
            w = s[i:i + length]
            if all(c in AMINO_ACIDS for c in w):
                out.append(w)
    return out
