"""The real-data tier: Pfam family emission with structure labels, the hmmsearch oracle, the peptide sets."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("pyhmmer", reason="the bio extra (pyhmmer) is not installed")

from icml24.dplm.data import emit_family, hmm_hits, peptides, pfam_hmm  # noqa: E402
from icml24.dplm.tokens import AMINO_ACIDS  # noqa: E402


@pytest.fixture(scope="module")
def family():
    hmm = pfam_hmm("PF02826")
    return hmm, emit_family(hmm, 60, seed=0, max_length=220)


def test_emitted_members_have_labels_and_hit_their_family(family):
    hmm, (seqs, labels) = family
    assert len(seqs) == 60 and all(len(s) == len(l) <= 220 for s, l in zip(seqs, labels))
    assert all(set(s) <= set(AMINO_ACIDS) for s in seqs)
    lab = np.concatenate(labels)
    assert set(np.unique(lab)) == {0, 1, 2}  # PF02826's consensus has helices, strands and coil
    hits, bits = hmm_hits(hmm, seqs)
    assert hits.mean() >= 0.9 and np.median(bits) > 25.1  # above the family's gathering cutoff


def test_oracle_rejects_shuffled_and_random_sequences(family):
    hmm, (seqs, _) = family
    rng = np.random.default_rng(0)
    shuffled = ["".join(rng.permutation(list(s))) for s in seqs]
    uniform = ["".join(rng.choice(list(AMINO_ACIDS), 180)) for _ in range(30)]
    assert hmm_hits(hmm, shuffled)[0].mean() <= 0.1 and not hmm_hits(hmm, uniform)[0].any()


def test_emission_is_seeded(family):
    hmm, (seqs, _) = family
    assert emit_family(hmm, 60, seed=0, max_length=220)[0] == seqs
    assert emit_family(hmm, 60, seed=1, max_length=220)[0] != seqs


def test_peptide_sets_and_bad_names():
    seqs, y = peptides("AMPvsTMset")
    assert len(seqs) == len(y) > 300 and set(np.unique(y)) == {0, 1} and abs(y.mean() - 0.5) < 0.05
    with pytest.raises(ValueError, match="AMPvsTMset"):
        peptides("nope")
    with pytest.raises(ValueError, match="available"):
        pfam_hmm("PF99999")
