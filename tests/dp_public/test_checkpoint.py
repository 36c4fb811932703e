"""SemiDPSGD checkpoints carry the privacy spend: a resumed run reports the ε of the whole run."""

from __future__ import annotations

import pytest
import torch

from icml24.dp_public import SemiDPSGD

KW = {"lr": 0.1, "beta": 0.7, "noise_multiplier": 1.1, "max_grad_norm": 1.0, "expected_batch_size": 8,
      "sample_rate": 0.05, "momentum": 0.9}


def _steps(opt: SemiDPSGD, w: torch.Tensor, n: int, gen: torch.Generator) -> None:
    for _ in range(n):
        priv = [torch.randn(8, *w.shape, generator=gen)]
        pub = [torch.randn(4, *w.shape, generator=gen)]
        opt.step(private_grad_samples=priv, public_grad_samples=pub)


def _fresh(accountant="rdp"):
    w = torch.nn.Parameter(torch.zeros(5))
    return w, SemiDPSGD([w], **KW, accountant=accountant, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_resume_reports_the_epsilon_of_the_uninterrupted_run(accountant):
    k, m, delta = 30, 20, 1e-5
    w_ref, ref = _fresh(accountant)
    gen = torch.Generator().manual_seed(0)
    _steps(ref, w_ref, k + m, gen)

    w_a, a = _fresh(accountant)
    gen = torch.Generator().manual_seed(0)
    _steps(a, w_a, k, gen)
    eps_k = a.get_epsilon(delta)
    state, weights = a.state_dict(), w_a.detach().clone()

    w_b, b = _fresh(accountant)
    with torch.no_grad():
        w_b.copy_(weights)
    b.load_state_dict(state)
    assert b.private_steps == k and b.get_epsilon(delta) == pytest.approx(eps_k) and eps_k > 0
    b.generator = a.generator  # the same noise stream as the uninterrupted run
    _steps(b, w_b, m, gen)
    assert b.get_epsilon(delta) == pytest.approx(ref.get_epsilon(delta))
    torch.testing.assert_close(w_b, w_ref)  # momentum buffers were restored too


def test_state_without_privacy_or_from_another_accountant_is_refused():
    w, a = _fresh("rdp")
    _steps(a, w, 3, torch.Generator().manual_seed(0))
    state = a.state_dict()
    plain = {k: v for k, v in state.items() if k != "privacy"}
    with pytest.raises(ValueError, match="under-report"):
        _fresh("rdp")[1].load_state_dict(plain)
    with pytest.raises(ValueError, match="saved accountant 'rdp'"):
        _fresh("prv")[1].load_state_dict(state)
    with pytest.raises(ValueError, match="disagree"):
        _fresh(None)[1].load_state_dict(state)
