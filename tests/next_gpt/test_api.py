"""NExT-GPT API: frozen parts stay frozen, only declared parameters learn, signal-block parsing, projector
shapes, the alignment loss, checkpoints, and bad input (all on small untrained or briefly trained parts)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from icml24.next_gpt import world as W
from icml24.next_gpt.components import FrozenConfig, train_frozen_shell
from icml24.next_gpt.experiment import Config, samplers
from icml24.next_gpt.model import (
    Media,
    NExTGPT,
    NExTGPTConfig,
    OutputProjector,
    StageConfig,
    l2_loss,
    module_hash,
    train_stage,
)

MODS = ("image", "audio")


@pytest.fixture(scope="module")
def frozen():
    torch.manual_seed(0)
    return train_frozen_shell(FrozenConfig(modalities=MODS, llm_hidden=32, decoder_channels=8))


def _model(frozen, **kw):
    return NExTGPT(frozen=frozen, config=NExTGPTConfig(modalities=MODS, n_signal=(4, 3), projector_hidden=16,
                                                       **kw), seed=0)


def test_frozen_modules_bit_identical_after_each_stage_and_only_declared_params_learn(frozen):
    m = _model(frozen)
    S = samplers([W.spec(x) for x in MODS])
    h0 = m.frozen_hashes()
    for stage, key in ((1, "stage1"), (2, "stage2"), (3, "stage3")):
        if stage == 3:
            m.enable_lora()  # so that the LoRA factors are in the snapshot
        before = {n: p.detach().clone() for n, p in m.named_parameters()}
        train_stage(m, stage, S[key], StageConfig(steps=2, lr=1e-2, batch=4), seed=stage)
        assert m.frozen_hashes() == h0, f"a frozen module changed in stage {stage}"
        declared = set(m.trainable_names(stage))
        changed = {n for n, p in m.named_parameters() if n in before and not torch.equal(before[n], p)}
        assert changed and changed <= declared, sorted(changed - declared)[:3]
        # every declared group actually moved (stage 1: input projection; 2: projectors; 3: LoRA B)
        want = {1: "input_proj.weight", 2: "output_projectors.", 3: "lora_B"}[stage]
        assert any(want in n for n in changed)
        rows = m.trainable_rows(stage)  # new token rows outside the stage's set stay bit-identical
        assert torch.equal(before["new_embed"][~rows], m.new_embed[~rows])
        assert torch.equal(before["new_head"][~rows], m.new_head[~rows])
        assert not torch.equal(before["new_head"][rows], m.new_head[rows])
        assert all(not p.requires_grad for p in frozen.encoder.parameters())
    frac = m.trainable_fraction(3)
    names3 = set(m.trainable_names(3)) - {"new_embed", "new_head"}
    assert 0 < frac["fraction"] < 1 and frac["trainable"] == sum(
        p.numel() for n, p in m.named_parameters() if n in names3) + m.new_embed.numel() + m.new_head.numel()
    f1 = m.trainable_fraction(1)
    assert f1["trainable"] == m.input_proj.weight.numel() + m.input_proj.bias.numel() + \
        2 * int(m.trainable_rows(1).sum()) * m.d_llm


def test_trainable_names_per_stage(frozen):
    m = _model(frozen)
    m.enable_lora()
    s1, s2, s3 = (set(m.trainable_names(s)) for s in (1, 2, 3))
    assert any(n.startswith("input_proj") for n in s1) and not any("output_projectors" in n for n in s1)
    assert not any(n.startswith("input_proj") for n in s2) and any("output_projectors" in n for n in s2)
    assert any(".lora_" in n for n in s3) and not any(".lora_" in n for n in s1 | s2)
    assert {"new_embed", "new_head"} <= s1 & s2 & s3
    assert not any(n.endswith(("q_proj.base.weight", "embed_tokens.weight", "lm_head.weight")) for n in s3)


def test_signal_block_parsing_complete_partial_absent(frozen):
    m = _model(frozen)
    img, aud = m.signal_ids["image"], m.signal_ids["audio"]
    words = m.tok.encode("here is the picture")
    got = m.parse_signal_blocks(words + img + [m.sep_id])
    assert got["image"] == {"status": "complete", "start": len(words)} and got["audio"]["status"] == "absent"
    assert m.parse_signal_blocks(words + img[:2])["image"]["status"] == "partial"
    assert m.parse_signal_blocks(words + img[::-1])["image"]["status"] == "partial"  # out of order
    assert m.parse_signal_blocks(img[:2] + words + img)["image"] == {"status": "complete", "start": 2 + len(words)}
    both = m.parse_signal_blocks(aud + img)
    assert both["audio"]["start"] == 0 and both["image"]["start"] == len(aud)
    assert all(v["status"] == "absent" for v in m.parse_signal_blocks(words).values())
    tag_o, tag_c = m.tag_ids["image"]
    assert m.parse_caption_blocks([tag_o] + m.tok.encode("a large red circle") + [tag_c])["image"] == \
        "a large red circle"
    assert m.parse_caption_blocks([tag_o] + m.tok.encode("a red"))["image"] is None


def test_projector_shapes(frozen):
    m = _model(frozen)
    for mod, n in zip(MODS, (4, 3), strict=True):
        h = torch.randn(5, n, m.d_llm)
        out = m.project(mod, h, torch.tensor([m.signal_ids[mod]] * 5))
        assert out.shape == (5, *frozen.decoders[mod].cond_shape)
        with pytest.raises(ValueError, match=rf"\(B, {n}, {m.d_llm}\)"):
            m.project(mod, torch.randn(5, n + 1, m.d_llm), torch.tensor([m.signal_ids[mod]] * 5))
    p = OutputProjector(in_dim=7, out_dim=11, n_query=13, hidden=8, layers=1, heads=2)
    assert p(torch.randn(2, 3, 7)).shape == (2, 13, 11)


def test_l2_loss_is_the_mean_euclidean_distance():
    u, v = torch.randn(3, 5, 4), torch.randn(3, 5, 4)
    ref = np.mean([[math.sqrt(sum((float(u[i, j, k]) - float(v[i, j, k])) ** 2 for k in range(4)))
                    for j in range(5)] for i in range(3)])
    assert float(l2_loss(u, v)) == pytest.approx(ref, rel=1e-5)
    assert float(l2_loss(u, u)) == 0.0
    assert float(l2_loss(torch.zeros(1, 1, 2), torch.tensor([[[3.0, 4.0]]]))) == pytest.approx(5.0)  # not 25


def test_alignment_loss_uses_the_signal_positions_and_decoder_embeddings(frozen):
    m = _model(frozen)
    d = [[W.Turn(human="a large red circle", answer="a large red circle", out_modality="image",
                 out_attrs=None, out_caption="a large red circle")]]
    batch = m.build(d, train=True, rng=np.random.default_rng(0))
    (b, start, mod, cap), = batch["spans"]
    assert batch["ids"][0, start:start + 4].tolist() == m.signal_ids["image"]
    h, _ = m.hidden(m.inputs_embeds(batch), batch["mask"])
    want = l2_loss(m.project("image", h[:, start:start + 4], torch.tensor([m.signal_ids["image"]])),
                   frozen.decoders["image"].encode_condition([cap]))
    assert float(m.losses(batch, lam={"image": 1.0})["l2"]) == pytest.approx(float(want), rel=1e-5)
    assert float(m.losses(batch, lam={"image": 2.0})["l2"]) == pytest.approx(2 * float(want), rel=1e-5)


def test_stage_checkpoints_reload_to_identical_outputs(frozen, tmp_path):
    m = _model(frozen)
    S = samplers([W.spec(x) for x in MODS])
    for stage, key in ((1, "stage1"), (2, "stage2"), (3, "stage3")):
        train_stage(m, stage, S[key], StageConfig(steps=1, lr=1e-2, batch=2), seed=stage)
        path = m.save(tmp_path / f"stage{stage}.pt")
        m2 = _model(frozen).load(path)
        batch = m.build(S["stage3"](np.random.default_rng(3), 3), train=True, rng=np.random.default_rng(4))
        a, b = m.losses(batch), m2.losses(batch)
        assert torch.equal(a["nll"], b["nll"]) and torch.equal(a["l2"], b["l2"])
        ga = m.generate(inputs=["show me a large red circle"], ddim_steps=2, max_new_tokens=6)
        gb = m2.generate(inputs=["show me a large red circle"], ddim_steps=2, max_new_tokens=6)
        assert ga.tokens == gb.tokens
        assert module_hash(m, skip=("llm.",)) == module_hash(m2, skip=("llm.",))


def test_checkpoint_from_another_config_is_refused(frozen, tmp_path):
    path = _model(frozen).save(tmp_path / "a.pt")
    other = NExTGPT(frozen=frozen, config=NExTGPTConfig(modalities=MODS, n_signal=(2, 3), projector_hidden=16))
    with pytest.raises(ValueError, match="checkpoint was made for config"):
        other.load(path)
    other_world = train_frozen_shell(FrozenConfig(modalities=MODS, llm_hidden=32, decoder_channels=8, world_seed=1))
    with pytest.raises(ValueError, match="frozen parts"):
        _model(other_world).load(path)


def test_generate_returns_text_and_media_for_every_modality(frozen):
    m = _model(frozen)
    with torch.no_grad():  # make the untrained model emit an image block after one word
        m.new_head[m.signal_ids["image"][0] - m.base_vocab] = 50 * m.llm.model.norm.weight
    g = m.generate(inputs=["show me a large red circle"], ddim_steps=2, max_new_tokens=8)
    assert g.media["image"].shape == W.IMAGE.shape and torch.isfinite(g.media["image"]).all()
    assert g.conditions["image"].shape == frozen.decoders["image"].cond_shape
    wav = torch.from_numpy(W.tone("low", "sine", "steady"))
    g2 = m.generate(inputs=["describe this", Media("audio", wav, sample_rate=W.SAMPLE_RATE)], ddim_steps=2)
    assert isinstance(g2.text, str)


@pytest.mark.parametrize("inputs, err, match", [
    (["show me", Media("video", torch.zeros(12, 16, 16))], ValueError, r"unsupported modality 'video'.*image"),
    (["describe this", Media("image", torch.zeros(3, 32, 32))], ValueError, r"shape \(3, 16, 16\)"),
    (["describe this", Media("audio", torch.zeros(4000), sample_rate=16000)], ValueError, "must be 8000 Hz"),
    (["describe this", Media("audio", torch.zeros(2, 16, 16))], ValueError, r"\(1, 16, 16\).*8000 Hz"),
    (["   "], ValueError, "empty prompt"),
    ([], ValueError, "empty prompt"),
    ([3], TypeError, "str or Media"),
])
def test_bad_input_raises_before_compute(frozen, inputs, err, match, monkeypatch):
    m = _model(frozen)
    monkeypatch.setattr(m, "respond", lambda *a, **k: pytest.fail("computed before validating"))
    with pytest.raises(err, match=match):
        m.generate(inputs=inputs)


def test_unsupported_modality_in_config():
    with pytest.raises(ValueError, match="unsupported modality 'smell'"):
        NExTGPTConfig(modalities=("smell",), n_signal=(1,))
    with pytest.raises(ValueError, match="n_signal"):
        NExTGPTConfig(modalities=("image",), n_signal=(4, 4))
    with pytest.raises(ValueError, match="output_mode"):
        NExTGPTConfig(modalities=("image",), n_signal=(4,), output_mode="text")


def test_world_renders_and_captions():
    rng = np.random.default_rng(0)
    for s in W.SPECS.values():
        x, attrs = W.sample_items(s, 6, rng)
        assert x.shape == (6, *s.shape) and torch.isfinite(x).all()
        assert all(set(s.caption(a).split()) >= set(a.values()) for a in attrs)
    # different attribute values render differently
    a = W.IMAGE.render({"size": "small", "colour": "red", "shape": "circle"})
    b = W.IMAGE.render({"size": "large", "colour": "red", "shape": "circle"})
    assert not torch.equal(a, b)
    d = W.mosit_dialogue(list(W.SPECS.values()), rng, turns=(3, 3))
    assert len(d) == 3
    words = set(W.vocabulary())
    for t in d:
        assert set(t.human.split()) <= words and set(t.answer.split()) <= words


@pytest.mark.parametrize("kw, match", [
    ({"seeds": (0,)}, ">= 2 seeds"),
    ({"n_signal": (4, 4)}, "n_signal"),
    ({"modalities": ("smell",), "n_signal": (1,)}, "unsupported modality"),
    ({"lr_grid": (1e-3, 3e-3, 9e-3), "icl_grid": (1, 2)}, "same size"),
    ({"lr_grid": (1e-3, 1e-3), "icl_grid": (1, 2)}, "2 distinct"),
    ({"grid_extra": -1}, "grid_extra"),
    ({"stage1_steps": 0}, "stage1_steps"),
    ({"block_min": 1.5}, "block_min"),
])
def test_bad_config_raises(kw, match):
    with pytest.raises(ValueError, match=match):
        Config(**kw)


def test_batched_greedy_equals_one_by_one(frozen):
    """Left-padding inside the batched decoder must not change any row's output."""
    m = _model(frozen)
    rng = np.random.default_rng(2)
    dias = [W.mosit_dialogue([W.IMAGE], rng, turns=(1, 3)) for _ in range(4)]  # image renders are deterministic
    together = m.respond(dias, rng=np.random.default_rng(0), decode=False, max_new_tokens=5)
    alone = [m.respond([d], rng=np.random.default_rng(0), decode=False, max_new_tokens=5)[0] for d in dias]
    lens = {int(m.build([d], train=False, rng=np.random.default_rng(0))["mask"].sum()) for d in dias}
    assert len(lens) > 1  # the batch really is ragged
    assert [g.tokens for g in together] == [g.tokens for g in alone]


def test_frame_shared_video_denoiser_is_one_unet_per_frame_with_frame_index():
    from icml24.next_gpt.components import DiffusionDecoder, FrameDenoiser, WordTokenizer

    tok = WordTokenizer(W.vocabulary())
    torch.manual_seed(0)
    dec = DiffusionDecoder("video", tok, width=8, cond_tokens=4, cond_dim=8, T=10, frames=W.VIDEO_FRAMES)
    assert isinstance(dec.unet, FrameDenoiser) and dec.unet.inp.in_channels == 3 + 2  # RGB + (x, y)
    with torch.no_grad():
        dec.unet.femb.weight.normal_()
    x = torch.randn(2, *W.spec("video").shape)
    t, c = torch.tensor([3, 7]), torch.randn(2, 4, 8)
    eps = dec.unet(x, t, c)
    assert eps.shape == x.shape
    # frame k of the output depends only on frame k of the input (shared weights, no cross-frame mixing)
    x2 = x.clone()
    x2[:, 3:6] += 1.0
    eps2 = dec.unet(x2, t, c)
    assert torch.equal(eps[:, :3], eps2[:, :3]) and not torch.allclose(eps[:, 3:6], eps2[:, 3:6])
    # the same frame content at two indices is denoised differently (the frame-index embedding)
    same = x[:, :3].repeat(1, W.VIDEO_FRAMES, 1, 1)
    out = dec.unet(same, t, c)
    assert not torch.allclose(out[:, :3], out[:, 3:6])
    assert dec.generate(c, steps=2).shape == (2, *W.spec("video").shape)


def test_frozen_config_video_decoder_choice_and_cache_key():
    with pytest.raises(ValueError, match="FrozenConfig: video_decoder"):
        FrozenConfig(video_decoder="3d")
    ia = FrozenConfig(modalities=("image", "audio"))
    assert ia.key() == FrozenConfig(modalities=("image", "audio"), video_decoder="stacked").key()
    vid = ("image", "audio", "video")
    assert FrozenConfig(modalities=vid).key() != FrozenConfig(modalities=vid, video_decoder="stacked").key()
    assert FrozenConfig(modalities=vid).frames("video") == W.VIDEO_FRAMES
    assert FrozenConfig(modalities=vid).frames("image") == 1


@pytest.mark.parametrize("prediction", ["v", "eps"])
def test_ddim_with_an_exact_denoiser_recovers_the_data_and_the_loss_target_is_the_formula(prediction):
    from icml24.next_gpt.components import DiffusionDecoder, WordTokenizer

    tok = WordTokenizer(W.vocabulary())
    dec = DiffusionDecoder("image", tok, width=8, cond_tokens=4, cond_dim=8, T=50, prediction=prediction)
    x0 = torch.rand(2, *W.spec("image").shape) * 2 - 1

    def exact(x, t, c):  # the true eps (or v = a·eps − b·x0) of x_t = a·x0 + b·eps
        ab = dec.alpha_bar[t][:, None, None, None]
        a, b = ab.sqrt(), (1 - ab).sqrt()
        eps = (x - a * x0.repeat(len(x) // len(x0), 1, 1, 1)) / b
        return eps if prediction == "eps" else a * eps - b * x0.repeat(len(x) // len(x0), 1, 1, 1)

    dec.unet.forward = exact
    out = dec.generate(torch.randn(2, 4, 8), steps=7, guidance_scale=3.0)
    assert torch.allclose(out, x0, atol=1e-4)
    # the training loss is zero for the exact denoiser and positive for a wrong one
    g = torch.Generator().manual_seed(0)
    assert float(dec.loss(x0, torch.randn(2, 4, 8), g)) < 1e-8
    dec.unet.forward = lambda x, t, c: exact(x, t, c) + 0.1
    assert float(dec.loss(x0, torch.randn(2, 4, 8), g)) == pytest.approx(0.01, rel=1e-3)
    with pytest.raises(ValueError, match="prediction must be 'v' or 'eps'"):
        DiffusionDecoder("image", tok, width=8, cond_tokens=4, cond_dim=8, T=50, prediction="x0")
    with pytest.raises(ValueError, match="FrozenConfig: prediction"):
        FrozenConfig(prediction="x0")


_HASH_SEED_SCRIPT = """
import numpy as np, torch
from icml24.next_gpt import world as W
from icml24.next_gpt.components import FrozenConfig, train_frozen_shell
from icml24.next_gpt.experiment import samplers
from icml24.next_gpt.model import NExTGPT, NExTGPTConfig
mods = ("image", "audio", "video")
torch.manual_seed(0)
fr = train_frozen_shell(FrozenConfig(modalities=mods, llm_hidden=32, decoder_channels=8))
m = NExTGPT(frozen=fr, config=NExTGPTConfig(modalities=mods, n_signal=(2, 2, 2), projector_hidden=16), seed=0)
rng = np.random.default_rng(0)
batch = m.build(samplers([W.spec(x) for x in mods])["stage2"](rng, 12), train=True, rng=rng)
print(float(m.losses(batch, lam={"image": 1.0, "audio": 1.0, "video": 2.0})["l2"]).hex())
"""


def test_alignment_loss_does_not_depend_on_the_hash_seed():
    """Stage-2 runs were not reproducible across processes while the loss summed modalities in set order."""
    import os
    import subprocess
    import sys

    out = {subprocess.run([sys.executable, "-c", _HASH_SEED_SCRIPT], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONHASHSEED": str(h)}).stdout.strip() for h in (1, 2, 3)}
    assert len(out) == 1, out
