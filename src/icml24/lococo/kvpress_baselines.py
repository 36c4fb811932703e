"""Single-shot baselines from kvpress 0.5.5 (NVIDIA), and the cross-check of our streaming eviction rules.

``import kvpress`` wraps every function in transformers' ``ALL_ATTENTION_FUNCTIONS`` for the whole process, so this
module imports it lazily and the experiment runs it in a subprocess (``python -m icml24.lococo.kvpress_baselines``).

Single shot: the first ``prefix`` tokens are prefilled in one pass and compressed once to M entries per layer and
head (kvpress: a press on a ``DynamicCache``; ours: ``LoCoCoCache.compress_now``), then the rest of the window is
scored in one pass over [compressed prefix ; rest].
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from icml24.lococo.cache import LoCoCoCache
from icml24.lococo.compressor import OWNER

PRESSES = ("StreamingLLMPress", "SnapKVPress", "TOVAPress", "ObservedAttentionPress", "KnormPress",
           "ExpectedAttentionPress")


def _kvpress():
    try:
        import kvpress
    except ImportError as e:
        raise ImportError("the kvpress baselines need kvpress 0.5.5: pip install 'icml24[kv]'") from e
    return kvpress


def make_press(name: str, *, length: int, budget: int, **knobs: Any):
    """A kvpress press that keeps exactly ``budget`` of ``length`` entries (compute_n_kept = ⌊L(1−ratio)⌋)."""
    kvpress = _kvpress()
    if name not in PRESSES:
        raise ValueError(f"{OWNER}: press must be one of {PRESSES}, got {name!r}")
    ratio = 1.0 - (budget + 0.5) / length
    return getattr(kvpress, name)(compression_ratio=ratio, **knobs)


@torch.no_grad()
def press_prefill(model, ids: torch.Tensor, press):
    """Prefill ``ids`` through ``press`` into a ``DynamicCache``; returns (compressed cache, last-token logits)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with press(model):
        logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1:]
    return cache, logits


@torch.no_grad()
def kept_positions(model, ids: torch.Tensor, cache) -> list[torch.Tensor]:
    """Per layer, the sorted absolute positions [b, h, M] of the entries a compressed cache kept (matched by key)."""
    from transformers import DynamicCache

    full = DynamicCache(config=model.config)
    model(input_ids=ids, past_key_values=full, use_cache=True)
    out = []
    for lf, lc in zip(full.layers, cache.layers, strict=True):
        d = torch.cdist(lc.keys.double(), lf.keys.double())  # [b, h, M, L]
        out.append(d.argmin(-1).sort(-1).values)
    return out


@torch.no_grad()
def single_shot_losses(model, ids: torch.Tensor, *, prefix: int, method: str, budget: int,
                       compressors=None, knobs: dict | None = None) -> torch.Tensor:
    """Per-window mean NLL of ``ids[:, prefix:]`` after compressing the prefix once to ``budget`` entries.

    ``method``: a kvpress press name, ``"full"``, or one of our policies (``"lococo"``, ``"h2o"``, ``"tova"``,
    ``"streaming"``) through ``LoCoCoCache``.
    """
    knobs = dict(knobs or {})
    head, rest = ids[:, :prefix], ids[:, prefix:]
    if method in PRESSES:
        cache, prev_logits = press_prefill(model, head, make_press(method, length=prefix, budget=budget, **knobs))
    else:
        pol = "full" if method == "full" else method
        cache = LoCoCoCache.from_model(model, policy=pol, budget=budget, compressors=compressors, buffer=0,
                                       prefill_chunk_size=None, **knobs)  # one-shot prefill, then compress once
        prev_logits = model(input_ids=head, past_key_values=cache, use_cache=True).logits[:, -1:]
        cache.compress_now()
    # explicit positions: a pruned DynamicCache reports its physical length, not the tokens seen
    pos = torch.arange(prefix, ids.shape[1] - 1, device=ids.device)
    logits = torch.cat([prev_logits, model(input_ids=rest[:, :-1], past_key_values=cache, use_cache=True,
                                           position_ids=pos[None], cache_position=pos).logits], 1)
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), rest.reshape(-1), reduction="none")
    return nll.view(rest.shape).mean(1)


def main(argv: list[str] | None = None) -> None:
    """Subprocess entry: ``--job job.pt`` (model state, config, windows, compressors) -> ``--out result.json``."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--job", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    from icml24.lococo.cache import make_compressors
    from icml24.lococo.model import tiny_llama

    job = torch.load(a.job, weights_only=False)
    model = tiny_llama(**job["model_kwargs"])
    model.load_state_dict(job["state"])
    model.eval()
    ids, prefix = job["ids"], job["prefix"]
    res: dict[str, Any] = {"full": float(single_shot_losses(model, ids, prefix=prefix, method="full",
                                                            budget=prefix).mean())}
    for M, comp_states in job["compressors"].items():
        r: dict[str, Any] = {}
        for name in PRESSES:
            try:
                r[name] = float(single_shot_losses(model, ids, prefix=prefix, method=name, budget=M).mean())
            except Exception as e:  # a press that does not run on this model is reported, not fatal
                r[name] = f"error: {type(e).__name__}: {e}"[:200]
        for pol, kn in job["ours"][M].items():
            r[f"ours_{pol}"] = float(single_shot_losses(model, ids, prefix=prefix, method=pol, budget=M,
                                                        knobs=kn).mean())
        r["lococo"] = []
        for st in comp_states:
            comps = make_compressors(budget=M, **job["comp_kwargs"], **job.get("budget_comp_kwargs", {}).get(M, {}))
            comps.load_state_dict(st)
            r["lococo"].append(float(single_shot_losses(model, ids, prefix=prefix, method="lococo", budget=M,
                                                        compressors=comps).mean()))
        res[str(M)] = r
    Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
