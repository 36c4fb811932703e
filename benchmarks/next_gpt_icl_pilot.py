"""Pilot of the issue-31 in-context baseline (seed 100, not a full-run seed): after the LLM's packed-window
pretraining, is stage 2 + k in-context examples still below the always-text stage-1 model on validation?
Trains stage 1 and stage 2 as the full run does and scores validation modality selection at k = k_max / 2 and
k_max, and the stage-1 model without examples. Uses the cached frozen parts of the full run's world."""

from __future__ import annotations

import copy
import json
import sys
import time

import numpy as np

from icml24.next_gpt import experiment as E
from icml24.next_gpt import world as W
from icml24.next_gpt.components import load_or_train_frozen
from icml24.next_gpt.model import NExTGPT, StageConfig, train_stage


def main(seed: int = 100) -> dict:
    cfg = E.Config()
    t0 = time.perf_counter()
    frozen = load_or_train_frozen(cfg.frozen_config())
    specs = [W.spec(m) for m in cfg.modalities]
    S = E.samplers(specs)
    sc = lambda steps: StageConfig(steps=steps, lr=cfg.lr12, batch=cfg.batch)  # noqa: E731
    m = NExTGPT(frozen=frozen, config=cfg.model_config("signal"), seed=seed)
    train_stage(m, 1, S["stage1"], sc(cfg.stage1_steps), seed=seed)
    stage1 = copy.deepcopy(m)
    train_stage(m, 2, S["stage2"], sc(cfg.stage2_steps), seed=seed + 1)
    val = E.validation_sets(cfg, specs, seed)["mosit"]
    out = {"seed": seed, "frozen_key": frozen.cfg.key(), "llm_pretrain_s": frozen.info.get("llm_pretrain_s"),
           "llm_loss_last10": float(np.mean(frozen.info["llm_loss"][-10:])),
           "stage1_val_selection": E.eval_selection(stage1, val, np.random.default_rng(5)),
           "stage2_val_selection_k0": E.eval_selection(m, val, np.random.default_rng(5))}
    k_max = max(cfg.icl_grid)
    for k in (k_max // 2, k_max):
        pre = E._icl_prefixes(S["stage3"], len(val), k, np.random.default_rng(6))
        out[f"stage2_icl_val_selection_k{k}"] = E.eval_selection(m, val, np.random.default_rng(5), pre)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out


if __name__ == "__main__":
    res = main(int(sys.argv[1]) if len(sys.argv) > 1 else 100)
    print(json.dumps(res, indent=1))
