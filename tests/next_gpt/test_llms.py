"""Any Hugging Face causal LM, any encoder shape: NExT-GPT on a tiny ``GPT2LMHeadModel`` (fused ``Conv1D``
projections, tied head) and a tiny ``LlamaForCausalLM`` (grouped-query attention) built from configs, an encoder
with another input size and token outputs, and clear refusals of what it cannot drive."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from icml24.next_gpt import world as W
from icml24.next_gpt.components import FrozenConfig, train_frozen_shell
from icml24.next_gpt.experiment import samplers
from icml24.next_gpt.model import LoRAConv1D, Media, NExTGPT, NExTGPTConfig, StageConfig, train_stage

transformers = pytest.importorskip("transformers")

MODS = ("image",)
CFG = NExTGPTConfig(modalities=MODS, n_signal=(3,), projector_hidden=16, lora_rank=4, lora_alpha=8.0)


@pytest.fixture(scope="module")
def world():
    torch.manual_seed(0)
    return train_frozen_shell(FrozenConfig(modalities=MODS, llm_hidden=32, decoder_channels=8))


def _frozen(m: nn.Module) -> nn.Module:
    m.eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m


def _gpt2(vocab: int) -> nn.Module:
    torch.manual_seed(0)
    return _frozen(transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=256, bos_token_id=1, eos_token_id=1)))


def _llama(vocab: int) -> nn.Module:
    torch.manual_seed(0)
    return _frozen(transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True, pad_token_id=0)))


LLMS = {"gpt2": (_gpt2, {"c_attn", "c_proj"}), "llama": (_llama, {"q_proj", "k_proj", "v_proj", "o_proj"})}


@pytest.mark.parametrize("kind", sorted(LLMS))
def test_any_causal_lm_runs_every_stage_and_generates(world, kind):
    build, proj = LLMS[kind]
    llm = build(len(world.tok))
    m = NExTGPT(frozen=dataclasses.replace(world, llm=llm), config=CFG, seed=0)
    # LoRA targets: every decoder layer's attention projections, nothing from the MLPs
    assert {t.rsplit(".", 1)[-1] for t in m.lora_targets} == proj and len(m.lora_targets) == 2 * len(proj)
    assert all(".mlp." not in t for t in m.lora_targets)
    # the forward is the model's own: base logits equal HF's on input_ids, and the states the new head rows read
    # are the ones HF's LM head reads
    ids = torch.tensor([world.tok.encode("human: show me a large red circle ### assistant:")])
    with torch.no_grad():
        h, logits = m.hidden(m.embed(ids), torch.ones_like(ids))
        ref = m.llm(input_ids=ids, output_hidden_states=True)
    torch.testing.assert_close(logits[..., :m.base_vocab], ref.logits)
    torch.testing.assert_close(h, ref.hidden_states[-1])
    torch.testing.assert_close(m.llm.get_output_embeddings()(h), ref.logits)
    torch.testing.assert_close(logits[..., m.base_vocab:], h @ m.new_head.T)
    # left padding inside the batched decoder does not change any row on this model either
    rng = np.random.default_rng(2)
    dias = [W.mosit_dialogue([W.IMAGE], rng, turns=(1, 3)) for _ in range(3)]
    together = m.respond(dias, rng=np.random.default_rng(0), decode=False, max_new_tokens=4)
    alone = [m.respond([d], rng=np.random.default_rng(0), decode=False, max_new_tokens=4)[0] for d in dias]
    assert [g.tokens for g in together] == [g.tokens for g in alone]
    # the three stages: frozen parts stay bit-identical, stage 3 moves the LoRA factors
    S = samplers([W.IMAGE])
    h0 = m.frozen_hashes()
    for stage in (1, 2, 3):
        if stage == 3:
            m.enable_lora()
        before = {n: p.detach().clone() for n, p in m.named_parameters()}
        train_stage(m, stage, S[f"stage{stage}"], StageConfig(steps=2, lr=1e-2, batch=3), seed=stage)
        assert m.frozen_hashes() == h0, f"{kind}: a frozen module changed in stage {stage}"
        changed = {n for n, p in m.named_parameters() if not torch.equal(before[n], p)}
        assert changed and changed <= set(m.trainable_names(stage))
    assert any("lora_B" in n for n in changed)
    g = m.generate(inputs=["show me a large red circle"], max_new_tokens=4, ddim_steps=2)
    assert isinstance(g.text, str)


def test_lora_on_gpt2_conv1d_is_the_low_rank_weight_update(world):
    m = NExTGPT(frozen=dataclasses.replace(world, llm=_gpt2(len(world.tok))), config=CFG, seed=0)
    m.enable_lora()
    layer = m.llm.get_submodule(next(t for t in m.lora_targets if t.endswith("c_attn")))
    assert isinstance(layer, LoRAConv1D)
    assert torch.count_nonzero(layer.lora_B) == 0  # starts at the frozen model
    with torch.no_grad():
        layer.lora_B.normal_()
    x = torch.randn(2, 5, 32)
    w = layer.base.weight + layer.scaling * (layer.lora_B @ layer.lora_A).T  # Conv1D: y = x W + b, W (in, out)
    torch.testing.assert_close(layer(x), x @ w + layer.base.bias)


class PatchEncoder(nn.Module):
    """A ViT-style stand-in: 3x32x32 images -> 16 patch tokens of width 24 (the world's encoder: 16x16 -> 64)."""

    modalities = ("image",)

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.patch = nn.Conv2d(3, 24, 8, stride=8)

    def input_shape(self, modality: str) -> tuple[int, ...]:
        return (3, 32, 32)

    def encode(self, modality: str, x: torch.Tensor) -> torch.Tensor:
        return self.patch(x).flatten(2).transpose(1, 2)


class PooledEncoder(nn.Module):
    """Takes any image size (adaptive pooling) and says only its width."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(3 * 4, 20)

    def output_dim(self, modality: str) -> int:
        return 20

    def encode(self, modality: str, x: torch.Tensor) -> torch.Tensor:
        return self.head(nn.functional.adaptive_avg_pool2d(x, (2, 2)).flatten(1))


def test_an_encoder_with_another_input_size_and_token_outputs(world):
    enc = _frozen(PatchEncoder())
    m = NExTGPT(frozen=dataclasses.replace(world, encoder=enc), config=CFG, seed=0)
    assert m.input_proj.in_features == 24
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        got = m.encode_media([Media("image", x[0]), Media("image", x[1])])
        torch.testing.assert_close(got, m.input_proj(enc.encode("image", x).mean(1)))  # tokens pooled to one
    g = m.generate(inputs=["describe this", Media("image", x[0])], max_new_tokens=3, ddim_steps=2)
    assert isinstance(g.text, str)
    with pytest.raises(ValueError, match=r"image input must have shape \(3, 32, 32\)"):
        m.generate(inputs=["describe this", Media("image", torch.zeros(3, 16, 16))])
    # a teacher-forced step with such media trains the input projection
    turn = W.Turn(human="describe this", in_modality="image", in_data=x[0], answer="a large red circle")
    m.set_stage(1)
    out = m.losses(m.build([[turn]], train=True, rng=np.random.default_rng(0)))
    out["nll"].backward()
    assert torch.isfinite(out["nll"]) and m.input_proj.weight.grad.abs().sum() > 0

    m2 = NExTGPT(frozen=dataclasses.replace(world, encoder=_frozen(PooledEncoder())), config=CFG, seed=0)
    assert m2.input_proj.in_features == 20
    assert m2.encode_media([Media("image", torch.randn(3, 40, 24))]).shape == (1, m2.d_llm)  # any size


def test_what_cannot_be_driven_is_refused_naming_what_is_missing(world):
    with pytest.raises(TypeError, match="Hugging Face causal LM.*has no get_input_embeddings"):
        NExTGPT(frozen=dataclasses.replace(world, llm=nn.Linear(4, 4)), config=CFG)
    bare = _frozen(transformers.LlamaModel(world.llm.config))
    with pytest.raises(TypeError, match=r"get_output_embeddings\(\) returns no LM head"):
        NExTGPT(frozen=dataclasses.replace(world, llm=bare), config=CFG)
    odd = _llama(len(world.tok))
    odd.config.num_hidden_layers = 3  # the decoder blocks cannot be told apart from other module lists
    with pytest.raises(ValueError, match="found no decoder layers.*lora_targets"):
        NExTGPT(frozen=dataclasses.replace(world, llm=odd), config=CFG)
    assert len(NExTGPT(frozen=dataclasses.replace(world, llm=odd), config=CFG,
                       lora_targets=["q_proj", "v_proj"]).lora_targets) == 4  # the escape hatch
    with pytest.raises(ValueError, match="lora_targets.*match no nn.Linear"):
        NExTGPT(frozen=world, config=CFG, lora_targets=["query"])

    class NoEncode(nn.Module):
        pass

    with pytest.raises(TypeError, match=r"encode\(modality, x\)"):
        NExTGPT(frozen=dataclasses.replace(world, encoder=NoEncode()), config=CFG)

    class Silent(nn.Module):
        def encode(self, modality, x):
            return x.flatten(1)

    with pytest.raises(ValueError, match=r"output_dim\(modality\) or input_shape\(modality\)"):
        NExTGPT(frozen=dataclasses.replace(world, encoder=Silent()), config=CFG)
