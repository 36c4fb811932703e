"""MoLA on Hugging Face models: GPT-2's Conv1D, generate, save_pretrained / from_pretrained (issue 31)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from icml24.mola import MoLALinear, MoLAModel, Router, apply_mola

transformers = pytest.importorskip("transformers")
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.pytorch_utils import Conv1D  # noqa: E402

torch.set_num_threads(1)
GPT2_TARGETS = ["c_attn", "c_proj", "c_fc"]


def _gpt2(seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    cfg = GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=40, n_positions=32, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(cfg).eval()


def _llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    return LlamaForCausalLM(cfg).eval()


def _randomise_experts(model: MoLAModel, seed: int = 1, std: float = 0.3) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.mola_layers:
            m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=g) * std)


def _gpt2_mola(router: bool = False, seed: int = 0) -> MoLAModel:
    r = Router(num_experts=3, net=_TokenRouter(3)) if router else None
    model = apply_mola(_gpt2(seed), target_modules=GPT2_TARGETS, num_experts=3, rank=2, alpha=4.0, router=r)
    _randomise_experts(model)
    return model


class _TokenRouter(nn.Module):
    """A router on token ids: mean embedding of the prompt -> E logits."""

    def __init__(self, num_experts: int, vocab: int = 40):
        super().__init__()
        self.emb = nn.Embedding(vocab, 8)
        self.out = nn.Linear(8, num_experts)

    def forward(self, ids):
        return self.out(self.emb(ids).mean(1))


# ---------------------------------------------------------------- Conv1D == per-sample dense weights


def test_conv1d_per_sample_gating_equals_loop_over_dense_weights():
    torch.manual_seed(0)
    base = Conv1D(5, 6)  # nf = out = 5, nx = in = 6; weight (in, out), y = x W + b
    with torch.no_grad():
        base.bias.normal_()
    layer = MoLALinear(base, num_experts=4, rank=3, alpha=8.0)
    with torch.no_grad():
        layer.lora_B.normal_(std=0.1)
    assert layer.lora_A.shape == (4, 3, 6) and layer.lora_B.shape == (4, 5, 3)
    x = torch.randn(7, 3, 6)
    g = torch.softmax(torch.randn(7, 4), dim=1)
    out = layer(x, gates=g)
    dW = torch.stack([layer.lora_B[e] @ layer.lora_A[e] for e in range(4)]) * (8.0 / 3)  # (E, out, in)
    ref = torch.stack([x[i] @ (base.weight + (g[i].view(-1, 1, 1) * dW).sum(0).t()) + base.bias for i in range(7)])
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # merged: a Conv1D again, with ΔWᵀ folded into its (in, out) weight
    merged = layer.merged(torch.tensor([0.0, 1.0, 0.0, 0.0]))
    assert type(merged) is Conv1D
    torch.testing.assert_close(merged(x), layer(x, gates=torch.tensor([[0.0, 1.0, 0.0, 0.0]]).expand(7, 4)),
                               rtol=1e-5, atol=1e-5)


def test_gpt2_end_to_end_rows_equal_per_task_merged_models():
    base = _gpt2()
    ids = torch.randint(0, 40, (4, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref0 = base(ids).logits
    model = apply_mola(copy.deepcopy(base), target_modules=GPT2_TARGETS, num_experts=3, rank=2, alpha=4.0)
    assert len(model.mola_layers) == 2 * 4  # c_attn, attn.c_proj, c_fc, mlp.c_proj per block
    t = torch.tensor([0, 1, 2, 1])
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids, task_ids=t).logits, ref0)  # B = 0: the base GPT-2
    _randomise_experts(model)
    with torch.no_grad():
        out = model(input_ids=ids, task_ids=t).logits
        assert (out - ref0).abs().max() > 1e-2
        for task in range(3):
            rows = t == task
            want = model.merge(task)(ids[rows]).logits  # a plain GPT-2 with task `task`'s experts folded in
            torch.testing.assert_close(out[rows], want, rtol=1e-4, atol=1e-5)
    model(input_ids=ids, task_ids=t).logits.pow(2).mean().backward()
    layer = model.model.transformer.h[0].attn.c_attn
    assert layer.lora_A.grad is not None and layer.base.weight.grad is not None


# ---------------------------------------------------------------- generate


def _greedy_by_forward(model: MoLAModel, ids: torch.Tensor, steps: int, **kw) -> torch.Tensor:
    with torch.no_grad():
        for _ in range(steps):
            nxt = model(input_ids=ids, **kw).logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
    return ids


@pytest.mark.parametrize("make", [_gpt2, _llama])
def test_generate_equals_greedy_decoding_by_forward(make):
    targets = GPT2_TARGETS if make is _gpt2 else ["q_proj", "v_proj", "down_proj"]
    model = apply_mola(make(), target_modules=targets, num_experts=3, rank=2, alpha=4.0)
    _randomise_experts(model, std=1.0)
    ids = torch.randint(1, 40, (3, 5), generator=torch.Generator().manual_seed(3))
    t = torch.tensor([2, 0, 1])
    want = _greedy_by_forward(model, ids, 6, task_ids=t)
    got = model.generate(ids, task_ids=t, max_new_tokens=6, do_sample=False, pad_token_id=0)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    # the task id matters: other ids generate other tokens
    other = model.generate(input_ids=ids, task_ids=(t + 1) % 3, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert not torch.equal(other, got)


def test_generate_with_beams_and_router():
    model = _gpt2_mola()
    ids = torch.randint(1, 40, (2, 4), generator=torch.Generator().manual_seed(4))
    t = torch.tensor([1, 2])
    got = model.generate(ids, task_ids=t, max_new_tokens=4, num_beams=2, do_sample=False, pad_token_id=0)
    for i in range(2):  # each prompt's beams run with that prompt's expert
        want = model.merge(int(t[i])).generate(ids[i:i + 1], max_new_tokens=4, num_beams=2, do_sample=False,
                                               pad_token_id=0)
        torch.testing.assert_close(got[i:i + 1], want, rtol=0, atol=0)
    rmodel = _gpt2_mola(router=True)
    out = rmodel.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
    gates = rmodel.last_gates
    assert not gates.requires_grad and gates.shape == (2, 3)
    # = the same generation with the prompt's router mixture folded in, one prompt at a time
    for i in range(2):
        want = rmodel.merge(weights=gates[i]).generate(ids[i:i + 1], max_new_tokens=3, do_sample=False,
                                                       pad_token_id=0)
        torch.testing.assert_close(out[i:i + 1], want, rtol=0, atol=0)


def test_generate_errors():
    model = _gpt2_mola()
    with pytest.raises(ValueError, match="needs task_ids"):
        model.generate(torch.zeros(2, 3, dtype=torch.long), max_new_tokens=2)
    with pytest.raises(ValueError, match="generate needs the prompt"):
        model.generate(task_ids=torch.tensor([0, 1]), max_new_tokens=2)
    plain = apply_mola(nn.Sequential(nn.Linear(4, 4)), target_modules=["0"], num_experts=2, rank=1)
    with pytest.raises(TypeError, match="has no generate"):
        plain.generate(torch.randn(2, 4), task_ids=torch.tensor([0, 1]))


# ---------------------------------------------------------------- save_pretrained / from_pretrained


@pytest.mark.parametrize("router", [False, True])
def test_save_and_load_round_trip(tmp_path, router):
    model = _gpt2_mola(router=router)
    with torch.no_grad():  # train-like changes to the backbone, the adapted layers' bases and the router
        model.model.transformer.h[0].attn.c_attn.base.weight.add_(0.5)
        model.model.transformer.wte.weight.mul_(1.5)
        if router:
            model.gate.net.out.bias.add_(torch.tensor([3.0, -1.0, 0.0]))
    ids = torch.randint(0, 40, (3, 7), generator=torch.Generator().manual_seed(5))
    kw = {} if router else {"task_ids": torch.tensor([0, 2, 1])}
    with torch.no_grad():
        want = model(input_ids=ids, **kw).logits
    model.save_pretrained(tmp_path)
    r2 = Router(num_experts=3, net=_TokenRouter(3)) if router else None  # fresh weights, loaded from the folder
    loaded = MoLAModel.from_pretrained(tmp_path, model_class=GPT2LMHeadModel, router=r2)
    assert [n for n, m in loaded.model.named_modules() if isinstance(m, MoLALinear)] == \
        [n for n, m in model.model.named_modules() if isinstance(m, MoLALinear)]
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(input_ids=ids, **kw).logits, want, rtol=0, atol=0)
    # the folder's backbone is a plain GPT-2 in its own layout: the adapted layers' trained base weights load
    plain = GPT2LMHeadModel.from_pretrained(tmp_path)
    torch.testing.assert_close(plain.transformer.h[0].attn.c_attn.weight,
                               model.model.transformer.h[0].attn.c_attn.base.weight)


def test_save_and_load_refusals(tmp_path):
    model = _gpt2_mola()
    with pytest.raises(RuntimeError, match="its own save_pretrained would store"):
        model.model.save_pretrained(tmp_path / "inner")  # the silent re-initialisation path is refused
    model.merge(0).save_pretrained(tmp_path / "merged")  # a merged copy is a plain model again
    model.save_pretrained(tmp_path / "m")
    with pytest.raises(ValueError, match="MoLA-Grad"):
        MoLAModel.from_pretrained(tmp_path / "m", model_class=GPT2LMHeadModel,
                                  router=Router(num_experts=3, net=_TokenRouter(3)))
    _gpt2_mola(router=True).save_pretrained(tmp_path / "r")
    with pytest.raises(ValueError, match="pass router="):
        MoLAModel.from_pretrained(tmp_path / "r", model_class=GPT2LMHeadModel)
    with pytest.raises(FileNotFoundError, match="mola_config.json"):
        MoLAModel.from_pretrained(tmp_path / "merged", model_class=GPT2LMHeadModel)
    plain = apply_mola(nn.Sequential(nn.Linear(4, 4)), target_modules=["0"], num_experts=2, rank=1)
    with pytest.raises(TypeError, match="needs a Hugging Face model"):
        plain.save_pretrained(tmp_path / "p")
    with pytest.raises(ValueError, match="do not pass state_dict"):
        model.save_pretrained(tmp_path / "s", state_dict={})


def test_conv1d_type_error_names_conv1d():
    with pytest.raises(TypeError, match="nn.Linear or transformers' Conv1D"):
        MoLALinear(nn.Conv2d(2, 2, 1), num_experts=2, rank=1)
    model = _gpt2()
    with pytest.raises(TypeError, match="Conv1D"):
        apply_mola(model, target_modules=["ln_1"], num_experts=2, rank=1)
    assert F is not None
