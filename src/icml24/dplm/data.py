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
