"""The Opacus-compatible path of SemiDPSGD: p.grad_sample from a GradSampleModule and a plain step()."""

from __future__ import annotations

import warnings

import pytest
import torch

from icml24.dp_public import SemiDPSGD, per_sample_grads, poisson_sample

opacus = pytest.importorskip("opacus")
from opacus import GradSampleModule  # noqa: E402

warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
warnings.filterwarnings("ignore", message=".*Full backward hook.*")


def _net(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


def _mean_ce(out, y):
    return torch.nn.functional.cross_entropy(out, y)


def _opt(params, seed):
    return SemiDPSGD(params, lr=0.3, beta=0.6, noise_multiplier=0.8, max_grad_norm=1.0, expected_batch_size=10,
                     sample_rate=0.25, momentum=0.5, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("freeze_first", [False, True])
def test_grad_sample_path_matches_per_sample_path_step_for_step(freeze_first):
    g = torch.Generator().manual_seed(0)
    xp, yp = torch.randn(40, 6, generator=g), torch.randint(0, 3, (40,), generator=g)
    xq, yq = torch.randn(12, 6, generator=g), torch.randint(0, 3, (12,), generator=g)
    ref, mod = _net(1), _net(1)
    if freeze_first:  # public pretraining then private fine-tuning of the head only
        for m in (ref, mod):
            m[0].weight.requires_grad_(False)
            m[0].bias.requires_grad_(False)
    gsm = GradSampleModule(mod, loss_reduction="mean")
    opt_ref = _opt([p for p in ref.parameters() if p.requires_grad], 5)
    opt = _opt([p for p in gsm.parameters() if p.requires_grad], 5)
    sampler = torch.Generator().manual_seed(9)
    for _ in range(6):
        idx = poisson_sample(40, sample_rate=0.25, generator=sampler)
        if idx.numel() == 0:
            continue
        # existing path: per-sample gradients passed explicitly
        opt_ref.step(private_grad_samples=per_sample_grads(ref, _mean_ce, xp[idx], yp[idx]),
                     public_grad_samples=per_sample_grads(ref, _mean_ce, xq, yq))
        # Opacus path: backward passes through the GradSampleModule, then a plain step()
        opt.zero_grad()
        _mean_ce(gsm(xq), yq).backward()
        opt.capture_public()
        _mean_ce(gsm(xp[idx]), yp[idx]).backward()
        opt.step()
        for a, b in zip(ref.parameters(), mod.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert opt.private_steps == opt_ref.private_steps > 0
    assert opt.get_epsilon(1e-5) == pytest.approx(opt_ref.get_epsilon(1e-5))
    assert all(getattr(p, "grad_sample", None) is None for p in gsm.parameters())


def test_plain_step_without_grad_samples_raises_and_public_only_step_works():
    gsm = GradSampleModule(_net(0), loss_reduction="mean")
    opt = _opt(list(gsm.parameters()), 0)
    with pytest.raises(ValueError, match="GradSampleModule"):
        opt.step()
    with pytest.raises(ValueError, match="capture"):
        opt.capture_public()
    x, y = torch.randn(5, 6), torch.randint(0, 3, (5,))
    _mean_ce(gsm(x), y).backward()
    opt.capture_public()
    w0 = [p.detach().clone() for p in gsm.parameters()]
    opt.step()  # public step only: no privacy spent
    assert opt.private_steps == 0
    assert any(not torch.equal(a, p) for a, p in zip(w0, gsm.parameters(), strict=True))
