"""ExpSGDM's step paths: the float-scalar path (a CPU generator: SGD's passes) and the tensor-scalar path (a
generator on an accelerator, forced here) agree with each other and with RandomScaling(SGD) step for step."""

from __future__ import annotations

import pytest
import torch

import icml24.exp_sgdm.optimizer as optimizer_mod
from icml24.exp_sgdm import ExpSGDM, RandomScaling

DT = torch.float64


def _run(make, steps: int = 12):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).to(DT)
    opt = make(net)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(16, 6, generator=g, dtype=DT), torch.randint(0, 3, (16,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in net.parameters()], opt


@pytest.mark.parametrize("wd", [0.0, 0.01])
@pytest.mark.parametrize("rs", ["exponential", None])
def test_float_and_tensor_scalar_paths_agree(monkeypatch, wd, rs):
    make = lambda n: ExpSGDM(n.parameters(), lr=0.3, momentum=0.9, weight_decay=wd, random_scaling=rs,  # noqa: E731
                             generator=torch.Generator().manual_seed(3), ema_beta=0.9)
    fast, opt_f = _run(make)
    monkeypatch.setattr(optimizer_mod, "_host_scale", lambda s: None)  # as if s lived on an accelerator
    slow, opt_s = _run(make)
    for a, b in zip(fast, slow, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    for a, b in zip(opt_f.ema_params(), opt_s.ema_params(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


def test_exp_sgdm_equals_random_scaling_sgd_step_for_step_without_weight_decay():
    eta, beta = 0.3, 0.9
    ours, _ = _run(lambda n: ExpSGDM(n.parameters(), lr=eta, momentum=beta,
                                     generator=torch.Generator().manual_seed(5)))
    wrapped, _ = _run(lambda n: RandomScaling(torch.optim.SGD(n.parameters(), lr=eta * (1 - beta), momentum=beta,
                                                              foreach=True),
                                              generator=torch.Generator().manual_seed(5)))
    for a, b in zip(ours, wrapped, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
