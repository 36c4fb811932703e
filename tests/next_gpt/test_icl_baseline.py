"""Issue 31's in-context baseline: the LLM's packed-window pretraining (windows of the context length, texts
joined by a separator, nothing lost), the cache key that tells it from the unpacked LLM, the plateau check that
replaces the interior rule for k, and claim 2's baseline max(stage 2 + ICL, always-text stage 1) picked on
validation, all on synthetic numbers (no trained model)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import icml24.next_gpt.experiment as E
from icml24.common.results import verdict
from icml24.common.tuning import tune_grid
from icml24.next_gpt import components as C
from icml24.next_gpt import world as W
from tests.next_gpt.test_tuning import recorder


def _texts(n: int, seed: int = 0) -> list[list[int]]:
    g = np.random.default_rng(seed)
    return [list(range(10 + 100 * i, 10 + 100 * i + int(g.integers(1, 40)))) for i in range(n)]


@pytest.mark.parametrize("length", [1, 7, 64, 256])
def test_pack_windows_cuts_the_separated_stream_into_windows_of_the_context_length(length):
    texts = _texts(50)
    wins = C.pack_windows(texts, length, sep=1)
    assert all(len(w) == length for w in wins[:-1]) and 1 <= len(wins[-1]) <= length
    stream = [t for w in wins for t in w]
    assert stream == [t for s in texts for t in (1, *s)]  # every text, in order, each after one separator
    assert len(stream) == sum(len(s) + 1 for s in texts)


def test_packed_batches_serve_every_window_of_every_epoch_once():
    texts = _texts(60, seed=1)
    n_tok = sum(len(s) + 1 for s in texts)
    n_win = -(-n_tok // 32)
    stream = C._packed_batches(texts, 32, 1, 5, np.random.default_rng(0))
    got = [w for _ in range(2 * n_win // 5) for w in next(stream)]  # about two epochs (leftovers roll over)
    assert all(len(b) <= 32 for b in got)
    tokens = [t for w in got for t in w]
    # each text is a contiguous run after a separator (windows may cut it): no token is lost or duplicated,
    # counted over the first epoch's worth of windows
    first = sorted(t for w in got[:n_win] for t in w if t != 1)
    assert len(got[:n_win]) == n_win and sum(len(w) for w in got[:n_win]) <= n_tok
    assert len(set(first)) == len(first)  # no window served twice within an epoch
    assert tokens.count(1) >= len(texts)


def test_pretraining_on_packed_windows_feeds_the_llm_full_context_windows(monkeypatch):
    tok = C.WordTokenizer(W.vocabulary())
    corpus = W.lm_corpus([W.spec("image")], np.random.default_rng(0), 200)
    seen = []
    real = C._batchify

    def spy(seqs, pad=0):
        seen.append([len(s) for s in seqs])
        return real(seqs, pad)

    monkeypatch.setattr(C, "_batchify", spy)
    llm = C.build_llm(vocab_size=len(tok), hidden=16, layers=1, heads=2, seed=0, context=64)
    assert llm.config.max_position_embeddings == 64
    losses = C.pretrain_llm(llm, tok, corpus, steps=3, batch=4, lr=1e-3, seed=0, context=64)
    assert len(losses) == 3 and np.isfinite(losses).all()
    assert all(n == 64 for step in seen for n in step[:-1]) and all(len(s) == 4 for s in seen)
    seen.clear()
    C.pretrain_llm(llm, tok, corpus, steps=2, batch=4, lr=1e-3, seed=0)  # unpacked: one short text per row
    assert max(n for s in seen for n in s) < 64
    with pytest.raises(ValueError, match="fewer than"):
        C.pretrain_llm(llm, tok, corpus[:5], steps=1, batch=4, lr=1e-3, seed=0, context=64)


def test_the_cache_key_changes_with_the_packed_pretraining_and_keeps_the_unpacked_key():
    fc = E.Config().frozen_config()
    assert fc.llm_packing and fc.llm_context == 256
    old = replace(fc, llm_packing=False)
    assert old.key() == "ed0838bf4318"  # the committed schema-2 run's frozen_key (unpacked LLM)
    keys = {fc.key(), old.key(), replace(fc, llm_context=128).key(), replace(fc, llm_windows=16).key()}
    assert len(keys) == 4
    assert C.train_frozen_shell(replace(fc, llm_context=128, modalities=("image",),
                                        decoder_channels=8)).llm.config.max_position_embeddings == 128
    with pytest.raises(ValueError, match="llm_context"):
        C.FrozenConfig(llm_context=1)


def test_the_default_k_grid_top_fills_the_context():
    """k_max = max(icl_grid) is the largest k at which >= 90% of the validation prompts fit in the context."""
    cfg = E.Config()
    specs = [W.spec(m) for m in cfg.modalities]
    fr = C.train_frozen_shell(replace(cfg.frozen_config(), decoder_channels=8))
    m = E.NExTGPT(frozen=fr, config=cfg.model_config(), seed=0)
    val = E.validation_sets(cfg, specs, 0)["mosit"]
    S = E.samplers(specs)
    fit = {}
    for k in (max(cfg.icl_grid), max(cfg.icl_grid) + 1):
        lens = E.prompt_lengths(m, val, E._icl_prefixes(S["stage3"], len(val), k, np.random.default_rng(6)))
        fit[k] = float(np.mean(np.array(lens) <= fr.cfg.llm_context))
    assert fit[max(cfg.icl_grid)] >= 0.9 > fit[max(cfg.icl_grid) + 1]


def test_pick_text_baseline_takes_the_better_validation_arm():
    assert E.pick_text_baseline({"stage2_icl": 0.30, "stage1": 0.45}) == "stage1"
    assert E.pick_text_baseline({"stage2_icl": 0.60, "stage1": 0.45}) == "stage2_icl"
    assert E.pick_text_baseline({"stage2_icl": 0.45, "stage1": 0.45}) == "stage2_icl"  # tie: the ICL baseline
    with pytest.raises(ValueError, match="needs validation scores"):
        E.pick_text_baseline({"stage2_icl": 0.3})
    with pytest.raises(ValueError, match="non-finite"):
        E.pick_text_baseline({"stage2_icl": float("nan"), "stage1": 0.4})


def _icl(curve, grid=(1, 2, 3, 4)):
    return tune_grid(lambda ks: [[curve(k)] for k in ks], grid, log=False, integer=True,
                     limits=(1, max(grid)), max_extra=2)


def test_icl_plateau_compares_k_max_with_half_of_it():
    cfg = E.Config()
    t = _icl(lambda k: {1: 0.2, 2: 0.5, 3: 0.9, 4: 0.53}[k])
    assert t.value == 3.0 and t.extensions == [] and t.ok
    gain, k_max, k_half = E.icl_plateau(cfg, t)
    assert (k_max, k_half) == (4, 2) and gain == pytest.approx(0.03)
    rising = _icl(lambda k: 0.1 * k)
    assert rising.value == 4.0 and rising.extensions == [] and rising.at_limit  # k_max fills the context
    assert E.icl_plateau(cfg, rising)[0] == pytest.approx(0.2)
    with pytest.raises(ValueError, match="k_max // 2"):
        E.Config(icl_grid=(1, 4, 5, 6))


@pytest.mark.parametrize("curve, plateau", [(lambda k: 0.3 + 0.01 * k, True), (lambda k: 0.1 * k, False)])
def test_the_plateau_check_guards_claim_2_only_and_claim_2_uses_the_best_text_baseline(tmp_path, curve, plateau):
    cfg = E.Config()
    lr = tune_grid(lambda vs: [[-abs(np.log(v / 6e-3))] for v in vs], cfg.lr_grid, max_extra=0)
    checks = E._checks(recorder(tmp_path, cfg, icl=0.3, stage1_selection=0.5), cfg, [1.0, 1.0, 1.0])
    checks += E._tuning_checks(cfg, {"signal": lr, "pipeline": lr, "stage2_icl": _icl(curve)})
    pc = next(c for c in checks if c.name == E.PLATEAU_CHECK)
    assert pc.kind == "sanity" and pc.direction == "<=" and pc.threshold == cfg.icl_plateau_tol
    assert pc.passed is plateau and pc.guards == [E.CLAIM_SELECTION] and pc.detail.startswith("tuning:")
    claim2 = next(c for c in checks if c.name == E.CLAIM_SELECTION)
    assert claim2.baseline_arm == "best_text" and claim2.measured == pytest.approx(0.9 + 0.15 / 2 - 0.5 - 0.05)
    v = verdict(checks)
    assert {c.name for c in checks if c.kind == "claim" and c.void} == (set() if plateau else {E.CLAIM_SELECTION})
    assert v["claims_void"] == (0 if plateau else 1)


def test_text_baseline_on_validation_scores_stage1_on_the_icl_validation_turns(monkeypatch):
    cfg = E.Config(modalities=("image",), n_signal=(4,), n_eval=2, n_dialogues=2)
    seen = []

    def sel(model, contexts, rng, prefixes=None):
        seen.append((model, [len(c) for c in contexts], prefixes))
        return 0.47

    monkeypatch.setattr(E, "eval_selection", sel)
    out = E.text_baseline_on_validation(cfg, [W.spec("image")], 0, "stage1-model", _icl(lambda k: 0.1 * k))
    assert out == {"val": {"stage2_icl": pytest.approx(0.4), "stage1": 0.47}, "picked": "stage1"}
    val = E.validation_sets(cfg, [W.spec("image")], 0)["mosit"]
    assert seen == [("stage1-model", [len(c) for c in val], None)]  # no examples: the always-text floor
    test = E.eval_sets([W.spec("image")], np.random.default_rng(10_000), 2, 2)["mosit"]
    assert [[t.human for t in c] for c in val] != [[t.human for t in c] for c in test]

