"""Representations: pooled features, frozen probes, fine-tuning shapes and behaviour, the lr tuning checks
(tune_grid cells, their guards), and the peptide loader's labels and splits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from icml24.common.results import paired_check
from icml24.common.tuning import tune_grid
from icml24.dplm import build_esm, encode
from icml24.dplm.experiment import Config, composition, tuning_checks
from icml24.dplm.represent import (
    FineTuned,
    fine_tune,
    fine_tuned_accuracy,
    linear_probe_accuracy,
    pooled_features,
    residue_mask,
)


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(0)
    return build_esm(hidden=16, layers=1, heads=2, max_length=40).eval()


def _toy(n: int, length: int, seed: int) -> tuple[list[str], np.ndarray]:
    """Sequence label = 1 when the peptide is made of K/R, 0 when of D/E (a task any encoder can learn)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    seqs = ["".join(rng.choice(list("KR" if c else "DE"), length)) for c in y]
    return seqs, y


def test_pooled_features_average_residues_only(net):
    t = encode(["MKTAYW", "GS"])
    f = pooled_features(net, t)
    assert f.shape == (2, 16)
    alone = pooled_features(net, encode(["GS"]))  # no padding in its own batch
    torch.testing.assert_close(f[1], alone[0], atol=1e-5, rtol=1e-4)
    assert residue_mask(t).sum(1).tolist() == [6, 2]


def test_fine_tuned_output_shapes(net):
    t = encode(["MKTAYW", "GSGSGS", "WWWWWW"])
    res = FineTuned(net, n_classes=3, task="residue")
    seq = FineTuned(net, n_classes=2, task="sequence")
    assert res(t).shape == (3, 6, 3) and seq(t).shape == (3, 2)


def test_fine_tune_learns_and_leaves_the_pretrained_net_untouched(net):
    seqs, y = _toy(96, 8, 0)
    before = [p.detach().clone() for p in net.parameters()]
    model = fine_tune(net, encode(seqs), torch.as_tensor(y), task="sequence", n_classes=2, lr=3e-3, steps=40,
                      batch_size=16, generator=torch.Generator().manual_seed(0))
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
    s_te, y_te = _toy(64, 8, 1)
    assert fine_tuned_accuracy(model, encode(s_te), torch.as_tensor(y_te)) >= 90.0
    # per-residue labels with −1 ignored: residue class = (residue is K or R)
    t = encode(seqs)
    lab = torch.as_tensor(np.array([[int(c in "KR") for c in s] for s in seqs]))
    lab[:, -1] = -1
    m = fine_tune(net, t, lab, task="residue", n_classes=2, lr=3e-3, steps=40, batch_size=16,
                  generator=torch.Generator().manual_seed(0))
    assert m(t).shape == (96, 8, 2) and fine_tuned_accuracy(m, t, lab) >= 90.0


@pytest.mark.parametrize("kw, msg", [(dict(labels=torch.zeros(3, dtype=torch.long)), "shape"),
                                     (dict(lr=0.0), "lr"), (dict(steps=0), "steps"), (dict(task="x"), "task")])
def test_fine_tune_bad_input(net, kw, msg):
    args = dict(tokens=encode(["MKT", "GSG"]), labels=torch.zeros(2, dtype=torch.long), task="sequence",
                n_classes=2, lr=1e-3, steps=2)
    args.update(kw)
    with pytest.raises(ValueError, match=msg):
        fine_tune(net, **args)


def test_linear_probe_separates_separable_features_and_checks_lengths():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 200)
    f = rng.normal(size=(200, 4)) + 3 * y[:, None]
    assert linear_probe_accuracy(f[:100], y[:100], f[100:], y[100:]) >= 95.0
    with pytest.raises(ValueError, match="same length"):
        linear_probe_accuracy(f[:100], y[:99], f[100:], y[100:])


def test_composition_is_a_distribution_over_the_20_amino_acids():
    c = composition(encode(["AAW", "ACDEFGHIKLMNPQRSTVWY"]))
    assert c.shape == (2, 20)
    np.testing.assert_allclose(c.sum(1), 1.0)
    assert c[0].max() == pytest.approx(2 / 3)


def _cell(best: float, max_extra: int = 0):
    """A tuned lr cell on the grid {1e-3, 2e-3, 4e-3} whose validation loss is smallest at ``best``."""
    return tune_grid(lambda lrs: [[abs(np.log(lr / best))] for lr in lrs], (1e-3, 2e-3, 4e-3), maximize=False,
                     max_extra=max_extra)


def _claim(name: str, metric: str, baseline: str = "mlm"):
    return paired_check(name=name, metric=metric, method=[1.0, 2.0, 3.0], baseline=[0.0, 1.0, 1.5],
                        direction=">=", method_arm="dplm", baseline_arm=baseline)


def test_tuning_checks_count_cells_inside_and_extend_past_a_winning_edge():
    cfg = Config(interior_min_fraction=0.5)
    claims = [_claim("gen", "loglik"), _claim("ft", "ss_ft", "ar")]
    ok, = tuning_checks(cfg, claims, {"dplm": _cell(2e-3), "mlm": _cell(2e-3), "ar": _cell(4e-3)}, None)
    assert ok.kind == "sanity" and ok.passed and ok.measured == pytest.approx(2 / 3) and "['ar']" in ok.detail
    assert ok.detail.startswith("tuning:")
    edge, = tuning_checks(cfg, claims, {"dplm": _cell(4e-3), "mlm": _cell(4e-3), "ar": _cell(2e-3)}, None)
    assert not edge.passed and edge.measured == pytest.approx(1 / 3)
    # with an extension budget, the edge that keeps winning is extended by the grid's ratio and found inside
    t = _cell(8e-3, max_extra=2)
    assert t.extensions == pytest.approx([8e-3, 1.6e-2]) and t.value == pytest.approx(8e-3) and t.ok


def test_the_pretraining_check_guards_every_claim_and_the_fine_tuning_check_only_the_fine_tuned_ones():
    cfg = Config(interior_min_fraction=0.5)
    claims = [_claim("gen", "loglik"), _claim("probe", "probe_acc", "ar"), _claim("ss", "ss_ft"),
              _claim("pep", "pep_ft", "ar")]
    cells = {a: _cell(2e-3) for a in ("dplm", "mlm", "ar")}
    pre, ft = tuning_checks(cfg, claims, cells, {f"{a}:ss_ft": _cell(4e-3) for a in ("dplm", "mlm", "ar")})
    assert pre.guards == ["gen", "probe", "ss", "pep"] and ft.guards == ["ss", "pep"]
    assert pre.passed and not ft.passed and ft.detail.startswith("tuning:")
