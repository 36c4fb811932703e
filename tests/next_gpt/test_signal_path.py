"""NExT-GPT's signal path against oracles that do not reuse the code under test: the conditioning a generated
signal block gives the decoder (hidden states whose *input* is a signal token, plus the signal-token embeddings,
notes §2.2), and which new token rows each stage trains, named by token (notes §2.3), not by ``trainable_rows``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from icml24.next_gpt import world as W
from icml24.next_gpt.components import FrozenConfig, train_frozen_shell
from icml24.next_gpt.experiment import samplers
from icml24.next_gpt.model import NExTGPT, NExTGPTConfig, StageConfig, train_stage

MODS = ("image", "audio")


@pytest.fixture(scope="module")
def frozen():
    torch.manual_seed(0)
    return train_frozen_shell(FrozenConfig(modalities=MODS, llm_hidden=32, decoder_channels=8))


def _model(frozen):
    return NExTGPT(frozen=frozen, config=NExTGPTConfig(modalities=MODS, n_signal=(4, 3), projector_hidden=16),
                   seed=0)


def _by_hand(m: NExTGPT, modality: str, h: torch.Tensor, sig_ids: list[int]) -> torch.Tensor:
    """TextFcLayer on ``h + e``, the signal embeddings read straight from the new rows."""
    e = m.new_embed[torch.tensor(sig_ids) - m.base_vocab]
    return m.output_projectors[modality](h + e)


def test_generation_conditions_on_the_states_whose_inputs_are_the_signal_tokens(frozen, monkeypatch):
    """Ragged batch, blocks at different offsets: each row's decoder condition must come from the hidden states
    at the positions holding its signal tokens in context + output, found here by token identity."""
    m = _model(frozen)
    img, aud = m.signal_ids["image"], m.signal_ids["audio"]
    dias = [[W.Turn(human="show me a large red circle")],
            [W.Turn(human="hello", answer="hello how can i help"), W.Turn(human="now play a low sine tone")]]
    outs = [m.tok.encode("here is the picture") + img + m.tok.encode("."),
            m.tok.encode("a sound") + aud + m.tok.encode("thank you")]
    monkeypatch.setattr(m, "_greedy", lambda batch, **kw: [list(o) for o in outs])
    gens = m.respond(dias, rng=np.random.default_rng(0), ddim_steps=2)
    batch = m.build(dias, train=False, rng=np.random.default_rng(0))
    lens = batch["mask"].sum(1).tolist()
    assert len(set(lens)) == 2  # the contexts differ in length: padding offsets matter
    for i, (mod, sig) in enumerate((("image", img), ("audio", aud))):
        full = batch["ids"][i, :lens[i]].tolist() + outs[i]
        with torch.no_grad():
            h, _ = m.hidden(m.embed(torch.tensor([full])), torch.ones(1, len(full), dtype=torch.long))
            j = full.index(sig[0])
            assert full[j:j + len(sig)] == sig
            want = _by_hand(m, mod, h[:, j:j + len(sig)], sig)[0]
            torch.testing.assert_close(gens[i].conditions[mod], want)
            for off in (-1, 1):  # the neighbouring windows give other conditions: the check can tell them apart
                other = _by_hand(m, mod, h[:, j + off:j + off + len(sig)], sig)[0]
                assert not torch.allclose(other, want, atol=1e-4)
        assert set(gens[i].media) == {mod} and gens[i].media[mod].shape == W.spec(mod).shape


def test_the_projector_reads_signal_states_plus_signal_token_embeddings(frozen):
    m = _model(frozen)
    for mod in MODS:
        sig = m.signal_ids[mod]
        h = torch.randn(3, len(sig), m.d_llm)
        ids = torch.tensor([sig] * 3)
        with torch.no_grad():
            got = m.project(mod, h, ids)
            torch.testing.assert_close(got, _by_hand(m, mod, h, sig))
            assert not torch.allclose(got, m.output_projectors[mod](h), atol=1e-4)  # the e term matters


def test_each_stage_trains_the_token_rows_named_by_the_paper(frozen):
    """Stage 1 (X -> caption): ``<media>`` and the modality tags; stage 2 (caption -> signal): tags and signal
    tokens, never ``<media>`` (no media in its data); stage 3: every new row. The sets are spelled out by token
    name; rows outside a stage's set stay bit-identical through it, and its signal / <media> rows do move."""
    m = _model(frozen)
    names = [m.tok.itos[m.base_vocab + r] for r in range(m.new_embed.shape[0])]
    tags = {f"<{W.spec(x).tag}>" for x in MODS} | {f"</{W.spec(x).tag}>" for x in MODS}
    sig = {m.tok.itos[i] for x in MODS for i in m.signal_ids[x]}
    assert len(sig) == 7 and set(names) == {"<media>"} | tags | sig
    want = {1: {"<media>"} | tags, 2: tags | sig, 3: set(names)}
    moves = {1: "<media>", 2: sorted(sig)[0], 3: "<media>"}
    S = samplers([W.spec(x) for x in MODS])
    for stage in (1, 2, 3):
        rows = m.trainable_rows(stage)
        assert {names[r] for r in range(len(names)) if rows[r]} == want[stage], stage
        before = (m.new_embed.detach().clone(), m.new_head.detach().clone())
        train_stage(m, stage, S[f"stage{stage}"], StageConfig(steps=2, lr=1e-2, batch=4), seed=stage)
        for r, name in enumerate(names):
            same = torch.equal(before[0][r], m.new_embed[r]) and torch.equal(before[1][r], m.new_head[r])
            if name not in want[stage]:
                assert same, f"stage {stage} changed the row of {name}, which it must not train"
        r = names.index(moves[stage])
        assert not torch.equal(before[1][r], m.new_head[r]), f"stage {stage} did not train {moves[stage]}"
