"""The fused ST-BIF kernel (``spikezip_tf._fused``) gives the PyTorch loop's bits, and the simulation is identical with
and without it (every layout the kernel reads in place, both dtypes, the ablations, whole models)."""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial

import pytest
import torch
from torch import nn

from icml24.common.nets import TinyViT
from icml24.spikezip_tf import _fused, calibrate, convert, quantize, simulate
from icml24.spikezip_tf.snn import STBIFNeuron
from icml24.spikezip_tf.text import TinyTextEncoder
from tests.spikezip_tf.compare import assert_results_equal

F64 = torch.float64
needs_kernel = pytest.mark.skipif(not _fused.available(torch.zeros(1)),
                                  reason=f"fused kernel not available here: {_fused.reason}")


@contextmanager
def kernel(on: bool):
    was = _fused.ENABLED
    _fused.ENABLED = on
    try:
        yield
    finally:
        _fused.ENABLED = was


def _run_neuron(x: torch.Tensor, steps: int, chunks: list[int], **kw) -> tuple[list[torch.Tensor], list, dict]:
    n = STBIFNeuron(**kw)
    outs, spikes = [], []
    t = 0
    for c in chunks:
        n.steps = c
        xc = x[t * (x.shape[0] // steps):(t + c) * (x.shape[0] // steps)]
        outs.append(n(xc))
        spikes.append(n.last_spikes)
        t += c
    return outs, spikes, {"v": n.v.clone(), "acc": n.acc.clone()}


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("kw", [dict(threshold=0.3, pos_max=7, neg_min=-8),
                                dict(threshold=0.13, pos_max=15, neg_min=0),
                                dict(threshold=0.3, pos_max=7, neg_min=-8, negative_spikes=False),
                                dict(threshold=0.25, pos_max=7, neg_min=-8, v_init=0.0)])
def test_kernel_bitwise_equals_pytorch_loop(dtype, kw):
    g = torch.Generator().manual_seed(0)
    T, B = 12, 3
    x = torch.randn(T * B, 5, 7, generator=g, dtype=dtype)
    x[5 * B:8 * B] = 0  # silent steps in the middle
    x[9 * B:] = 0  # and at the end: the settled shortcut
    x[: 2 * B] *= 4  # large inputs: spike tracer at its bounds
    kw = {**kw, "threshold": torch.tensor(kw["threshold"], dtype=dtype)}
    for chunks in ([T], [1] * T, [4, 4, 4], [5, 7]):
        with kernel(False):
            ref = _run_neuron(x, T, chunks, **kw)
        with kernel(True):
            got = _run_neuron(x, T, chunks, **kw)
        assert torch.equal(torch.cat(ref[0]), torch.cat(got[0]))
        assert all(torch.equal(a, b) for a, b in zip(ref[1], got[1], strict=True))
        assert torch.equal(ref[2]["v"], got[2]["v"]) and torch.equal(ref[2]["acc"], got[2]["acc"])


@needs_kernel
def test_kernel_reads_row_strided_and_copies_other_layouts():
    g = torch.Generator().manual_seed(1)
    base = torch.randn(4 * 2, 6, 3, 2, 8, generator=g, dtype=F64)  # (T*B, N, 3, heads, head_dim) like a qkv output
    views = {"row-strided head slice": base[:, :, 1],                 # read in place (rows of heads*head_dim)
             "transposed": base[:, :, 1].transpose(1, 2),            # copied first
             "contiguous": base[:, :, 1].contiguous()}
    assert _fused._rows(views["row-strided head slice"].reshape(4, 2, 6, 2, 8)) == (6, 16, 48)
    assert _fused._rows(views["transposed"].reshape(4, 2, 2, 6, 8)) is None
    assert _fused._rows(views["contiguous"].reshape(4, 2, 6, 2, 8)) == (1, 96, 96)
    for name, xv in views.items():
        outs = {}
        for on in (False, True):
            with kernel(on):
                n = STBIFNeuron(threshold=0.2, pos_max=7, neg_min=-8)
                n.steps = 4
                outs[on] = (n(xv), n.last_spikes)
        assert torch.equal(outs[False][0], outs[True][0]), name
        assert torch.equal(outs[False][1], outs[True][1]), name




@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_simulation_identical_with_and_without_kernel(dtype):
    torch.manual_seed(0)
    vit = TinyViT(embed_dim=16, depth=2, num_heads=2, act_layer=nn.ReLU, norm_layer=partial(nn.LayerNorm, eps=1e-6))
    qann = quantize(vit, level=16)
    x = torch.randn(4, 1, 8, 8)
    calibrate(qann, x)
    qann = qann.to(dtype).eval()
    for kw in ({}, {"negative_spikes": "signed"}, {"v_init": 0.0}):
        snn = convert(qann, **kw)
        for chunk in (1, 4, 30):
            with kernel(False):
                ref = simulate(snn, x, max_steps=60, chunk=chunk)
            with kernel(True):
                got = simulate(snn, x, max_steps=60, chunk=chunk)
            assert_results_equal(ref, got)
    torch.manual_seed(1)
    enc = TinyTextEncoder(vocab_size=11, max_len=12, num_classes=3)
    q = quantize(enc, level=16)
    ids = torch.randint(0, 11, (5, 12))
    mask = torch.ones(5, 12, dtype=torch.bool)
    mask[:2, 7:] = False
    calibrate(q, ids, mask=mask)
    snn = convert(q.to(dtype).eval())
    with kernel(False):
        ref = simulate(snn, ids, mask=mask, max_steps=60)
    with kernel(True):
        got = simulate(snn, ids, mask=mask, max_steps=60)
    assert_results_equal(ref, got)


def test_kernel_off_switch_and_non_cpu_fallback():
    with kernel(False):
        assert not _fused.available(torch.zeros(1))
    assert not _fused.available(torch.zeros(1, dtype=torch.float16))  # other dtypes: the PyTorch loop
    n = STBIFNeuron(threshold=0.5, pos_max=3, neg_min=-4).half()
    n.steps = 2
    assert torch.equal(n(torch.tensor([[1.0], [0.0]], dtype=torch.float16)),
                       torch.tensor([[0.5], [0.5]], dtype=torch.float16))
