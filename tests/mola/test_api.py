"""MoLA layers, gates, TwD loss and apply_mola: reference equivalences, invariants and input errors."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from icml24.mola import MoLAConv2d, MoLALinear, MoLAModel, Router, TaskGate, apply_mola, twd_loss

torch.set_num_threads(1)


def _rand_B(layer: nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        layer.lora_B.copy_(torch.randn(layer.lora_B.shape, generator=g) * 0.1)


def _backbone() -> nn.Module:
    return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))


def _convnet() -> nn.Module:
    return nn.Sequential(nn.Conv2d(2, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 4, 3, stride=2),
                         nn.Flatten(), nn.Linear(4 * 3 * 3, 5))


# ---------------------------------------------------------------- zero-B identity with the base network


def test_zero_B_equals_base_network_linear_and_conv():
    torch.manual_seed(0)
    for make, x in ((_backbone, torch.randn(7, 12)), (_convnet, torch.randn(7, 2, 8, 8))):
        base = make()
        ref = base(x)
        wrapped = apply_mola(copy.deepcopy(base), target_modules=r"[024]", num_experts=3, rank=2, alpha=16.0)
        assert len(wrapped.mola_layers) == 3
        out = wrapped(x, task_ids=torch.tensor([0, 1, 2, 0, 1, 2, 0]))
        torch.testing.assert_close(out, ref)
        # and with a router (soft gates): still the base output while every B is zero
        wrapped_r = apply_mola(copy.deepcopy(base), target_modules=r"[024]", num_experts=3, rank=2, alpha=16.0,
                               router=Router(num_experts=3, in_features=x[0].numel()))
        torch.testing.assert_close(wrapped_r(x), ref)


def test_non_zero_B_changes_output_only_through_the_chosen_expert():
    torch.manual_seed(0)
    layer = MoLALinear(nn.Linear(5, 4), num_experts=3, rank=2)
    with torch.no_grad():
        layer.lora_B[1].normal_()  # only expert 1 is non-zero
    x = torch.randn(6, 5)
    out = layer(x, gates=TaskGate(num_experts=3)(torch.tensor([0, 1, 2, 0, 1, 2])))
    base = layer.base(x)
    torch.testing.assert_close(out[[0, 2, 3, 5]], base[[0, 2, 3, 5]])
    assert (out[[1, 4]] - base[[1, 4]]).abs().max() > 1e-3


# ---------------------------------------------------------------- per-sample gating == per-sample loop


def test_linear_per_sample_gating_equals_loop_over_dense_weights():
    torch.manual_seed(1)
    layer = MoLALinear(nn.Linear(6, 5), num_experts=4, rank=3, alpha=8.0)
    _rand_B(layer)
    x = torch.randn(9, 6)
    g = torch.softmax(torch.randn(9, 4), dim=1)
    out = layer(x, gates=g)
    dW = torch.stack([layer.lora_B[e] @ layer.lora_A[e] for e in range(4)]) * (8.0 / 3)
    ref = torch.stack([F.linear(x[i], layer.base.weight + (g[i].view(-1, 1, 1) * dW).sum(0), layer.base.bias)
                       for i in range(9)])
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # one sample at a time gives the same rows
    loop = torch.cat([layer(x[i:i + 1], gates=g[i:i + 1]) for i in range(9)])
    torch.testing.assert_close(out, loop, rtol=1e-5, atol=1e-5)


def test_linear_token_inputs_share_the_sample_gate():
    torch.manual_seed(2)
    layer = MoLALinear(nn.Linear(6, 5), num_experts=2, rank=2)
    _rand_B(layer)
    x = torch.randn(3, 4, 6)
    g = torch.softmax(torch.randn(3, 2), dim=1)
    out = layer(x, gates=g)
    ref = torch.stack([layer(x[:, j], gates=g) for j in range(4)], dim=1)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("groups,stride,padding,bias", [(1, 1, 1, True), (2, 2, 0, False), (1, 1, "same", True)])
def test_conv_per_sample_gating_equals_grouped_per_sample_conv(groups, stride, padding, bias):
    torch.manual_seed(3)
    conv = nn.Conv2d(4, 6, (3, 3), stride=stride, padding=padding, groups=groups, bias=bias)
    layer = MoLAConv2d(conv, num_experts=3, rank=2, alpha=16.0)
    _rand_B(layer)
    x = torch.randn(5, 4, 7, 7)
    g = torch.softmax(torch.randn(5, 3), dim=1)
    out = layer(x, gates=g)
    # reference: the loralib weight-space form, W_i = W + Σ_e g_ie (α/r)(B_e A_e).view(W.shape), one conv per sample
    dW = torch.stack([(layer.lora_B[e] @ layer.lora_A[e]).view(conv.weight.shape) for e in range(3)]) * 8.0
    ref = torch.cat([F.conv2d(x[i:i + 1], conv.weight + (g[i].view(-1, 1, 1, 1, 1) * dW).sum(0), conv.bias,
                              stride, padding, 1, groups) for i in range(5)])
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    assert layer.lora_A.shape == (3, 2 * 3, (4 // groups) * 3) and layer.lora_B.shape == (3, 6 * 3, 2 * 3)


@pytest.mark.parametrize("groups,stride,padding,bias,dilation", [(1, 1, 1, True, 1), (2, 2, 0, False, 1),
                                                                  (1, 1, "same", True, 2), (3, 1, 1, True, 1)])
def test_conv_per_sample_impl_equals_stacked_impl_with_gradients(groups, stride, padding, bias, dilation):
    torch.manual_seed(11)
    conv = nn.Conv2d(6, 12, (3, 2), stride=stride, padding=padding, groups=groups, bias=bias, dilation=dilation)
    layer = MoLAConv2d(conv, num_experts=3, rank=2, alpha=4.0)
    assert layer.impl == "per_sample"
    _rand_B(layer)
    x = torch.randn(5, 6, 8, 7)
    logits = torch.randn(5, 3)
    results = {}
    for impl in ("per_sample", "stacked"):
        layer.impl = impl
        layer.zero_grad()
        xi, li = x.clone().requires_grad_(True), logits.clone().requires_grad_(True)
        out = layer(xi, gates=torch.softmax(li, dim=1))
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        results[impl] = (out.detach(), xi.grad, li.grad, *(p.grad.clone() for p in layer.parameters()))
    for a, b in zip(results["per_sample"], results["stacked"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="impl must be one of"):
        MoLAConv2d(nn.Conv2d(2, 2, 1), num_experts=2, rank=1, impl="loop")
    with pytest.raises(ValueError, match="3 channels, the layer takes 6"):
        layer(torch.randn(2, 3, 8, 8), gates=torch.ones(2, 3) / 3)


# ---------------------------------------------------------------- one-hot Router gate == Grad layer


def test_router_one_hot_gate_equals_task_gate_model():
    torch.manual_seed(4)
    x = torch.randn(8, 12)
    t = torch.tensor([0, 1, 2, 3, 3, 2, 1, 0])
    grad_model = apply_mola(_backbone(), target_modules=["0", "2"], num_experts=4, rank=2)
    for m in grad_model.mola_layers:
        _rand_B(m, seed=5)
    router_model = copy.deepcopy(grad_model)
    # a router whose logits are a huge one-hot of the task (carried in the input's last slot) -> one-hot gates
    class TaskLogits(nn.Module):
        def forward(self, inp):
            return F.one_hot(inp[:, -1].long(), 4).float() * 1e4

    net = TaskLogits()
    router_model = MoLAModel(router_model.model, gate=Router(num_experts=4, net=net))
    x_r = torch.cat([x, t.float().view(-1, 1)], dim=1)
    out_grad = grad_model(x, task_ids=t)
    out_router = router_model(x, router_input=x_r)
    torch.testing.assert_close(out_router, out_grad)
    torch.testing.assert_close(router_model.last_gates, F.one_hot(t, 4).float())


def test_grad_gate_routes_gradients_only_to_the_task_expert():
    torch.manual_seed(6)
    model = apply_mola(_backbone(), target_modules=["0", "2"], num_experts=3, rank=2)
    for m in model.mola_layers:
        _rand_B(m)
    out = model(torch.randn(4, 12), task_ids=torch.tensor([1, 1, 1, 1]))
    out.square().sum().backward()
    for m in model.mola_layers:
        assert m.lora_A.grad[1].abs().sum() > 0 and m.lora_B.grad[1].abs().sum() > 0
        assert m.lora_A.grad[[0, 2]].abs().sum() == 0 and m.lora_B.grad[[0, 2]].abs().sum() == 0
        assert m.base.weight.grad is not None and m.base.weight.grad.abs().sum() > 0  # backbone trained jointly


# ---------------------------------------------------------------- TwD loss


def _twd_bruteforce(u: torch.Tensor, t: torch.Tensor, tau: float, reduction: str) -> torch.Tensor:
    """The official double loop: anchor i (column i), positive j != i with t_j == t_i."""
    u = F.normalize(u.double(), dim=1)
    s = torch.exp(u @ u.t() / tau)
    s = s - torch.diag(torch.diag(s))
    per_anchor: list[list[torch.Tensor]] = []
    for i in range(len(t)):
        terms = [-torch.log(s[j, i] / s[:, i].sum()) for j in range(len(t)) if j != i and t[j] == t[i]]
        per_anchor.append(terms)
    if reduction == "pairs":
        return torch.stack([x for a in per_anchor for x in a]).mean()
    return torch.stack([torch.stack(a).mean() for a in per_anchor if a]).mean()


@pytest.mark.parametrize("tau", [1.0, 0.3])
@pytest.mark.parametrize("reduction", ["pairs", "anchors"])
def test_twd_equals_bruteforce_loop(tau, reduction):
    g = torch.Generator().manual_seed(7)
    for trial in range(3):
        u = torch.randn(11, 5, generator=g)
        t = torch.randint(0, 3 + trial, (11,), generator=g)
        if len(set(t.tolist())) == len(t):
            continue
        got = twd_loss(u, t, tau=tau, reduction=reduction)
        torch.testing.assert_close(got.double(), _twd_bruteforce(u, t, tau, reduction), rtol=1e-5, atol=1e-6)


def test_twd_no_positive_pairs_is_finite_zero_with_gradient():
    u = torch.randn(4, 3, requires_grad=True)
    loss = twd_loss(u, torch.tensor([0, 1, 2, 3]))
    assert torch.isfinite(loss) and loss.item() == 0.0
    loss.backward()
    assert u.grad is not None and torch.all(u.grad == 0)


def test_twd_is_lower_for_task_separated_embeddings():
    t = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])
    separated = F.one_hot(t, 3).float() + 0.01 * torch.randn(9, 3)
    mixed = torch.randn(9, 3)
    assert twd_loss(separated, t) < twd_loss(mixed, t)


# ---------------------------------------------------------------- apply_mola behaviour


def test_apply_mola_targets_types_and_parameters():
    model = apply_mola(_convnet(), target_modules=["0", "4"], num_experts=2, rank=3, alpha=6.0)
    assert isinstance(model.model[0], MoLAConv2d) and isinstance(model.model[4], MoLALinear)
    assert isinstance(model.model[2], nn.Conv2d) and not isinstance(model.model[2], MoLAConv2d)
    assert model.model[0].scaling == pytest.approx(2.0)
    assert all(p.requires_grad for p in model.parameters())  # nothing frozen
    # regex form: full-name match
    model2 = apply_mola(_backbone(), target_modules=r"[02]", num_experts=2, rank=1)
    assert [type(m).__name__ for m in model2.model] == ["MoLALinear", "ReLU", "MoLALinear", "ReLU", "Linear"]


def test_router_model_records_logits_and_twd_embedding():
    torch.manual_seed(8)
    router = Router(num_experts=3, in_features=12, hidden=(8,), embed_dim=16)
    model = apply_mola(_backbone(), target_modules=["0"], num_experts=3, rank=2, router=router)
    x = torch.randn(6, 12)
    model(x)
    assert model.last_logits.shape == (6, 3)
    torch.testing.assert_close(model.last_gates.sum(1), torch.ones(6))
    emb = router.embed(model.last_logits)
    assert emb.shape == (6, 16)
    loss = twd_loss(emb, torch.tensor([0, 0, 1, 1, 2, 2]))
    loss.backward()
    assert router.net[1].weight.grad is not None and router.net[1].weight.grad.abs().sum() > 0
    assert model.model[0].gates is None  # the layer's own slot is unused: gates live in the model's context
    assert model.model[0].gate_context is model.gate_context and model.gate_context.gates is model.last_gates


def test_same_seed_same_numbers():
    outs = []
    for _ in range(2):
        torch.manual_seed(9)
        model = apply_mola(_backbone(), target_modules=["0", "2"], num_experts=2, rank=2,
                           router=Router(num_experts=2, in_features=12))
        outs.append(model(torch.randn(3, 12)))
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)


# ---------------------------------------------------------------- bad input -> clear errors before compute


@pytest.mark.parametrize("kw,match", [
    (dict(num_experts=0), "num_experts must be an int >= 1, got 0"),
    (dict(rank=0), "rank must be an int >= 1, got 0"),
    (dict(alpha=0.0), "alpha must be"),
    (dict(target_modules=["nope"]), "match no module"),
    (dict(target_modules=r"fc\d"), "match no module"),
])
def test_apply_mola_value_errors(kw, match):
    args = dict(target_modules=["0"], num_experts=2, rank=2)
    args.update(kw)
    model = _backbone()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=match):
        apply_mola(model, **args)
    assert all(isinstance(m, nn.Linear) for m in (model[0], model[2]))  # nothing swapped on error
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k])


def test_apply_mola_type_errors():
    with pytest.raises(TypeError, match="only nn.Linear and nn.Conv2d"):
        apply_mola(_backbone(), target_modules=["1"], num_experts=2, rank=2)  # a ReLU
    with pytest.raises(TypeError, match="rank must be an int"):
        apply_mola(_backbone(), target_modules=["0"], num_experts=2, rank=2.5)
    with pytest.raises(ValueError, match=r"router.num_experts \(3\) != num_experts \(2\)"):
        apply_mola(_backbone(), target_modules=["0"], num_experts=2, rank=2,
                   router=Router(num_experts=3, in_features=12))


def test_task_id_out_of_range_raises_before_compute():
    model = apply_mola(_backbone(), target_modules=["0"], num_experts=2, rank=2)
    with pytest.raises(ValueError, match=r"task ids must be in \[0, num_experts=2\).*max 2"):
        model(torch.randn(3, 12), task_ids=torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="task ids must be in"):
        TaskGate(num_experts=2)(torch.tensor([-1, 0]))
    with pytest.raises(TypeError, match="integer tensor"):
        TaskGate(num_experts=2)(torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="needs task_ids"):
        model(torch.randn(3, 12))


def test_layer_errors():
    with pytest.raises(ValueError, match="num_experts must be an int >= 1, got 0"):
        MoLALinear(nn.Linear(3, 3), num_experts=0, rank=1)
    with pytest.raises(ValueError, match="rank must be an int >= 1, got 0"):
        MoLAConv2d(nn.Conv2d(3, 3, 3), num_experts=2, rank=0)
    with pytest.raises(TypeError, match="needs an nn.Conv2d"):
        MoLAConv2d(nn.Linear(3, 3), num_experts=2, rank=1)
    with pytest.raises(ValueError, match="padding_mode"):
        MoLAConv2d(nn.Conv2d(3, 3, 3, padding=1, padding_mode="reflect"), num_experts=2, rank=1)
    layer = MoLALinear(nn.Linear(3, 3), num_experts=2, rank=1)
    with pytest.raises(RuntimeError, match="no gates set"):
        layer(torch.randn(2, 3))
    with pytest.raises(ValueError, match="gates must have shape"):
        layer(torch.randn(2, 3), gates=torch.ones(2, 3))
    with pytest.raises(ValueError, match="gates batch size"):
        layer(torch.randn(2, 3), gates=torch.ones(4, 2))
    with pytest.raises(ValueError, match="router output must have shape"):
        Router(num_experts=2, net=nn.Linear(3, 5))(torch.randn(2, 3))
    with pytest.raises(ValueError, match="needs in_features"):
        Router(num_experts=2)


@pytest.mark.parametrize("tau", [0.0, -1.0, float("nan")])
def test_twd_bad_tau(tau):
    with pytest.raises(ValueError, match="tau must be"):
        twd_loss(torch.randn(4, 3), torch.tensor([0, 0, 1, 1]), tau=tau)


def test_twd_bad_shapes():
    with pytest.raises(ValueError, match="got 4 gates but 3 task ids"):
        twd_loss(torch.randn(4, 3), torch.tensor([0, 0, 1]))
    with pytest.raises(TypeError, match="must be integers"):
        twd_loss(torch.randn(4, 3), torch.tensor([0.0, 0.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="reduction"):
        twd_loss(torch.randn(4, 3), torch.tensor([0, 0, 1, 1]), reduction="mean")


# ---------------------------------------------------------------- drop-in: checkpoint, compile, kwargs, merge, freeze
class _Blocks(nn.Module):
    """Two blocks, each optionally run under torch.utils.checkpoint (as HF gradient checkpointing does)."""

    def __init__(self, ckpt=None):
        super().__init__()
        self.b1 = nn.Sequential(nn.Linear(12, 16), nn.Tanh())
        self.b2 = nn.Sequential(nn.Linear(16, 16), nn.Tanh())
        self.head = nn.Linear(16, 3)
        self.ckpt = ckpt  # None, or kwargs of torch.utils.checkpoint.checkpoint

    def forward(self, x=None, *, features=None, scale=1.0):
        h = x if x is not None else features
        for blk in (self.b1, self.b2):
            h = torch.utils.checkpoint.checkpoint(blk, h, **self.ckpt) if self.ckpt is not None else blk(h)
        return self.head(h) * scale


def _mola_blocks(ckpt=None, router=False, seed=0):
    torch.manual_seed(seed)
    r = Router(num_experts=3, in_features=12, hidden=(8,)) if router else None
    model = apply_mola(_Blocks(ckpt), target_modules=["b1.0", "b2.0"], num_experts=3, rank=2, router=r)
    for m in model.mola_layers:  # non-zero B so that the experts matter
        nn.init.normal_(m.lora_B, std=0.3)
    return model


def _grads(model, x, t, forwards=1):
    model.zero_grad()
    loss = sum(model(x[i::forwards], task_ids=t[i::forwards]).pow(2).sum() for i in range(forwards))
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


# reentrant checkpoint cannot backpropagate into tensors captured from outside its inputs, such as router
# gates that require grad (a torch limitation, documented); task gates carry no gradient and work with both.
@pytest.mark.parametrize("router, use_reentrant", [(False, False), (False, True), (True, False)])
def test_checkpointed_model_gives_the_same_gradients(router, use_reentrant):
    x, t = torch.randn(8, 12, requires_grad=True), torch.tensor([0, 1, 2, 0, 1, 2, 1, 0])
    ref_loss, ref = _grads(_mola_blocks(router=router), x, t)
    loss, got = _grads(_mola_blocks({"use_reentrant": use_reentrant}, router=router), x, t)
    torch.testing.assert_close(loss, ref_loss)
    assert got.keys() == ref.keys() and any("lora_A" in n for n in got)
    for n in ref:
        torch.testing.assert_close(got[n], ref[n], msg=n)


@pytest.mark.filterwarnings("ignore:None of the inputs have requires_grad")
def test_router_under_reentrant_checkpoint_raises_a_clear_error():
    # torch alone fails in the backward with "Trying to backward through the graph a second time"; MoLA refuses
    # in the forward and names the fix
    model = _mola_blocks({"use_reentrant": True}, router=True)
    with pytest.raises(RuntimeError, match=r"use_reentrant=True.*use use_reentrant=False"):
        model(torch.randn(8, 12, requires_grad=True))
    with torch.no_grad():  # inference under reentrant checkpoint: gates carry no grad, nothing to refuse
        torch.testing.assert_close(model(torch.randn(4, 12, generator=torch.Generator().manual_seed(0))),
                                   _mola_blocks(router=True)(torch.randn(4, 12,
                                                                          generator=torch.Generator().manual_seed(0))))


def test_checkpoint_context_fn_restores_each_forwards_gates():
    x, t = torch.randn(8, 12), torch.tensor([0, 1, 2, 0, 1, 2, 1, 0])
    _, ref = _grads(_mola_blocks(), x, t, forwards=2)  # two forwards (different task mixes), one backward
    model = _mola_blocks()
    model.model.ckpt = {"use_reentrant": False, "context_fn": model.checkpoint_context_fn}
    _, got = _grads(model, x, t, forwards=2)
    for n in ref:
        torch.testing.assert_close(got[n], ref[n], msg=n)
    # the negative control: without context_fn the first forward is recomputed with the second one's gates
    model_plain = _mola_blocks({"use_reentrant": False})
    _, wrong = _grads(model_plain, x, t, forwards=2)
    assert not all(torch.allclose(wrong[n], ref[n]) for n in ref)


def test_compiled_model_gives_the_same_outputs_and_gradients():
    x, t = torch.randn(8, 12), torch.tensor([0, 1, 2, 0, 1, 2, 1, 0])
    ref_loss, ref = _grads(_mola_blocks(), x, t)
    model = _mola_blocks()
    compiled = torch.compile(model, backend="aot_eager")
    compiled.zero_grad()
    loss = compiled(x, task_ids=t).pow(2).sum()
    loss.backward()
    torch.testing.assert_close(loss.detach(), ref_loss)
    for n, p in model.named_parameters():
        if n in ref:
            torch.testing.assert_close(p.grad, ref[n], msg=n)
    t2 = torch.tensor([2, 2, 1, 1, 0, 0, 2, 1])  # new task ids reach the layers of the compiled graph
    torch.testing.assert_close(compiled(x, task_ids=t2), _mola_blocks()(x, task_ids=t2))


def test_keyword_inputs():
    model = _mola_blocks()
    x, t = torch.randn(5, 12), torch.tensor([0, 1, 2, 2, 1])
    ref = model(x, task_ids=t, scale=2.0)
    batch = {"features": x, "task_ids": t, "scale": 2.0}
    torch.testing.assert_close(model(**batch), ref)
    torch.testing.assert_close(model(x=x, task_ids=t, scale=2.0), ref)
    rmodel = _mola_blocks(router=True)
    torch.testing.assert_close(rmodel(features=x), rmodel(x))
    assert rmodel.last_logits.shape == (5, 3)
    with pytest.raises(ValueError, match="no model input"):
        model(task_ids=t, scale=2.0)


@pytest.mark.parametrize("task_id", [0, 2])
def test_merge_folds_one_tasks_adapters(task_id):
    model = _mola_blocks()
    x = torch.randn(6, 12)
    merged = model.merge(task_id)
    assert not any(isinstance(m, (MoLALinear, MoLAConv2d)) for m in merged.modules())
    assert type(merged.b1[0]) is nn.Linear
    with torch.no_grad():
        want = model(x, task_ids=torch.full((6,), task_id))
        other = model(x, task_ids=torch.full((6,), (task_id + 1) % 3))
        torch.testing.assert_close(merged(x), want)
    assert not torch.allclose(merged(x), other)  # the merge is task specific
    # the MoLA model is untouched, and mixture weights merge too
    torch.testing.assert_close(model(x, task_ids=torch.full((6,), task_id)), want)
    w = torch.tensor([0.2, 0.5, 0.3])
    base = model.model.b1[0].base.weight + torch.einsum("e,eoi->oi", w, model.model.b1[0].delta_weight())
    torch.testing.assert_close(model.merge(weights=w).b1[0].weight, base)


def test_merge_conv_model_and_bad_arguments():
    torch.manual_seed(3)
    model = apply_mola(_convnet(), target_modules=["0", "2"], num_experts=2, rank=2, alpha=4.0)
    for m in model.mola_layers:
        nn.init.normal_(m.lora_B, std=0.3)
    x = torch.randn(3, 2, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(model.merge(1)(x), model(x, task_ids=torch.ones(3, dtype=torch.long)),
                                   rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"task_id must be an int in \[0, 1\]"):
        model.merge(2)
    with pytest.raises(ValueError, match="exactly one of task_id and weights"):
        model.merge()
    with pytest.raises(ValueError, match=r"weights must have shape \(2,\)"):
        model.merge(weights=torch.ones(3))


def test_freeze_backbone():
    torch.manual_seed(0)
    router = Router(num_experts=2, in_features=12, hidden=(8,))
    model = apply_mola(_backbone(), target_modules=["0", "2"], num_experts=2, rank=2, router=router,
                       freeze_backbone=True)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"model.0.lora_A", "model.0.lora_B", "model.2.lora_A", "model.2.lora_B"} | {
        f"gate.{n}" for n, _ in router.named_parameters()}
    model(torch.randn(4, 12)).sum().backward()
    assert model.model[4].weight.grad is None and model.model[0].base.weight.grad is None
    assert model.model[0].lora_A.grad is not None
    assert all(p.requires_grad for p in apply_mola(_backbone(), target_modules=["0"], num_experts=2,
                                                   rank=2).parameters())
    with pytest.raises(TypeError, match="freeze_backbone must be a bool"):
        apply_mola(_backbone(), target_modules=["0"], num_experts=2, rank=2, freeze_backbone="yes")
