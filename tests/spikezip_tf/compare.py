"""One comparison of two ``SimulationResult`` s, shared by the multi-step identity tests."""

from __future__ import annotations

import torch


def assert_results_equal(a, b) -> None:
    """Outputs, quiescence, spike and SOP counts (and the pooler output, where either has one) are identical."""
    assert torch.equal(a.outputs, b.outputs)
    assert a.quiescent_step == b.quiescent_step
    assert torch.equal(a.sample_quiescent_step, b.sample_quiescent_step)
    assert a.spikes_per_layer == b.spikes_per_layer and a.sops_per_layer == b.sops_per_layer
    assert torch.equal(a.spikes_per_step, b.spikes_per_step) and torch.equal(a.sops_per_step, b.sops_per_step)
    if a.pooler_output is not None or b.pooler_output is not None:
        assert torch.equal(a.pooler_output, b.pooler_output)
