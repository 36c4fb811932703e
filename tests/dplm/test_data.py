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


@pytest.mark.parametrize("name, loader", [("AMPvsUniProt", "load_AMPvsUniProt"), ("AMPvsTMset", "load_AMPvsTM")])
def test_peptide_loader_matches_modlamps_own_loader(name, loader):
    """The CSV reader returns modlamp's sequences and targets (1 = AMP, the second target name)."""
    datasets = pytest.importorskip("modlamp.datasets")
    ref = getattr(datasets, loader)()
    seqs, y = peptides(name)
    assert seqs == list(ref.sequences) and y.tolist() == list(ref.target) and ref.target_names[1] == "AMP"


def test_antimicrobial_label_marks_cationic_peptides():
    """AMPs are cationic: net charge per residue (K + R − D − E) / L well above the transmembrane class's."""
    seqs, y = peptides("AMPvsTMset")
    charge = np.array([(sum(s.count(c) for c in "KR") - sum(s.count(c) for c in "DE")) / len(s) for s in seqs])
    assert charge[y == 1].mean() > charge[y == 0].mean() + 0.05


def test_peptide_split_is_disjoint_stratified_cropped_and_seeded():
    from icml24.dplm.data import peptide_split

    sp = peptide_split("AMPvsUniProt", seed=0, max_length=64)
    sets = {k: set(s) for k, (s, _) in sp.items()}
    assert not (sets["train"] & sets["test"]) and not (sets["train"] & sets["val"]) and not (sets["val"] & sets["test"])
    n = sum(len(s) for s in sets.values())
    assert abs(len(sets["train"]) / n - 0.6) < 0.01 and abs(len(sets["test"]) / n - 0.2) < 0.01
    assert all(len(p) <= 64 for seqs, _ in sp.values() for p in seqs)
    assert abs(sp["train"][1].mean() - sp["test"][1].mean()) < 0.01
    assert peptide_split("AMPvsUniProt", seed=0, max_length=64)["test"][0] == sp["test"][0]
    assert peptide_split("AMPvsUniProt", seed=1, max_length=64)["test"][0] != sp["test"][0]
    with pytest.raises(ValueError, match="fractions"):
        peptide_split("AMPvsTMset", seed=0, max_length=64, fractions=(0.9, 0.2))


def test_real_proteins_and_their_windows():
    from icml24.dplm.data import protein_windows, real_proteins

    prots = real_proteins()
    assert len(prots) == 2100 and not any("*" in p for p in prots)
    assert sum(map(len, prots)) == pytest.approx(682_583 - 2100, abs=2100)  # stop codons stripped
    w = protein_windows(prots[:50], 64)
    assert w and all(len(x) == 64 and set(x) <= set(AMINO_ACIDS) for x in w)
    assert len(w) <= sum(len(p) // 64 for p in prots[:50])
