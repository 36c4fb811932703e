"""The base model (a small random-init ``LlamaForCausalLM`` from a config), chunked evaluation and training loops."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from icml24.common import validate as v
from icml24.common.progress import progress
from icml24.lococo.cache import LoCoCoCache, register_lococo_attention
from icml24.lococo.compressor import OWNER


def tiny_llama(*, vocab_size: int = 256, hidden_size: int = 96, num_layers: int = 3, num_heads: int = 3,
               num_kv_heads: int | None = None, intermediate_size: int = 256, max_position_embeddings: int = 32768,
               attn_implementation: str = "lococo", seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Module:
    """A byte-level ``transformers.LlamaForCausalLM`` built from a ``LlamaConfig`` (random init, nothing downloaded)."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:  # pragma: no cover
        raise ImportError("icml24.lococo needs transformers: pip install 'icml24[hf]'") from e
    if attn_implementation == "lococo":
        register_lococo_attention()
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
                      num_hidden_layers=num_layers, num_attention_heads=num_heads,
                      num_key_value_heads=num_kv_heads or num_heads, max_position_embeddings=max_position_embeddings,
                      bos_token_id=0, eos_token_id=0, pad_token_id=0, tie_word_embeddings=False,
                      attn_implementation=attn_implementation)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).to(dtype)


def chunked_nll(model: nn.Module, ids: torch.Tensor, *, chunk_size: int,
                make_cache: Callable[[], LoCoCoCache] | None, backward_scale: float | None = None) -> torch.Tensor:
    """Per-token NLL of ``ids[:, 1:]`` with the sequence fed chunk by chunk through one cache.

    Chunk j's logits predict tokens ``j·B+1 … (j+1)·B`` (the next chunk's first token included).
    With ``backward_scale`` the chunk's summed NLL × scale is back-propagated right after the chunk (truncated BPTT
    of one chunk: the cache holds detached tensors) and the returned NLL is detached.

    Returns:
        NLL ∈ R^{b×(T−1)}.
    """
    B = v.integer(OWNER, "chunk_size", chunk_size, minimum=1)
    v.tensor(OWNER, "ids", ids, ndim=2)
    T = ids.shape[1]
    cache = make_cache() if make_cache is not None else None
    out = []
    for j in range(0, T, B):
        x = ids[:, j:j + B]
        tgt = ids[:, j + 1:j + B + 1]
        logits = model(input_ids=x, past_key_values=cache, use_cache=cache is not None).logits
        nll = F.cross_entropy(logits[:, :tgt.shape[1]].reshape(-1, logits.shape[-1]).float(), tgt.reshape(-1),
                              reduction="none").view(tgt.shape)
        if backward_scale is not None:
            if nll.requires_grad:
                (nll.sum() * backward_scale).backward()
            nll = nll.detach()
        out.append(nll)
    return torch.cat(out, dim=1)


def pretrain(model: nn.Module, batches: Iterator[torch.Tensor], *, steps: int, lr: float,
             weight_decay: float = 0.1, warmup: int = 20) -> list[float]:
    """Full-attention next-byte pretraining with AdamW and a linear-warmup cosine schedule; returns the losses."""
    steps = v.integer(OWNER, "steps", steps, minimum=1)
    v.positive(OWNER, "lr", lr)
    impl = model.config._attn_implementation
    model.set_attn_implementation("sdpa")  # fast path for full-sequence training; same weights
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda t: min(1.0, (t + 1) / warmup) * 0.5 * (1.0 + math.cos(math.pi * t / steps)))
    model.train()
    losses = []
    for _ in progress(range(steps), desc="lococo pretrain"):
        x = next(batches)
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    model.eval()
    model.set_attn_implementation(impl)
    return losses


def train_compressors(model: nn.Module, compressors: nn.ModuleList, batches: Iterator[torch.Tensor], *,
                      steps: int, chunk_size: int, lr: float, cache_kwargs: dict, train_norms: bool = False,
                      norm_lr: float = 2.5e-4, desc: str = "lococo compressor") -> list[float]:
    """Chunked training of the compressors on a frozen base (repo ``train.py``, inference mode).

    Every chunk's loss is back-propagated right away (truncated BPTT through one chunk); one AdamW step per batch,
    lr for conv + λ (repo: base lr × 1000), optional norms/embeddings at ``norm_lr`` (repo: base lr × 5), linear decay.
    """
    steps = v.integer(OWNER, "steps", steps, minimum=1)
    v.positive(OWNER, "lr", lr)
    for p in model.parameters():
        p.requires_grad_(False)
    groups = [{"params": list(compressors.parameters()), "lr": lr}]
    if train_norms:
        extra = [p for n, p in model.named_parameters() if "norm" in n or "embed" in n]
        for p in extra:
            p.requires_grad_(True)
        groups.append({"params": extra, "lr": norm_lr})
    opt = torch.optim.AdamW(groups, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1.0 - t / steps)
    model.eval()
    losses = []
    for _ in progress(range(steps), desc=desc):
        x = next(batches)
        opt.zero_grad(set_to_none=True)
        n = x.shape[0] * (x.shape[1] - 1)
        nll = chunked_nll(model, x, chunk_size=chunk_size, backward_scale=1.0 / n, make_cache=lambda: (
            LoCoCoCache.from_model(model, policy="lococo", compressors=compressors, **cache_kwargs)))
        opt.step()
        sched.step()
        losses.append(float(nll.mean()))
    return losses
