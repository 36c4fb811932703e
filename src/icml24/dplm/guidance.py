"""Plug-and-play classifier guidance toward secondary structure (DPLM §4; the official code is unreleased).

A per-residue secondary-structure head p_φ(y_i | x_t) is trained on the frozen DPLM's last hidden states of
*noised* inputs x_t (random t), so it can read partially masked sequences. Guidance is first-order
(DiGress-style, notes §2.6): with one-hot inputs,

    log p_φ(y | x_{t−1}) ≈ log p_φ(y | x_t) + ⟨∇_{x_t} log p_φ(y | x_t), x_{t−1} − x_t⟩

so the guided logits are ``logits + η · ∇_{onehot(x_t)} Σ_i log p_φ(y_i | x_t)``.

The one-hot path is the network's own forward pass with the word-embedding lookup made linear in the one-hot
rows, everything else in ESM's embedding layer reproduced exactly (:func:`onehot_features`): with
``token_dropout`` (every ESM-2 / DPLM checkpoint) the ``<mask>`` row counts as zero and the embeddings are
rescaled by 0.88 / (1 − observed mask ratio); absolute position ids come from the token ids (``<pad>``-aware);
then the optional embedding LayerNorm and the attention-mask zeroing. At a one-hot vertex the features equal the
normal forward pass; a ``<mask>`` position's gradient still reaches every residue row (ESM's zeroing is a row of
W, not a cut in the graph).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from icml24.common import validate as v
from icml24.common.progress import progress
from icml24.dplm.diffusion import DiffusionProteinLM, q_sample
from icml24.dplm.models import check_vocabulary
from icml24.dplm.tokens import PAD, VOCAB

OWNER = "dplm.guidance"
ESM_MASK_RATIO_TRAIN = 0.15 * 0.8  # hard-coded in ESM's token dropout (the ratio of every ESM training run)


def _backbone(net: nn.Module) -> nn.Module:
    """The Hugging Face network inside a :class:`DiffusionProteinLM` (or ``net`` itself)."""
    return net.net if isinstance(net, DiffusionProteinLM) else net


def _esm_embeddings(net: nn.Module) -> nn.Module:
    """The network's single ``EsmEmbeddings`` layer; refuses what the one-hot path cannot reproduce exactly."""
    try:
        from transformers.models.esm.modeling_esm import EsmEmbeddings
    except ImportError as e:  # pragma: no cover - hf is a core test dependency
        raise ImportError("icml24.dplm guidance needs transformers: pip install 'icml24[hf]'") from e
    found = [m for m in net.modules() if isinstance(m, EsmEmbeddings)]
    if len(found) != 1:
        raise TypeError(f"{OWNER}: guidance needs a transformers ESM network (EsmForMaskedLM / EsmModel) with one "
                        f"EsmEmbeddings layer; {type(net).__name__} has {len(found)}")
    emb = found[0]
    if type(emb).forward is not EsmEmbeddings.forward:
        raise TypeError(f"{OWNER}: {type(emb).__name__} overrides EsmEmbeddings.forward; the one-hot path "
                        f"reproduces only transformers' own embedding layer")
    return emb


def _hidden(net: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    out = net(input_ids=input_ids, attention_mask=(input_ids != PAD).long(), output_hidden_states=True)
    return out.hidden_states[-1]


def _relaxed_embeddings(emb: nn.Module, onehot: torch.Tensor, input_ids: torch.Tensor,
                        attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None) -> torch.Tensor:
    """``EsmEmbeddings.forward`` with the lookup W[x] replaced by onehot · W (token dropout: W's ``<mask>`` row 0)."""
    w = emb.word_embeddings.weight
    if emb.token_dropout:
        keep = torch.ones(w.shape[0], 1, dtype=w.dtype, device=w.device)
        keep[emb.mask_token_id] = 0.0
        w = w * keep
    e = onehot.to(w.dtype) @ w
    if emb.token_dropout:
        # ESM: embeddings · (1 − 0.12) / (1 − #mask / length), length = attention_mask.sum(-1) when given
        length = attention_mask.sum(-1) if attention_mask is not None else input_ids.shape[1]
        ratio = onehot[..., emb.mask_token_id].sum(-1).float() / length
        e = (e * (1 - ESM_MASK_RATIO_TRAIN) / (1 - ratio)[:, None, None]).to(e.dtype)
    if emb.position_embedding_type == "absolute":
        if position_ids is None:  # ESM's create_position_ids_from_input_ids: <pad> keeps position padding_idx
            nonpad = input_ids.ne(emb.padding_idx).int()
            position_ids = (torch.cumsum(nonpad, dim=1).type_as(nonpad) * nonpad).long() + emb.padding_idx
        e = e + emb.position_embeddings(position_ids)
    if emb.layer_norm is not None:
        e = emb.layer_norm(e)
    if attention_mask is not None:
        e = (e * attention_mask.unsqueeze(-1)).to(e.dtype)
    return e


def onehot_features(net: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The last hidden states of ``net`` on ``x`` as a differentiable function of onehot(x).

    Runs the network's normal forward pass on ``x`` (so attention, rotary or relative positions and every layer
    are its own) and swaps its embedding layer's output for :func:`_relaxed_embeddings` of a one-hot leaf; the
    swap is checked against the layer's own output on every call and refused if they differ.

    Returns:
        (onehot (B, L, |V|) leaf with ``requires_grad``, hidden states (B, L, d)).
    """
    net = _backbone(net)
    check_vocabulary(OWNER, net)
    emb = _esm_embeddings(net)
    onehot = F.one_hot(x, len(VOCAB)).to(emb.word_embeddings.weight.dtype).requires_grad_(True)
    bind = inspect.signature(emb.forward).bind

    def swap(module: nn.Module, args: tuple, kwargs: dict, output: torch.Tensor) -> torch.Tensor:
        a = bind(*args, **kwargs)
        a.apply_defaults()
        ids = a.arguments["input_ids"]
        if a.arguments["inputs_embeds"] is not None or ids is None or not torch.equal(ids, x):
            raise RuntimeError(f"{OWNER}: the ESM network did not embed the guided tokens by their ids")
        relaxed = _relaxed_embeddings(module, onehot, ids, a.arguments["attention_mask"], a.arguments["position_ids"])
        ref = output.detach()
        gap = float((relaxed.detach() - ref).abs().max())
        tol = 64 * torch.finfo(ref.dtype).eps * (1.0 + float(ref.abs().max()))
        if not gap <= tol:
            raise RuntimeError(f"{OWNER}: the one-hot embeddings differ from ESM's own by {gap:.3g} (tolerance "
                               f"{tol:.3g}); this EsmEmbeddings is not reproduced, so guidance is refused")
        return relaxed

    handle = emb.register_forward_hook(swap, with_kwargs=True)
    try:
        h = _hidden(net, x)
    finally:
        handle.remove()
    return onehot, h


def train_structure_head(net: nn.Module, tokens: torch.Tensor, labels: torch.Tensor, *, n_classes: int = 3,
                         steps: int = 300, batch_size: int = 64, lr: float = 3e-3, num_timesteps: int = 500,
                         generator: torch.Generator | None = None) -> nn.Linear:
    """Fit a linear SS head on the frozen ``net``'s features of noised inputs x_t (t ~ U{1..T}).

    Args:
        tokens: clean token ids (N, L + 2); labels: per-residue classes (N, L).
    """
    v.tensor(OWNER, "tokens", tokens, ndim=2)
    v.tensor(OWNER, "labels", labels, ndim=2)
    if labels.shape != (tokens.shape[0], tokens.shape[1] - 2):
        raise ValueError(f"{OWNER}: labels must have shape (N, L) = {(tokens.shape[0], tokens.shape[1] - 2)} for "
                         f"tokens {tuple(tokens.shape)}, got {tuple(labels.shape)}")
    v.integer(OWNER, "steps", steps, minimum=1)
    net = _backbone(net)
    check_vocabulary(OWNER, net)
    net.eval()
    trainable = [p for p in net.parameters() if p.requires_grad]
    for p in trainable:
        p.requires_grad_(False)
    d = net.get_input_embeddings().weight.shape[1]
    head = nn.Linear(d, n_classes).to(tokens.device)
    opt = torch.optim.Adam(head.parameters(), lr=lr)
    for _ in progress(range(steps), desc="SS head"):
        idx = torch.randint(len(tokens), (batch_size,), generator=generator)
        x0 = tokens[idx]
        t = torch.randint(1, num_timesteps + 1, (batch_size,), generator=generator)
        xt, _ = q_sample(x0, t, num_timesteps, generator=generator)
        with torch.no_grad():
            h = _hidden(net, xt)[:, 1:-1]
        loss = F.cross_entropy(head(h).reshape(-1, n_classes), labels[idx].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    for p in trainable:
        p.requires_grad_(True)
    return head.eval()


class StructureGuidance:
    """``guidance(x, logits) -> η ∇_{onehot(x)} Σ_i log p_φ(target_i | x)`` for :func:`reparam_decode`.

    Args:
        net: the frozen DPLM network (the one being sampled).
        head: a per-residue SS head from :func:`train_structure_head`.
        target: class index per residue (length L) or one class for every residue.
        scale: η, the guidance strength (0 disables it).
    """

    def __init__(self, net: nn.Module, head: nn.Module, *, target: int | Sequence[int], scale: float) -> None:
        self.net, self.head = _backbone(net), head
        check_vocabulary(OWNER, self.net)
        _esm_embeddings(self.net)
        self.scale = v.non_negative(OWNER, "scale", scale)
        self.target = target

    def __call__(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        if self.scale == 0:
            return torch.zeros_like(logits)
        n_res = x.shape[1] - 2
        target = torch.as_tensor(self.target, device=x.device).long()
        target = target.expand(n_res) if target.dim() == 0 else target
        if target.shape != (n_res,):
            raise ValueError(f"{OWNER}: target must have one class per residue ({n_res}), got {tuple(target.shape)}")
        onehot, h = onehot_features(self.net, x)
        h = h[:, 1:-1]
        logp = torch.log_softmax(self.head(h), -1).gather(-1, target.expand(len(x), -1).unsqueeze(-1))
        (grad,) = torch.autograd.grad(logp.sum(), onehot)
        return self.scale * grad.masked_fill((x == PAD).unsqueeze(-1), 0.0)

