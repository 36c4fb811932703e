"""LoRA+ API: grouping rules by name, peft equivalence, init modes, toy scaling law, errors."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from torch import nn

from icml24.loraplus import (
    GROUP_ORDER,
    LoRALinear,
    apply_lora,
    create_loraplus_optimizer,
    loraplus_param_groups,
    toy_feature_updates,
)
from icml24.loraplus.experiment import finetune, make_task


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 8)
        self.q_proj = nn.Linear(8, 8)
        self.v_proj = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 3)

    def forward(self, ids):
        h = self.embed(ids)
        return self.head(self.norm(self.q_proj(h) + self.v_proj(h))).mean(1)


def _groups(opt):
    return {g["group"]: (sorted(g["param_names"]), g["lr"], g["weight_decay"]) for g in opt.param_groups}


def test_grouping_rules_by_name():
    model = apply_lora(Tiny(), target_modules=["q_proj", "v_proj"], r=2, modules_to_save=["norm", "head"])
    opt = create_loraplus_optimizer(model, optimizer_cls=torch.optim.AdamW, lr=1e-3, loraplus_lr_ratio=8,
                                    weight_decay=0.01)
    g = _groups(opt)
    assert [p["group"] for p in opt.param_groups] == list(GROUP_ORDER)
    assert g["A"] == (["head.weight", "q_proj.lora_A", "v_proj.lora_A"], 1e-3, 0.01)  # 2-D head: slow group
    assert g["B"] == (["q_proj.lora_B", "v_proj.lora_B"], 8e-3, 0.01)
    assert g["B_no_decay"] == (["head.bias", "norm.bias", "norm.weight"], 8e-3, 0.0)  # every 1-D tensor: fast
    assert g["embedding"] == ([], 1e-6, 0.01)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {"embed.weight", "q_proj.base.weight", "q_proj.base.bias", "v_proj.base.weight",
                      "v_proj.base.bias"}
    assert not frozen & {n for grp in g.values() for n in grp[0]}


def test_optimizer_step_changes_only_trainable_parameters():
    torch.manual_seed(0)
    model = apply_lora(Tiny(), target_modules=["q_proj", "v_proj"], r=2, modules_to_save=["head"])
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = create_loraplus_optimizer(model, optimizer_cls=torch.optim.Adam, lr=1e-2)
    for _ in range(2):  # B = 0 at init, so A only moves from the second step on
        opt.zero_grad()
        model(torch.randint(0, 11, (4, 5))).pow(2).sum().backward()
        opt.step()
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]) != p.requires_grad, n


def test_peft_groups_equal_ours_by_name_and_lr():
    peft = pytest.importorskip("peft")
    from peft.optimizers import create_loraplus_optimizer as peft_loraplus

    torch.manual_seed(0)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "embed"],
                             modules_to_save=["head"])
    model = peft.get_peft_model(Tiny(), config)
    for n, p in model.named_parameters():  # a trainable LayerNorm too, to exercise B_no_decay
        if ".norm." in n:
            p.requires_grad_(True)
    ours = create_loraplus_optimizer(model, optimizer_cls=torch.optim.AdamW, lr=2e-4, loraplus_lr_ratio=16,
                                     loraplus_weight_decay=0.1, loraplus_lr_embedding=1e-5)
    theirs = peft_loraplus(model, torch.optim.AdamW, lr=2e-4, loraplus_lr_ratio=16, loraplus_weight_decay=0.1,
                           loraplus_lr_embedding=1e-5)
    name_of = {id(p): n for n, p in model.named_parameters()}
    theirs_named = [(sorted(name_of[id(p)] for p in g["params"]), g["lr"], g["weight_decay"])
                    for g in theirs.param_groups]
    ours_named = [(sorted(g["param_names"]), g["lr"], g["weight_decay"]) for g in ours.param_groups]
    assert ours_named == theirs_named
    emb = ours_named[GROUP_ORDER.index("embedding")][0]
    assert emb and all("lora_embedding" in n for n in emb)  # LoRA on embeddings gets its own lr
    assert ours_named[GROUP_ORDER.index("B_no_decay")][0]


def test_weight_decay_kwarg_is_honoured():
    model = apply_lora(Tiny(), target_modules=["q_proj"], r=2)
    opt = create_loraplus_optimizer(model, optimizer_cls=torch.optim.AdamW, lr=1e-3, weight_decay=0.05)
    assert _groups(opt)["A"][2] == 0.05 and _groups(opt)["B"][2] == 0.05


def test_ratio_is_preserved_by_schedulers():
    model = apply_lora(Tiny(), target_modules=["q_proj"], r=2)
    opt = create_loraplus_optimizer(model, optimizer_cls=torch.optim.SGD, lr=0.1, loraplus_lr_ratio=4)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.25, total_iters=4)
    for _ in range(2):
        opt.step()
        sched.step()
    lrs = {g["group"]: g["lr"] for g in opt.param_groups}
    assert lrs["B"] / lrs["A"] == pytest.approx(4.0)


@pytest.mark.parametrize("init", ["A", "B"])
def test_init_modes(init):
    torch.manual_seed(0)
    layer = LoRALinear(nn.Linear(16, 32), r=4, alpha=8, init=init)
    zero, rand = (layer.lora_B, layer.lora_A) if init == "A" else (layer.lora_A, layer.lora_B)
    assert torch.count_nonzero(zero) == 0 and torch.count_nonzero(rand) == rand.numel()
    bound = 1 / math.sqrt(rand.shape[1])  # kaiming_uniform(a=√5) = U(-1/√fan_in, 1/√fan_in)
    assert rand.abs().max() <= bound
    x = torch.randn(5, 16)
    torch.testing.assert_close(layer(x), layer.base(x))  # BA = 0 at init either way


def test_lora_linear_equals_merged_weight_and_delta():
    torch.manual_seed(1)
    layer = LoRALinear(nn.Linear(6, 4), r=2, alpha=3.0)
    nn.init.normal_(layer.lora_B)
    x = torch.randn(7, 6)
    ref = x @ (layer.base.weight + (3.0 / 2) * layer.lora_B @ layer.lora_A).T + layer.base.bias
    torch.testing.assert_close(layer(x), ref)
    torch.testing.assert_close(layer.merged()(x), ref)
    torch.testing.assert_close(layer.base(x) + layer.lora_delta(x), ref)


def test_cached_finetune_matches_full_forward():
    """``finetune`` caches the frozen pre-activation; one Adam step must equal the plain model's step."""
    task = make_task(width=32, in_dim=4, n_samples=16, target_rank=2, seed=0)
    curve = finetune(task, ratio=4.0, lr=1e-2, rank=2, steps=3, seed=0)
    torch.manual_seed(0)
    from icml24.common.nets import MLP

    model = apply_lora(MLP(in_features=4, hidden=[32, 32], out_features=1, bias=False), target_modules=["2"], r=2)
    model.load_state_dict(task.model.state_dict(), strict=False)
    opt = create_loraplus_optimizer(model, optimizer_cls=torch.optim.Adam, lr=1e-2, loraplus_lr_ratio=4.0)
    losses = []
    for _ in range(4):
        loss = (model(task.x) - task.y).pow(2).mean()
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    np.testing.assert_allclose(curve, np.array(losses) / losses[0], rtol=1e-5)
    assert curve[-1] < 1.0


def test_same_seed_same_curve():
    task = make_task(width=16, in_dim=4, n_samples=8, target_rank=2, seed=3)
    a = finetune(task, ratio=16.0, lr=3e-2, rank=2, steps=5, seed=3)
    b = finetune(make_task(width=16, in_dim=4, n_samples=8, target_rank=2, seed=3), ratio=16.0, lr=3e-2, rank=2,
                 steps=5, seed=3)
    np.testing.assert_array_equal(a, b)


def test_toy_width_scaling_law():
    """Paper §3 / notes §5.1: (c/n, c) keeps both feature updates Θ(1); a shared lr does not."""
    widths, c = [64, 256, 1024, 4096], 0.1
    plus = [toy_feature_updates(n=n, eta_a=c / n, eta_b=c, draws=1024) for n in widths]
    small = [toy_feature_updates(n=n, eta_a=c / n, eta_b=c / n, draws=1024) for n in widths]
    large = [toy_feature_updates(n=n, eta_a=c, eta_b=c, draws=1024) for n in widths]
    for key in ("delta_A", "delta_B"):
        vals = [r[key] for r in plus]
        assert max(vals) / min(vals) < 4
    assert small[0]["delta_B"] / small[-1]["delta_B"] > 30
    assert large[-1]["delta_A"] / large[0]["delta_A"] > 30


@pytest.mark.parametrize("kwargs, match", [
    ({"loraplus_lr_ratio": 0.5}, "loraplus_lr_ratio must be a finite number >= 1"),
    ({"loraplus_lr_ratio": float("inf")}, "loraplus_lr_ratio must be a finite number"),
    ({"lr": 0.0}, "lr must be a finite number > 0"),
    ({"lr": -1e-3}, "lr must be a finite number > 0"),
    ({"loraplus_weight_decay": -0.1}, "weight_decay must be a finite number >= 0"),
])
def test_bad_optimizer_arguments(kwargs, match):
    model = apply_lora(Tiny(), target_modules=["q_proj"], r=2)
    args = {"optimizer_cls": torch.optim.AdamW, "lr": 1e-3} | kwargs
    with pytest.raises(ValueError, match=match):
        create_loraplus_optimizer(model, **args)


def test_model_without_lora_is_rejected():
    with pytest.raises(ValueError, match="no trainable LoRA parameters"):
        loraplus_param_groups(Tiny(), lr=1e-3)


@pytest.mark.parametrize("kwargs, match", [
    ({"target_modules": ["k_proj"], "r": 2}, "match no nn.Linear"),
    ({"target_modules": ["embed"], "r": 2}, "match no nn.Linear"),
    ({"target_modules": ["q_proj"], "r": 0}, "r must be an int >= 1"),
    ({"target_modules": [], "r": 2}, "target_modules is empty"),
])
def test_bad_apply_lora_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        apply_lora(Tiny(), **kwargs)


def test_bad_layer_arguments():
    with pytest.raises(ValueError, match="init must be one of 'A', 'B'"):
        LoRALinear(nn.Linear(2, 2), r=1, init="C")
    with pytest.raises(TypeError, match="must be an nn.Linear"):
        LoRALinear(nn.Conv1d(2, 2, 1), r=1)


# ---------------------------------------------------------------- drop-in: peft's call, norms by name, old torch
def test_peft_positional_call_and_numpy_tensor_lr():
    model = apply_lora(Tiny(), target_modules=["q_proj", "v_proj"], r=2, modules_to_save=["norm", "head"])
    ref = _groups(create_loraplus_optimizer(model, optimizer_cls=torch.optim.AdamW, lr=1e-3, loraplus_lr_ratio=8))
    for lr in (np.float32(1e-3), np.float64(1e-3), torch.tensor(1e-3, dtype=torch.float64)):
        opt = create_loraplus_optimizer(model, torch.optim.AdamW, lr=lr, loraplus_lr_ratio=np.int64(8))
        assert all(type(g["lr"]) is float for g in opt.param_groups)
        got = _groups(opt)
        for name, (names, glr, wd) in ref.items():
            assert got[name][0] == names and got[name][2] == wd
            assert got[name][1] == pytest.approx(glr, rel=1e-6)
        assert opt.defaults["lr"] == pytest.approx(1e-3, rel=1e-6) and type(opt.defaults["lr"]) is float
    with pytest.raises(TypeError, match="lr must be a finite number > 0, got str"):
        create_loraplus_optimizer(model, torch.optim.AdamW, lr="1e-3")
    with pytest.raises(TypeError, match="optimizer_cls must be a torch.optim.Optimizer subclass"):
        create_loraplus_optimizer(model, "adamw", lr=1e-3)


class _CustomNorm(nn.Module):  # a norm that is neither nn.LayerNorm nor named like one by its class
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * self.weight


class LlamaLikeRMSNorm(_CustomNorm):
    pass


class Named(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(8, 8)
        self.input_layernorm = _CustomNorm(8)   # name rule: layernorm
        self.norm = _CustomNorm(8)              # name rule: (^|.)norm(.|$)
        self.q_norm = _CustomNorm(8)            # name rule: _norm(.|$)
        self.ln = LlamaLikeRMSNorm(8)           # type rule: class named *RMSNorm
        self.gate = _CustomNorm(8)              # neither: a 1-D weight that is decayed
        self.normalizer = _CustomNorm(8)        # 'norm' inside a longer word: decayed, as in transformers

    def forward(self, x):
        return self.normalizer(self.gate(self.ln(self.q_norm(self.norm(self.input_layernorm(self.q_proj(x)))))))


def test_norms_are_kept_out_of_decay_by_name_and_by_type():
    model = apply_lora(Named(), target_modules=["q_proj"], r=2,
                       modules_to_save=["input_layernorm", "norm", "q_norm", "ln", "gate", "normalizer"])
    g = _groups(create_loraplus_optimizer(model, torch.optim.AdamW, lr=1e-3, weight_decay=0.1))
    assert g["B_no_decay"][0] == ["input_layernorm.weight", "ln.weight", "norm.weight", "q_norm.weight"]
    assert g["B"][0] == ["gate.weight", "normalizer.weight", "q_proj.lora_B"]


def test_no_decay_agrees_with_transformers_trainer_on_a_llama():
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16)
    model = peft.get_peft_model(transformers.LlamaForCausalLM(cfg),
                                peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    for _n, p in model.named_parameters():
        if p.ndim == 1:
            p.requires_grad_(True)  # every norm weight trainable: the case the decay rule decides
    decay = set(transformers.Trainer.get_decay_parameter_names(None, model))
    g = _groups(create_loraplus_optimizer(model, torch.optim.AdamW, lr=1e-3, weight_decay=0.1))
    one_d = [n for n, p in model.named_parameters() if p.requires_grad and p.ndim == 1]
    assert len(one_d) == 2 * 2 + 1  # two norms per layer and the final norm
    assert set(g["B_no_decay"][0]) == {n for n in one_d if n not in decay} == set(one_d)
    assert not set(g["B"][0]) - decay


def test_import_works_without_nn_rmsnorm(monkeypatch):
    import importlib

    import icml24.loraplus.optimizer as mod
    monkeypatch.delattr(nn, "RMSNorm", raising=False)
    try:
        fresh = importlib.reload(mod)
        assert fresh._NO_DECAY_LAYERS == (nn.LayerNorm,)
        model = apply_lora(Tiny(), target_modules=["q_proj"], r=2, modules_to_save=["norm"])
        opt = fresh.create_loraplus_optimizer(model, torch.optim.AdamW, lr=1e-3, weight_decay=0.1)
        assert sorted(opt.param_groups[3]["param_names"]) == ["norm.bias", "norm.weight"]
    finally:
        monkeypatch.undo()
        importlib.reload(mod)
    assert nn.RMSNorm in mod._NO_DECAY_LAYERS


def test_trainer_accepts_the_optimizer(tmp_path):
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16)
    model = peft.get_peft_model(transformers.LlamaForCausalLM(cfg),
                                peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    opt = create_loraplus_optimizer(model, torch.optim.AdamW, lr=np.float64(1e-3), loraplus_lr_ratio=16)
    b_before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_B" in n}
    ids = torch.randint(0, 32, (8, 6))
    args = transformers.TrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4,
                                          lr_scheduler_type="constant", report_to="none", save_strategy="no",
                                          use_cpu=True, disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=[{"input_ids": x, "labels": x} for x in ids],
                                   optimizers=(opt, None))
    trainer.train()
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([1e-3, 1e-6, 1.6e-2, 1.6e-2])
    assert any(not torch.equal(p, b_before[n]) for n, p in model.named_parameters() if "lora_B" in n)


# ---------------------------------------------------------------- kohya names (issue 31): lora_up is B, lora_down A
class KohyaLoRAModule(nn.Module):
    """sd-scripts' ``networks/lora.py`` layout: ``lora_down`` (A, reads x), ``lora_up`` (B, zero init), ``alpha``."""

    def __init__(self, org: nn.Module, dim: int = 2):
        super().__init__()
        if isinstance(org, nn.Conv2d):
            self.lora_down = nn.Conv2d(org.in_channels, dim, org.kernel_size, bias=False)
            self.lora_up = nn.Conv2d(dim, org.out_channels, 1, bias=False)
        else:
            self.lora_down = nn.Linear(org.in_features, dim, bias=False)
            self.lora_up = nn.Linear(dim, org.out_features, bias=False)
        nn.init.zeros_(self.lora_up.weight)
        self.register_buffer("alpha", torch.tensor(float(dim)))


KOHYA_NAMES = ("lora_unet_down_blocks_0_attentions_0_proj_in", "lora_te_text_model_encoder_layers_0_self_attn_q_proj")


def _kohya_network() -> nn.Module:
    net = nn.Module()  # sd-scripts' LoRANetwork registers each LoRAModule under its flattened lora_name
    net.add_module(KOHYA_NAMES[0], KohyaLoRAModule(nn.Conv2d(4, 8, 3)))  # 4-D lora_up: must still be B
    net.add_module(KOHYA_NAMES[1], KohyaLoRAModule(nn.Linear(8, 8)))
    return net


def test_kohya_lora_up_is_fast_and_lora_down_slow_by_name():
    opt = create_loraplus_optimizer(_kohya_network(), torch.optim.AdamW, lr=1e-4, loraplus_lr_ratio=16)
    g = _groups(opt)
    assert g["A"] == (sorted(f"{m}.lora_down.weight" for m in KOHYA_NAMES), 1e-4, 0.0)
    assert g["B"] == (sorted(f"{m}.lora_up.weight" for m in KOHYA_NAMES), pytest.approx(1.6e-3), 0.0)
    assert g["embedding"][0] == [] and g["B_no_decay"][0] == []


def test_both_conventions_in_one_model_are_grouped_by_their_own_names():
    model = nn.Module()
    model.text = apply_lora(Tiny(), target_modules=["q_proj", "v_proj"], r=2)  # peft names: lora_A / lora_B
    model.unet = _kohya_network()  # kohya names: lora_down / lora_up
    g = _groups(create_loraplus_optimizer(model, torch.optim.AdamW, lr=1e-3, loraplus_lr_ratio=4))
    assert g["A"][0] == sorted([f"unet.{m}.lora_down.weight" for m in KOHYA_NAMES]
                               + ["text.q_proj.lora_A", "text.v_proj.lora_A"])
    assert g["B"][0] == sorted([f"unet.{m}.lora_up.weight" for m in KOHYA_NAMES]
                               + ["text.q_proj.lora_B", "text.v_proj.lora_B"])
    assert g["B"][1] == pytest.approx(4e-3)


class _Named(nn.Module):
    """A LoRA layer plus one extra trainable parameter registered under an arbitrary (dotted) name."""

    def __init__(self, extra: str):
        super().__init__()
        self.layer = LoRALinear(nn.Linear(4, 4), r=1)
        owner = self
        *path, leaf = extra.split(".")
        for part in path:
            if not hasattr(owner, part):
                owner.add_module(part, nn.Module())
            owner = getattr(owner, part)
        owner.register_parameter(leaf, nn.Parameter(torch.zeros(4, 4)))


@pytest.mark.parametrize("extra", [
    "lora_unet_mid_block_proj_in.lora_mid.weight",  # LyCORIS' Tucker core: neither A/B nor up/down
    "attn.processor.to_q_lora.up.weight",  # diffusers' old LoRALinearLayer (up/down without the lora_ prefix)
    "lora_unet_mid_block_proj_in.weight",  # a trainable tensor of a kohya-named module that is no adapter side
    "lora_te_q_proj.lora_up.lora_A",  # two roles in one name
])
def test_unrecognised_adapter_name_is_refused_naming_it(extra):
    with pytest.raises(ValueError, match=re.escape(repr(extra))):
        loraplus_param_groups(_Named(extra), lr=1e-3)


@pytest.mark.parametrize("extra", ["flora.weight", "explorations.weight"])
def test_lora_inside_another_word_is_not_an_adapter(extra):
    g = {d["group"]: d["param_names"] for d in loraplus_param_groups(_Named(extra), lr=1e-3)}
    assert g["A"] == ["layer.lora_A", extra] and g["B"] == ["layer.lora_B"]


def test_frozen_unrecognised_adapter_is_ignored():
    model = _Named("lora_unet_x.lora_mid.weight")
    model.lora_unet_x.lora_mid.weight.requires_grad_(False)
    assert loraplus_param_groups(model, lr=1e-3)[0]["param_names"] == ["layer.lora_A"]


@pytest.mark.parametrize("kind", ["dora", "adalora"])
def test_peft_dora_and_adalora_groups_equal_peft(kind):
    peft = pytest.importorskip("peft")
    from peft.optimizers import create_loraplus_optimizer as peft_loraplus

    torch.manual_seed(0)
    config = (peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"], use_dora=True) if kind == "dora"
              else peft.AdaLoraConfig(init_r=2, target_modules=["q_proj", "v_proj"], total_step=10))
    model = peft.get_peft_model(Tiny(), config)
    extra = "lora_magnitude_vector" if kind == "dora" else "lora_E"
    assert any(extra in n for n, p in model.named_parameters() if p.requires_grad)
    ours = create_loraplus_optimizer(model, torch.optim.AdamW, lr=2e-4, loraplus_lr_ratio=16)
    theirs = peft_loraplus(model, torch.optim.AdamW, lr=2e-4, loraplus_lr_ratio=16)
    name_of = {id(p): n for n, p in model.named_parameters()}
    assert ([sorted(g["param_names"]) for g in ours.param_groups]
            == [sorted(name_of[id(p)] for p in g["params"]) for g in theirs.param_groups])
