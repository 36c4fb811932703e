"""A fixed-budget KV cache for Hugging Face transformers models: LoCoCo and the streaming eviction baselines.

``LoCoCoCache`` is a ``transformers.Cache`` subclass (one ``BudgetLayer`` per decoder layer). It needs the
attention probabilities of every chunk (heavy-hitter scores s = Σ_queries P), which HF's SDPA/flash kernels never
return, so the model must use the ``"lococo"`` attention implementation registered here (``AttentionInterface``):
eager attention with the memory fully visible and causal masking inside the chunk, that hands P to the cache.

Per layer and chunk (the repo's one-chunk-lag semantics, ``lag=True``):

    (K_m, V_m) = compress([memory ; previous chunk])  if its length > M + buffer  else unchanged
    attend over [K_m ; K_new]  (K_new rotated with RoPE at absolute positions, never reset)
    store detach([K_m ; K_new]),  s = Σ_queries P  (per KV head)

so the stored cache holds ≤ M + chunk (+ buffer) entries after every chunk and the compressor gets gradient only
through the current chunk's attention. ``lag=False`` compresses right after the chunk instead (≤ M at rest).
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch import nn

from icml24.common import validate as v
from icml24.lococo.compressor import OWNER, LoCoCoCompressor, h2o_keep, streaming_keep, tova_keep

POLICIES = ("full", "lococo", "streaming", "h2o", "tova")
ATTN_IMPLEMENTATION = "lococo"
_TLS = threading.local()


def _require_transformers():
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - the hf extra is installed in the test env
        raise ImportError("icml24.lococo needs transformers: pip install 'icml24[hf]'") from e
    return transformers


def _attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float, dropout: float,
            training: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager attention of q queries over L keys (the last q of them are the queries' own): key j is visible to
    query i iff j ≤ L − q + i; KV heads repeated onto query heads (GQA). Returns (out [b, q, h, d], P)."""
    groups = query.shape[1] // key.shape[1]
    k = key.repeat_interleave(groups, dim=1) if groups > 1 else key
    vv = value.repeat_interleave(groups, dim=1) if groups > 1 else value
    q_len, L = query.shape[2], k.shape[2]
    logits = torch.matmul(query, k.transpose(2, 3)) * scaling
    i = torch.arange(q_len, device=query.device).unsqueeze(1)
    j = torch.arange(L, device=query.device).unsqueeze(0)
    logits = logits.masked_fill(j > (L - q_len) + i, float("-inf"))
    P = torch.softmax(logits, dim=-1, dtype=torch.promote_types(query.dtype, torch.float32)).to(query.dtype)
    P = nn.functional.dropout(P, p=dropout, training=training)
    return torch.matmul(P, vv).transpose(1, 2).contiguous(), P


def lococo_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Eager attention over [memory ; chunk]: memory fully visible, causal inside the chunk; returns (out, P).

    No HF mask reaches it (``_lococo_mask`` refuses padding and returns None): with q queries and L keys, query i
    sees key j iff j ≤ L − q + i. When the cache split a long input into prefill chunks (``prefill_chunk_size``),
    the chunks are attended one by one here, each over the memory compressed after the previous one, so a single
    ``model(ids)`` / ``generate(ids)`` call computes what a chunk-by-chunk loop computes (P is then None).
    Argument order as HF's ``sdpa_attention_forward`` (kvpress's attention wrapper passes ``dropout`` by position).
    """
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    layer = getattr(_TLS, "pending", None)
    _TLS.pending = None
    if layer is not None and (layer.layer_idx != getattr(module, "layer_idx", None)
                              or layer.expected_keys != key.shape[2]):
        layer = None  # stale: left by a cache whose model did not use this attention
    if layer is not None and layer.pending_prefill is not None:
        return layer.chunked_attention(query, scaling=scaling, dropout=dropout, training=module.training), None
    out, P = _attend(query, key, value, scaling, dropout, module.training)
    if layer is not None:
        layer.observe(P.detach())
    return out, P


def _lococo_mask(*, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> None:
    """HF mask hook for ``"lococo"``: refuses a padded 2-D ``attention_mask``, else no mask (causal is built in).

    Compressed and fused slots have no one-to-one map to input positions, so padding cannot be masked there.
    """
    if attention_mask is not None and attention_mask.ndim == 2 and not bool(attention_mask.all()):
        rows = torch.nonzero(~attention_mask.all(dim=-1)).flatten().tolist()
        raise ValueError(f"lococo: attention_mask has padding (zeros) in batch rows {rows}; the compressed cache "
                         "does not support padded batches: run unpadded sequences, one length per batch")
    return None


def register_lococo_attention() -> str:
    """Register ``"lococo"`` in transformers' ``AttentionInterface`` and its mask hook (idempotent); returns it."""
    tf = _require_transformers()
    from transformers.masking_utils import AttentionMaskInterface

    tf.AttentionInterface.register(ATTN_IMPLEMENTATION, lococo_attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, _lococo_mask)
    return ATTN_IMPLEMENTATION


def use_lococo_attention(model: nn.Module) -> nn.Module:
    """Switch a transformers model to the score-returning ``"lococo"`` attention (in place); returns it."""
    register_lococo_attention()
    model.set_attn_implementation(ATTN_IMPLEMENTATION)
    return model


def _cache_layer_base():
    return _require_transformers().cache_utils.CacheLayerMixin


class BudgetLayer(_cache_layer_base()):
    """One decoder layer's fixed-budget cache; ``pos`` holds each slot's absolute position (−1: fused slot)."""

    is_sliding = False
    is_compileable = False

    def __init__(self, owner: LoCoCoCache, layer_idx: int) -> None:
        super().__init__()
        self.owner, self.layer_idx = owner, layer_idx
        self.pos: torch.Tensor | None = None
        self.scores: torch.Tensor | None = None  # Σ_queries P of the last chunk, [b, h_kv, L]
        self.acc_scores: torch.Tensor | None = None  # accumulated over all chunks (original H2O)
        self.last_query: torch.Tensor | None = None  # P of the last query, [b, h_kv, L]
        self.awaiting_scores = False
        self.pending_prefill: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int] | None = None
        self.seen = 0
        self.n_compressions = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def get_seq_length(self) -> int:
        return self.seen  # tokens seen (positions never reset), not the number of stored slots

    def get_mask_sizes(self, cache_position: torch.Tensor) -> tuple[int, int]:
        return self.length + cache_position.shape[0], 0

    def get_max_cache_shape(self) -> int:
        return -1

    @property
    def length(self) -> int:
        """Number of stored slots."""
        return 0 if self.keys is None else int(self.keys.shape[-2])

    @property
    def expected_keys(self) -> int:
        """Keys the attention of the current call sees: the stored slots, plus a pending split prefill."""
        return self.length + (0 if self.pending_prefill is None else int(self.pending_prefill[0].shape[-2]))

    def _gather(self, idx: torch.Tensor) -> None:
        g = lambda t: t.gather(2, idx.unsqueeze(-1).expand(*idx.shape, t.shape[-1]))  # noqa: E731
        self.keys, self.values, self.pos = g(self.keys), g(self.values), self.pos.gather(2, idx)
        if self.acc_scores is not None:
            self.acc_scores = self.acc_scores.gather(2, idx)

    def _compress(self) -> None:
        o = self.owner
        b, h, L, _ = self.keys.shape
        if o.policy == "streaming":
            idx = streaming_keep(L, o.budget, o.n_sink).to(self.keys.device).expand(b, h, -1)
        elif o.policy == "h2o":
            idx = h2o_keep(self.acc_scores if o.accumulate_scores else self.scores, o.budget, o.recent)
        elif o.policy == "tova":
            idx = tova_keep(self.last_query, o.budget, o.tova_per_head)
        else:  # lococo
            k, vv, hidx = o.compressors[self.layer_idx](self.keys, self.values, self.scores)
            pos = torch.where(hidx >= 0, self.pos.gather(2, hidx.clamp_min(0)), torch.full_like(hidx, -1))
            self.keys, self.values, self.pos = k, vv, pos
            self.n_compressions += 1
            return
        self._gather(idx.contiguous())
        self.n_compressions += 1

    def _over_budget(self) -> bool:
        o = self.owner
        return o.policy != "full" and self.length > o.budget + o.buffer

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor,
               cache_kwargs: dict[str, Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        o = self.owner
        if key_states.shape[-1] != o.head_dim or key_states.shape[1] != o.num_kv_heads:
            raise ValueError(f"{OWNER}: the model's KV heads are {tuple(key_states.shape[1::2])} (heads, head_dim) "
                             f"but the cache was built for ({o.num_kv_heads}, {o.head_dim})")
        if self.pending_prefill is not None:
            raise RuntimeError(f"{OWNER}: layer {self.layer_idx} was given a prefill longer than "
                               f"prefill_chunk_size={o.prefill_chunk}, which only the 'lococo' attention can split; "
                               "call icml24.lococo.use_lococo_attention(model), feed the input in chunks, or build "
                               "the cache with prefill_chunk_size=None (one-shot prefill)")
        if self.awaiting_scores:
            raise RuntimeError(f"{OWNER}: layer {self.layer_idx} got no attention scores for the last chunk; the model "
                               "must use attn_implementation='lococo' (icml24.lococo.use_lococo_attention(model)), "
                               "since sdpa/flash attention cannot return them")
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        b, h, q, _ = key_states.shape
        cp = (cache_kwargs or {}).get("cache_position")
        if cp is not None and cp.numel() and int(cp.reshape(-1)[0]) != self.seen:
            raise ValueError(f"{OWNER}: cache_position starts at {int(cp.reshape(-1)[0])} but layer {self.layer_idx} "
                             f"has seen {self.seen} tokens; feed the tokens in order (with a pre-filled cache, "
                             "generate() must not restart positions: leave generate's prefill_chunk_size unset, the "
                             "cache splits long prefills itself)")
        new_pos = (cp.to(key_states.device).long() if cp is not None
                   else torch.arange(self.seen, self.seen + q, device=key_states.device))
        new_pos = new_pos.view(1, 1, q).expand(b, h, q)
        B = o.prefill_chunk
        if B is not None and q > B and o.policy != "full":
            # a long prefill in one call: stored now, attended chunk by chunk by lococo_attention
            if o.attn_implementation not in (None, ATTN_IMPLEMENTATION):
                raise ValueError(f"{OWNER}: a prefill of {q} tokens is longer than prefill_chunk_size={B}, and "
                                 f"attn_implementation={o.attn_implementation!r} cannot split it; call "
                                 "icml24.lococo.use_lococo_attention(model), feed chunks of <= "
                                 f"{B} tokens, or build the cache with prefill_chunk_size=None (one-shot prefill)")
            self.pending_prefill = (key_states, value_states, new_pos, B)
            _TLS.pending = self
            if self.keys is None:
                return key_states, value_states
            return torch.cat([self.keys, key_states], dim=-2), torch.cat([self.values, value_states], dim=-2)
        return self._append(key_states, value_states, new_pos)

    def _append(self, key_states: torch.Tensor, value_states: torch.Tensor, new_pos: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store one chunk: compress [memory ; previous chunk] first (lag), then append; returns the live K, V."""
        o = self.owner
        b, h, q, _ = key_states.shape
        if self.keys is not None and o.lag and self._over_budget():
            self._compress()
        if self.keys is None:
            K, V, P = key_states, value_states, new_pos
        else:
            K = torch.cat([self.keys, key_states], dim=-2)
            V = torch.cat([self.values, value_states], dim=-2)
            P = torch.cat([self.pos, new_pos], dim=-1)
        self.keys, self.values, self.pos = K.detach(), V.detach(), P
        if self.acc_scores is not None:
            self.acc_scores = torch.cat([self.acc_scores, self.acc_scores.new_zeros(b, h, q)], dim=-1)
        self.seen += q
        if o.needs_scores:
            self.awaiting_scores = True
            _TLS.pending = self
        elif not o.lag and self._over_budget():
            self._compress()  # no scores needed (StreamingLLM): compress the stored copy right after the chunk
        return K, V

    def chunked_attention(self, query: torch.Tensor, *, scaling: float, dropout: float, training: bool
                          ) -> torch.Tensor:
        """Attend a split prefill chunk by chunk: store chunk c (compressing the memory as a chunked loop would),
        attend its queries over [memory ; chunk c], hand P to :meth:`observe`; returns out [b, q, h, d]."""
        kn, vn, pn, B = self.pending_prefill
        self.pending_prefill = None
        outs = []
        for s in range(0, kn.shape[-2], B):
            K, V = self._append(kn[:, :, s:s + B], vn[:, :, s:s + B], pn[..., s:s + B])
            _TLS.pending = None
            out, P = _attend(query[:, :, s:s + B], K, V, scaling, dropout, training)
            if self.owner.needs_scores:
                self.observe(P.detach())
            outs.append(out)
        return torch.cat(outs, dim=1)

    def observe(self, probs: torch.Tensor) -> None:
        """Receive the chunk's attention probabilities P ∈ R^{b×h_q×q×L} (query heads grouped onto KV heads)."""
        b, hq, _, L = probs.shape
        h = self.keys.shape[1]
        p = probs.float().reshape(b, h, hq // h, probs.shape[2], L)
        s = p.sum(dim=(2, 3))
        self.scores = s
        self.last_query = p[:, :, :, -1, :].mean(dim=2)
        if self.owner.accumulate_scores:
            self.acc_scores = s if self.acc_scores is None else self.acc_scores + s
        self.awaiting_scores = False
        if not self.owner.lag and self._over_budget():
            self._compress()  # the fused slots stay live: the next chunk's loss reaches the conv

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError(f"{OWNER}: beam search is not supported by LoCoCoCache")

    def crop(self, max_length: int) -> None:
        raise NotImplementedError(f"{OWNER}: LoCoCoCache cannot be cropped (compressed slots have no position)")


DEFAULT_BUFFER = 16  # repo default; compressing on every decoded token costs ~3x the decode time (benchmarks)


class LoCoCoCache(_require_transformers().Cache):
    """Fixed-budget KV cache (``transformers.Cache``) for chunked prefill, training and ``generate()``.

    Args:
        num_layers: decoder layers of the model.
        num_kv_heads: KV heads per layer.
        head_dim: d.
        policy: ``"lococo"`` (conv fusion), ``"streaming"`` (StreamingLLM), ``"h2o"``, ``"tova"`` or ``"full"``.
        budget: M, the memory slots kept per layer and head.
        compressors: one :class:`LoCoCoCompressor` per layer (policy ``"lococo"``).
        buffer: compress only when the cache exceeds M + buffer (default and repo: 16, so decoding compresses once
            every 16 tokens; 0 compresses on every token and keeps exactly M slots, as the experiment does).
        lag: True: compress [memory ; previous chunk] when the next chunk arrives (repo); False: right after.
        n_sink: StreamingLLM sink tokens (the rest of the budget is the recent window).
        recent: H2O's recent window (the rest of the budget goes to heavy hitters).
        accumulate_scores: H2O scores summed over all chunks (original H2O) instead of the last chunk (repo).
        tova_per_head: TOVA per head instead of head-averaged (original).
        local_len: LoCoCo's verbatim local window (repo ``--local_len``): the last ``local_len`` cached tokens are
            always among the heavy hitters. Taken from the compressors (``make_compressors(local_len=...)``);
            given here it must match them.
        prefill_chunk_size: a call that brings more than this many tokens (a one-call prefill such as
            ``model.generate(ids)``) is split into chunks of this size inside the layer, each attended over the
            memory compressed after the previous chunk, exactly as a chunk-by-chunk loop (so the attention matrix
            is at most chunk × (M + buffer + chunk) whatever the prompt length; needs the ``"lococo"``
            attention). ``"auto"`` (default): the chunk the compressors were built for (``make_compressors(
            chunk_size=...)``), else M. ``None``: one-shot prefill (all tokens attend the uncompressed prompt;
            single-shot use with :meth:`compress_now`).
    """

    def __init__(self, *, num_layers: int, num_kv_heads: int, head_dim: int, policy: str = "lococo",
                 budget: int = 64, compressors: nn.ModuleList | list[LoCoCoCompressor] | None = None,
                 buffer: int = DEFAULT_BUFFER, lag: bool = True, n_sink: int = 4, recent: int = 0,
                 accumulate_scores: bool = False, tova_per_head: bool = False, local_len: int | None = None,
                 prefill_chunk_size: int | str | None = "auto", attn_implementation: str | None = None) -> None:
        self.policy = v.one_of(OWNER, "policy", policy, POLICIES)
        n_layers = v.integer(OWNER, "num_layers", num_layers, minimum=1)
        self.num_kv_heads = v.integer(OWNER, "num_kv_heads", num_kv_heads, minimum=1)
        self.head_dim = v.integer(OWNER, "head_dim", head_dim, minimum=1)
        self.budget = v.integer(OWNER, "budget", budget, minimum=2)
        self.buffer = v.integer(OWNER, "buffer", buffer, minimum=0)
        self.lag = bool(lag)
        self.n_sink = v.integer(OWNER, "n_sink", n_sink, minimum=0, maximum=self.budget)
        self.recent = v.integer(OWNER, "recent", recent, minimum=0, maximum=self.budget)
        self.accumulate_scores, self.tova_per_head = bool(accumulate_scores), bool(tova_per_head)
        self.compressors = compressors
        if policy == "lococo":
            if compressors is None or len(compressors) != n_layers:
                raise ValueError(f"{OWNER}: policy='lococo' needs one compressor per layer ({n_layers}), got "
                                 f"{None if compressors is None else len(compressors)}")
            for c in compressors:
                if c.head_dim != self.head_dim:
                    raise ValueError(f"{OWNER}: compressor head_dim={c.head_dim} does not match the model's "
                                     f"head_dim={self.head_dim}")
                if c.budget != self.budget:
                    raise ValueError(f"{OWNER}: compressor budget={c.budget} does not match budget={self.budget}")
                if local_len is not None and c.local_len != local_len:
                    raise ValueError(f"{OWNER}: local_len={local_len} does not match the compressors' local_len="
                                     f"{c.local_len}; build them with make_compressors(local_len={local_len})")
        elif local_len is not None and local_len != 0:
            raise ValueError(f"{OWNER}: local_len is LoCoCo's knob (policy='lococo'); H2O's local window is "
                             f"recent=..., got local_len={local_len} with policy={policy!r}")
        self.local_len = (compressors[0].local_len if policy == "lococo" else 0)
        if prefill_chunk_size == "auto":
            windows = [c.max_window - c.m_c for c in compressors or [] if getattr(c, "max_window", None)]
            self.prefill_chunk: int | None = min(windows) if policy == "lococo" and windows else self.budget
        elif prefill_chunk_size is None:
            self.prefill_chunk = None
        else:
            self.prefill_chunk = v.integer(OWNER, "prefill_chunk_size", prefill_chunk_size, minimum=1)
        self.attn_implementation = attn_implementation
        self.needs_scores = policy in ("lococo", "h2o", "tova")
        super().__init__(layers=[BudgetLayer(self, i) for i in range(n_layers)])

    @classmethod
    def from_model(cls, model: nn.Module, **kwargs: Any) -> LoCoCoCache:
        """A cache sized for ``model`` (a transformers decoder); checks its attention implementation first."""
        cfg = model.config
        impl = getattr(cfg, "_attn_implementation", None)
        policy = kwargs.get("policy", "lococo")
        if policy in ("lococo", "h2o", "tova") and impl != ATTN_IMPLEMENTATION:
            raise ValueError(f"{OWNER}: policy {policy!r} needs attention scores but the model uses "
                             f"attn_implementation={impl!r}, which cannot return them; call "
                             "icml24.lococo.use_lococo_attention(model) (attn_implementation='lococo')")
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        return cls(num_layers=cfg.num_hidden_layers, num_kv_heads=kv, head_dim=head_dim,
                   **{"attn_implementation": impl, **kwargs})

    @property
    def lengths(self) -> list[int]:
        """Stored slots per layer."""
        return [layer.length for layer in self.layers]

    def positions(self, layer_idx: int = 0) -> torch.Tensor:
        """Absolute position of every stored slot of a layer, [b, h, L] (−1 for fused slots)."""
        return self.layers[layer_idx].pos

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               cache_kwargs: dict[str, Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.layers[layer_idx].update(key_states, value_states, cache_kwargs)

    def compress_now(self) -> LoCoCoCache:
        """Compress every layer holding more than M slots to M now (single-shot use after a one-chunk prefill)."""
        for layer in self.layers:
            if self.policy != "full" and layer.length > self.budget:
                if layer.awaiting_scores:
                    raise RuntimeError(f"{OWNER}: no attention scores yet; use attn_implementation='lococo'")
                layer._compress()
        return self


def make_compressors(*, num_layers: int, head_dim: int, budget: int, chunk_size: int, kernel_size: int = 21,
                     hh_keep_rate: float = 0.5, lambda_init: float = 0.5, bounded_lambda: bool = True,
                     learn_lambda: bool = True, n_conv_layers: int = 1, local_len: int = 0, seed: int | None = None
                     ) -> nn.ModuleList:
    """One :class:`LoCoCoCompressor` per layer; the kernel is checked against the fused window m_c + chunk, and the
    cache built on them splits longer one-call prefills into chunks of ``chunk_size``."""
    n = v.integer(OWNER, "num_layers", num_layers, minimum=1)
    B = v.integer(OWNER, "chunk_size", chunk_size, minimum=1)
    from icml24.lococo.compressor import check_budget

    _, m_c = check_budget(budget, hh_keep_rate)
    if seed is not None:
        torch.manual_seed(seed)
    return nn.ModuleList([LoCoCoCompressor(head_dim=head_dim, budget=budget, kernel_size=kernel_size,
                                           hh_keep_rate=hh_keep_rate, lambda_init=lambda_init,
                                           bounded_lambda=bounded_lambda, learn_lambda=learn_lambda,
                                           n_conv_layers=n_conv_layers, max_window=m_c + B, local_len=local_len)
                          for _ in range(n)])
