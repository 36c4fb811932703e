"""SimPro 8×8 digits tier: the batched views and a tiny end-to-end run of the tier."""

from __future__ import annotations

import json
import math

import pytest
import torch

from icml24.simpro.data import digits_augment, make_imb_data
from icml24.simpro.experiment import Config, DigitsCNN, _data, _digits_split, run


def _images(n: int = 64, seed: int = 0) -> torch.Tensor:
    """Random images in [0, 1] with a zero border ring (so ±1 px translations keep every pixel)."""
    x = torch.zeros(n, 1, 8, 8)
    x[:, :, 1:7, 1:7] = torch.rand(n, 1, 6, 6, generator=torch.Generator().manual_seed(seed))
    return x


@pytest.mark.parametrize("strong", [False, True])
def test_digits_views_shape_range_and_determinism(strong):
    x = _images()
    a = digits_augment(x, strong=strong, generator=torch.Generator().manual_seed(3))
    b = digits_augment(x, strong=strong, generator=torch.Generator().manual_seed(3))
    c = digits_augment(x, strong=strong, generator=torch.Generator().manual_seed(4))
    assert a.shape == x.shape and a.dtype == x.dtype
    assert a.min() >= 0 and a.max() <= 1
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.equal(a, c)
    assert not torch.equal(a, x)


def test_weak_view_is_a_small_translation_that_keeps_the_mass():
    x = _images(200)
    w = digits_augment(x, strong=False, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(w.sum(dim=(1, 2, 3)), x.sum(dim=(1, 2, 3)))
    seen = set()
    for i in range(len(x)):
        hits = [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1)
                if torch.equal(w[i], torch.roll(x[i], shifts=(dy, dx), dims=(1, 2)))]
        assert len(hits) == 1, f"image {i} is not a ±1 px translation of its input"
        seen.add(hits[0])
    assert len(seen) == 9  # every shift in {-1, 0, 1}² occurs


def test_translation_zero_fills_instead_of_wrapping():
    x = torch.zeros(50, 1, 8, 8)
    x[:, :, :, -1] = 1.0  # only the right-most column is lit
    w = digits_augment(x, strong=False, generator=torch.Generator().manual_seed(1))
    mass = w.sum(dim=(1, 2, 3))
    assert torch.all((mass == 8) | (mass == 7) | (mass == 0))  # shifted out of the frame: lost, never wrapped
    assert w[:, :, :, 0].sum() == 0


def test_no_flips_a_left_heavy_digit_stays_left_heavy():
    x = torch.zeros(400, 1, 8, 8)
    x[:, :, 1:7, 1:3] = 1.0  # a bar in the left quarter
    w = digits_augment(x, strong=False, generator=torch.Generator().manual_seed(2))
    assert bool(torch.all(w[..., :4].sum(dim=(1, 2, 3)) == 12))  # every weak view keeps the bar on the left
    z = digits_augment(x, strong=True, generator=torch.Generator().manual_seed(2))
    left, right = z[..., :4].sum(dim=(1, 2, 3)).mean(), z[..., 4:].sum(dim=(1, 2, 3)).mean()
    assert left > 2 * right  # a flip with probability 1/2 would even the halves out


def test_cutout_zeroes_exactly_one_patch_and_nothing_else():
    x = torch.full((100, 1, 8, 8), 0.6)
    g = lambda: torch.Generator().manual_seed(5)  # noqa: E731
    with_cut = digits_augment(x, strong=True, generator=g(), cutout=3)
    no_cut = digits_augment(x, strong=True, generator=g(), cutout=0)
    diff = with_cut != no_cut
    zero = with_cut == 0
    for i in range(len(x)):
        win = torch.nn.functional.avg_pool2d(zero[i].float()[None], 3, stride=1)
        assert win.max() == 1.0, f"view {i} has no all-zero 3×3 patch"
        rows, cols = torch.nonzero(diff[i, 0], as_tuple=True)
        if len(rows):  # changed pixels lie inside one 3×3 window and are zero
            assert rows.max() - rows.min() <= 2 and cols.max() - cols.min() <= 2
            assert bool(torch.all(with_cut[i, 0][rows, cols] == 0))
    assert diff.any(dim=(1, 2, 3)).float().mean() > 0.9


def test_strong_view_without_affine_jitter_noise_cutout_is_a_two_pixel_translation():
    x = torch.zeros(200, 1, 8, 8)
    x[:, :, 2:6, 2:6] = torch.rand(200, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    z = digits_augment(x, strong=True, generator=torch.Generator().manual_seed(0), rotation=0.0, shear=0.0,
                       jitter=0.0, noise=0.0, cutout=0)
    shifts = [(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)]
    seen = set()
    for i in range(len(x)):
        err = [float((z[i] - torch.roll(x[i], s, dims=(1, 2))).abs().max()) for s in shifts]
        assert min(err) < 1e-5, f"view {i} is not a ±2 px translation"
        seen.add(shifts[err.index(min(err))])
    assert len(seen) == 25


def test_digits_augment_rejects_a_flat_batch():
    with pytest.raises(ValueError, match="simpro: digits_augment needs images"):
        digits_augment(torch.zeros(4, 64), strong=False, generator=torch.Generator())


def test_digits_tier_is_off_by_default_and_in_quick():
    assert Config().digits_distributions == () and Config.quick().digits_distributions == ()
    slow = Config.slow()
    assert slow.digits_distributions == ("consistent", "reversed", "head-tail")
    assert slow.gauss_distributions == () and slow.mnist1d_distributions == ()


def test_digits_data_split_is_disjoint_and_long_tailed():
    cfg = Config.slow()
    d = _data(cfg, "digits", "reversed", 0)
    assert d["x_l"].shape[1:] == (1, 8, 8) and d["x_val"].shape == (100, 1, 8, 8)
    assert torch.bincount(d["y_l"], minlength=10).tolist() == make_imb_data(max_num=30, num_classes=10, gamma=10)
    assert torch.bincount(d["y_val"], minlength=10).tolist() == [10] * 10
    assert d["pi_u"][-1] > d["pi_u"][0]  # reversed: the labeled tail is the unlabeled head
    xp, _, xv, _, xt, _ = _digits_split(cfg.digits_val_per_class)
    assert len(xp) + len(xv) + len(xt) == 1797  # pool, validation and test partition load_digits
    assert DigitsCNN()(d["x_l"][:5]).shape == (5, 10)


def test_config_rejects_bad_digits_fields():
    with pytest.raises(ValueError, match="digits_steps must be >= 1"):
        Config(digits_steps=0)
    with pytest.raises(ValueError, match="digits_distributions must be distinct names"):
        Config(digits_distributions=("reversed", "sideways"))
    with pytest.raises(ValueError, match="every tier is off"):
        Config(gauss_distributions=(), mnist1d_distributions=())
    with pytest.raises(ValueError, match="digits_num_seeds"):
        Config(seeds=(0,), mnist1d_num_seeds=1, digits_distributions=("reversed",), digits_num_seeds=2)


def test_the_digits_tier_runs_end_to_end_on_a_tiny_config(tmp_path):
    cfg = Config.slow().replace(threads=1, workers=1, seeds=(0, 1), digits_num_seeds=2,
                                digits_distributions=("reversed",),
                                digits_steps=20, threshold_grid=(0.7,), sup_lr_factors=(1.0,), updates_per_run=5)
    res = run(cfg, tmp_path)
    d = json.loads((tmp_path / "results.json").read_text())
    assert set(res.extra["best_baseline"]) == {"digits/reversed"}
    assert {"supervised", "fixmatch", "fixmatch_la", "acr", "simpro", "simpro_no_em"} <= set(d["summary"])
    names = {c.name for c in res.claim_checks}
    assert "digits/reversed: SimPro beats the best baseline by >= 5 pts" in names
    assert any(n.startswith("digits/reversed: negative control") for n in names)
    accs = res.extra["mean_bal_acc"]["digits/reversed"]
    assert all(math.isfinite(v) and 0 <= v <= 100 for v in accs.values())
    assert (tmp_path / "balanced_accuracy.png").stat().st_size > 1000
