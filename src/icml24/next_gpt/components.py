"""The frozen "pretrained" components of the CPU world (notes §5.2), trained once per world and cached on disk.

* :class:`WordTokenizer` — a word-level tokenizer built in code (the HF-tokenizer subset NExT-GPT needs).
* :func:`build_llm` — a tiny random-init ``transformers`` ``LlamaForCausalLM`` pretrained on the world's text.
* :class:`JointEncoder` — ImageBind-lite: one encoder per modality + a text encoder trained with a symmetric
  InfoNCE loss into one space, text as the binding hub.
* :class:`DiffusionDecoder` — per modality a conditional ε-prediction DDPM with its own text encoder
  (``encode_condition(captions) -> (B, N_c, D_c)``, SD's 77x768 analogue), classifier-free guidance and DDIM.
* :class:`Oracle` — attribute classifiers per modality (evaluation only).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from icml24.common.progress import progress
from icml24.next_gpt import world as W


# ------------------------------------------------------------------------------------------------ tokenizer
class WordTokenizer:
    """Word-level tokenizer with the HF methods NExT-GPT uses (``add_tokens``, ``convert_tokens_to_ids``,
    ``encode``/``decode``, ``len``). Unknown words map to ``<unk>``."""

    def __init__(self, words: list[str]) -> None:
        self.specials = ["<pad>", "<bos>", "<unk>"]
        self.itos: list[str] = self.specials + [w for w in words if w not in self.specials]
        self.stoi = {w: i for i, w in enumerate(self.itos)}
        self.pad_token_id, self.bos_token_id, self.unk_token_id = 0, 1, 2

    def __len__(self) -> int:
        return len(self.itos)

    def add_tokens(self, tokens: list[str]) -> int:
        new = [t for t in tokens if t not in self.stoi]
        for t in new:
            self.stoi[t] = len(self.itos)
            self.itos.append(t)
        return len(new)

    def convert_tokens_to_ids(self, tokens: list[str]) -> list[int]:
        return [self.stoi.get(t, self.unk_token_id) for t in tokens]

    def encode(self, text: str) -> list[int]:
        return self.convert_tokens_to_ids(text.split())

    def decode(self, ids: list[int] | torch.Tensor, *, skip_special_tokens: bool = True) -> str:
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else ids
        words = [self.itos[i] for i in ids if not (skip_special_tokens and i < 3)]
        return " ".join(words)


# ------------------------------------------------------------------------------------------------ config
@dataclass(frozen=True)
class FrozenConfig:
    """What the frozen parts are and how long they train (the cache key is a hash of this)."""

    modalities: tuple[str, ...] = ("image", "audio")
    world_seed: int = 0
    embed_dim: int = 64  # joint space width (ImageBind's 1024 analogue)
    llm_hidden: int = 96
    llm_layers: int = 2
    llm_heads: int = 4
    llm_steps: int = 800
    llm_corpus: int = 6000
    # the LLM is pretrained on packed windows of its context length (texts joined by <bos>, cut every
    # llm_context tokens) so that in-context examples that fill the context are in its training regime;
    # llm_packing=False trains on single short texts as before (the old cache keys)
    llm_packing: bool = True
    llm_context: int = 256  # the LLM's max_position_embeddings and the pretraining window length
    llm_windows: int = 32  # packed windows per pretraining step (32 x 256 tokens; unpacked: `batch` texts)
    encoder_steps: int = 500
    decoder_steps: int = 1500
    decoder_batch: int = 48
    decoder_channels: int = 32
    cond_tokens: int = 8  # N_c (SD: 77)
    cond_dim: int = 32  # D_c (SD1.5: 768)
    diffusion_T: int = 200
    oracle_steps: int = 200
    batch: int = 64
    lr: float = 2e-3
    video_decoder: str = "frames"  # "frames": one UNet shared over frames + frame-index embedding; "stacked"
    # NOTE(deviation): v-prediction (SD 2.x) instead of the paper decoders' eps: with eps the video decoder left
    # motion at chance (0.31 vs 0.97 gold-caption accuracy, README "Video decoder")
    prediction: str = "v"  # what the decoders' UNets predict: "v" (Salimans & Ho 2022) or "eps" (DDPM, SD 1.5)

    def __post_init__(self) -> None:
        if self.video_decoder not in ("frames", "stacked"):
            raise ValueError(f"FrozenConfig: video_decoder must be 'frames' or 'stacked', got {self.video_decoder!r}")
        if self.prediction not in ("v", "eps"):
            raise ValueError(f"FrozenConfig: prediction must be 'v' or 'eps', got {self.prediction!r}")
        if not isinstance(self.llm_context, int) or self.llm_context < 2:
            raise ValueError(f"FrozenConfig: llm_context must be an integer >= 2, got {self.llm_context!r}")

    def frames(self, modality: str) -> int:
        """Frames the decoder of ``modality`` denoises with shared weights (1 = the whole item at once)."""
        return W.VIDEO_FRAMES if modality == "video" and self.video_decoder == "frames" else 1

    def key(self) -> str:
        d = asdict(self)
        if "video" not in self.modalities:
            d.pop("video_decoder")  # irrelevant without video: keeps the image/audio cache keys unchanged
        if not self.llm_packing and self.llm_context == 256:
            d.pop("llm_packing")  # the unpacked LLM of 256 positions keeps the cache keys from before packing
            d.pop("llm_context")
            d.pop("llm_windows")
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


def default_cache_dir() -> Path:
    return Path(os.environ.get("ICML24_CACHE", Path.home() / ".cache" / "icml24")) / "next_gpt"


# ------------------------------------------------------------------------------------------------ LLM
def build_llm(*, vocab_size: int, hidden: int, layers: int, heads: int, seed: int, context: int = 256) -> nn.Module:
    """A tiny random-init ``LlamaForCausalLM`` (the same class Vicuna loads as)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=hidden * 3,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                      max_position_embeddings=context, pad_token_id=0, bos_token_id=1, eos_token_id=None,
                      tie_word_embeddings=False)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg)


def _batchify(seqs: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad, dtype=torch.long)
    mask = torch.zeros(len(seqs), L, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
    return ids, mask


def pack_windows(seqs: list[list[int]], length: int, sep: int) -> list[list[int]]:
    """Join token sequences into one stream, each preceded by the separator ``sep``, and cut it into windows of
    ``length`` tokens; every token lands in exactly one window, in order (the last window may be shorter)."""
    if length < 1:
        raise ValueError(f"pack_windows: length must be >= 1, got {length}")
    stream = [t for s in seqs for t in (sep, *s)]
    return [stream[i:i + length] for i in range(0, len(stream), length)]


def _packed_batches(enc: list[list[int]], length: int, sep: int, batch: int, g: np.random.Generator):
    """Endless batches of packed windows: each epoch joins the corpus in a fresh random order and cuts it into
    context-length windows, served ``batch`` at a time in random order."""
    buf: list[list[int]] = []
    while True:  # windows left over at an epoch's end open the next batch: no window is dropped
        wins = pack_windows([enc[i] for i in g.permutation(len(enc))], length, sep)
        buf += [wins[j] for j in g.permutation(len(wins))]
        while len(buf) >= batch:
            yield buf[:batch]
            buf = buf[batch:]


def pretrain_llm(llm: nn.Module, tok: WordTokenizer, corpus: list[str], *, steps: int, batch: int, lr: float,
                 seed: int, context: int | None = None) -> list[float]:
    """Next-token pretraining on ``corpus``: single texts (``<bos>`` + text, ``context=None``) or packed windows
    of ``context`` tokens (:func:`pack_windows`, texts joined by ``<bos>``)."""
    g = np.random.default_rng(seed)
    opt = torch.optim.AdamW(llm.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    if context is None:
        enc = [[tok.bos_token_id] + tok.encode(t) for t in corpus]
        draw = lambda: [enc[i] for i in g.integers(0, len(enc), batch)]  # noqa: E731
    else:
        texts = [tok.encode(t) for t in corpus]
        if sum(len(t) + 1 for t in texts) < batch * context:
            raise ValueError(f"pretrain_llm: the corpus holds fewer than batch={batch} windows of {context} tokens")
        stream = _packed_batches(texts, context, tok.bos_token_id, batch, g)
        draw = lambda: next(stream)  # noqa: E731
    losses = []
    llm.train()
    for _ in progress(range(steps), desc="next_gpt: pretrain LLM"):
        ids, mask = _batchify(draw())
        labels = ids.masked_fill(mask == 0, -100)
        loss = llm(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(llm.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    llm.eval()
    return losses


# ------------------------------------------------------------------------------------------------ encoders
class ConvEncoder(nn.Module):
    """(B, C, 16, 16) -> (B, D): two stride-2 convs and a linear head (image / video frames stacked / log-mel)."""

    def __init__(self, in_ch: int, out_dim: int, width: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(in_ch, width, 3, padding=1), nn.GELU(),
                                 nn.Conv2d(width, width * 2, 3, stride=2, padding=1), nn.GELU(),
                                 nn.Conv2d(width * 2, width * 2, 3, stride=2, padding=1), nn.GELU(),
                                 nn.Flatten(), nn.Linear(width * 2 * 16, 128), nn.GELU(), nn.Linear(128, out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class TextEncoder(nn.Module):
    """Word-level text encoder: embeddings + positions -> small transformer -> token states (B, N, D)."""

    def __init__(self, vocab: int, dim: int, n_tokens: int, layers: int = 2) -> None:
        super().__init__()
        self.n_tokens = n_tokens
        self.emb = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(n_tokens, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, 4, dim * 2, dropout=0.0, batch_first=True, norm_first=True)
        self.tf = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.norm(self.tf(self.emb(ids) + self.pos))


def text_ids(tok: WordTokenizer, texts: list[str], n_tokens: int) -> torch.Tensor:
    """Right-padded word ids (B, n_tokens); the decoders' text encoders read all n_tokens positions (like SD's
    77-token CLIP states including padding)."""
    out = torch.zeros(len(texts), n_tokens, dtype=torch.long)
    for i, t in enumerate(texts):
        ids = ([tok.bos_token_id] + tok.encode(t))[:n_tokens]
        out[i, :len(ids)] = torch.tensor(ids)
    return out


class JointEncoder(nn.Module):
    """ImageBind-lite: modality encoders and a text encoder into one normalised ``embed_dim`` space."""

    def __init__(self, modalities: tuple[str, ...], vocab: int, embed_dim: int) -> None:
        super().__init__()
        self.encoders = nn.ModuleDict({m: ConvEncoder(W.spec(m).shape[0], embed_dim) for m in modalities})
        self.text = TextEncoder(vocab, embed_dim, 12)
        self.text_head = nn.Linear(embed_dim, embed_dim)
        self.logit_scale = math.log(1 / 0.07)

    def input_shape(self, modality: str) -> tuple[int, ...]:
        """Per-item input shape of ``modality`` (the conv encoders are built for the world's 16x16 grids)."""
        return W.spec(modality).shape

    def output_dim(self, modality: str) -> int:
        return self.encoders[modality].net[-1].out_features

    def encode(self, modality: str, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.encoders[modality](x), dim=-1)

    def encode_text(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.text(ids)
        return F.normalize(self.text_head(h.mean(1)), dim=-1)


def _info_nce(a: torch.Tensor, b: torch.Tensor, same: torch.Tensor, scale: float) -> torch.Tensor:
    """Symmetric InfoNCE with every pair of identical captions counted as a positive."""
    logits = a @ b.T * scale
    target = same.float() / same.float().sum(1, keepdim=True)
    return 0.5 * (torch.sum(-target * logits.log_softmax(1), 1).mean()
                  + torch.sum(-target.T * logits.log_softmax(0).T, 1).mean())


# ------------------------------------------------------------------------------------------------ diffusion
class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, emb: int) -> None:
        super().__init__()
        self.n1, self.c1 = nn.GroupNorm(8, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.n2, self.c2 = nn.GroupNorm(8, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.film = nn.Linear(emb, 2 * cout)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        h = self.c1(F.silu(self.n1(x)))
        s, b = self.film(e)[:, :, None, None].chunk(2, 1)
        h = self.c2(F.silu(self.n2(h) * (1 + s) + b))
        return h + self.skip(x)


class CrossAttention(nn.Module):
    def __init__(self, ch: int, cond_dim: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(8, ch)
        self.attn = nn.MultiheadAttention(ch, 4, kdim=cond_dim, vdim=cond_dim, batch_first=True)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        B, C, H, Wd = x.shape
        q = self.norm(x).flatten(2).transpose(1, 2)
        y, _ = self.attn(q, c, c, need_weights=False)
        return x + y.transpose(1, 2).reshape(B, C, H, Wd)


class Denoiser(nn.Module):
    """A two-level UNet ε(x_t, t, c) with FiLM time/pooled-condition embeddings and cross-attention to the
    condition tokens at 8x8."""

    def __init__(self, ch: int, width: int, cond_dim: int) -> None:
        super().__init__()
        e = width * 2
        self.temb = nn.Sequential(nn.Linear(width, e), nn.SiLU(), nn.Linear(e, e))
        self.cemb = nn.Linear(cond_dim, e)
        self.width = width
        self.inp = nn.Conv2d(ch, width, 3, padding=1)
        self.d1 = ResBlock(width, width, e)
        self.down = nn.Conv2d(width, width * 2, 3, stride=2, padding=1)
        self.m1 = ResBlock(width * 2, width * 2, e)
        self.xa = CrossAttention(width * 2, cond_dim)
        self.m2 = ResBlock(width * 2, width * 2, e)
        self.up = nn.ConvTranspose2d(width * 2, width, 4, stride=2, padding=1)
        self.u1 = ResBlock(width * 2, width, e)
        self.out = nn.Sequential(nn.GroupNorm(8, width), nn.SiLU(), nn.Conv2d(width, ch, 3, padding=1))

    def forward(self, x: torch.Tensor, t: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        half = self.width // 2
        f = torch.exp(-math.log(1000.0) * torch.arange(half, dtype=torch.float32) / half)
        a = t.float()[:, None] * f[None]
        e = self.temb(torch.cat([a.sin(), a.cos()], 1)) + self.cemb(c.mean(1))
        h1 = self.d1(self.inp(x), e)
        h = self.m2(self.xa(self.m1(self.down(h1), e), c), e)
        return self.out(self.u1(torch.cat([self.up(h), h1], 1), e))


class FrameDenoiser(Denoiser):
    """ε(x_t, t, c) for a clip of ``frames`` frames stacked on channels: one :class:`Denoiser` shared over the
    frames, each frame told its index through a learned embedding added to the time/condition embedding, and
    two coordinate channels (x, y in [-1, 1]) on the input so that where the shape sits in a frame (the motion)
    can depend on the frame index."""

    def __init__(self, ch: int, width: int, cond_dim: int, frames: int) -> None:
        if ch % frames:
            raise ValueError(f"FrameDenoiser: channels {ch} must be a multiple of frames {frames}")
        super().__init__(ch // frames, width, cond_dim)
        self.frames = frames
        self.femb = nn.Embedding(frames, width * 2)
        self.inp = nn.Conv2d(ch // frames + 2, width, 3, padding=1)

    def forward(self, x: torch.Tensor, t: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        B, C, H, Wd = x.shape
        Fr = self.frames
        half = self.width // 2
        f = torch.exp(-math.log(1000.0) * torch.arange(half, dtype=torch.float32) / half)
        a = t.float()[:, None] * f[None]
        e = self.temb(torch.cat([a.sin(), a.cos()], 1)) + self.cemb(c.mean(1))
        e = (e[:, None] + self.femb.weight[None]).reshape(B * Fr, -1)
        c = c.repeat_interleave(Fr, 0)
        xf = x.reshape(B * Fr, C // Fr, H, Wd)
        yy, xx = torch.meshgrid(torch.linspace(-1, 1, H), torch.linspace(-1, 1, Wd), indexing="ij")
        xf = torch.cat([xf, torch.stack([xx, yy]).expand(B * Fr, -1, -1, -1)], 1)
        h1 = self.d1(self.inp(xf), e)
        h = self.m2(self.xa(self.m1(self.down(h1), e), c), e)
        return self.out(self.u1(torch.cat([self.up(h), h1], 1), e)).reshape(B, C, H, Wd)


class DiffusionDecoder(nn.Module):
    """Conditional DDPM for one modality with its own text encoder, classifier-free guidance and DDIM sampling.

    ``encode_condition(captions)`` gives the (B, N_c, D_c) conditioning states that NExT-GPT's output projector
    is aligned to (SD's CLIP ``last_hidden_state`` analogue); ``generate(cond)`` samples media from them.
    With x_t = a·x0 + b·ε (a² + b² = 1) the UNet predicts ε (``prediction="eps"``) or v = a·ε − b·x0 (``"v"``).
    """

    def __init__(self, modality: str, tok: WordTokenizer, *, width: int, cond_tokens: int, cond_dim: int,
                 T: int, frames: int = 1, prediction: str = "v") -> None:
        super().__init__()
        if prediction not in ("v", "eps"):
            raise ValueError(f"DiffusionDecoder: prediction must be 'v' or 'eps', got {prediction!r}")
        self.prediction = prediction
        self.modality = modality
        self.tok = tok
        self.shape = W.spec(modality).shape
        self.text_encoder = TextEncoder(len(tok), cond_dim, cond_tokens)
        self.unet = (Denoiser(self.shape[0], width, cond_dim) if frames == 1
                     else FrameDenoiser(self.shape[0], width, cond_dim, frames))
        self.T = T
        s = 0.008
        steps = torch.arange(T + 1, dtype=torch.float64) / T
        ab = torch.cos((steps + s) / (1 + s) * math.pi / 2) ** 2
        ab = (ab / ab[0])[1:].clamp(min=1e-5)
        self.register_buffer("alpha_bar", ab.float())

    @property
    def cond_shape(self) -> tuple[int, int]:
        return self.text_encoder.n_tokens, self.text_encoder.norm.normalized_shape[0]

    def encode_condition(self, captions: list[str]) -> torch.Tensor:
        return self.text_encoder(text_ids(self.tok, captions, self.text_encoder.n_tokens))

    def loss(self, x0: torch.Tensor, cond: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        B = x0.shape[0]
        t = torch.randint(0, self.T, (B,), generator=g)
        eps = torch.randn(x0.shape, generator=g)
        ab = self.alpha_bar[t][:, None, None, None]
        a, b = ab.sqrt(), (1 - ab).sqrt()
        target = eps if self.prediction == "eps" else a * eps - b * x0
        return F.mse_loss(self.unet(a * x0 + b * eps, t, cond), target)

    @torch.no_grad()
    def generate(self, cond: torch.Tensor, *, guidance_scale: float = 3.0, steps: int = 20,
                 seed: int = 0) -> torch.Tensor:
        """DDIM (η=0) sampling with classifier-free guidance; ``cond`` (B, N_c, D_c) -> media (B, C, H, W)."""
        n_tok, dim = self.cond_shape
        if cond.ndim != 3 or tuple(cond.shape[1:]) != (n_tok, dim):
            raise ValueError(f"DiffusionDecoder[{self.modality}]: cond must have shape (B, {n_tok}, {dim}), "
                             f"got {tuple(cond.shape)}")
        B = cond.shape[0]
        g = torch.Generator().manual_seed(seed)
        x = torch.randn((B, *self.shape), generator=g)
        uncond = self.encode_condition([""]).expand(B, -1, -1)
        ts = torch.linspace(self.T - 1, 0, steps).round().long()
        for i, t in enumerate(ts):
            tt = t.repeat(B)
            out = self.unet(torch.cat([x, x]), torch.cat([tt, tt]), torch.cat([cond, uncond]))
            oc, ou = out.chunk(2)
            out = ou + guidance_scale * (oc - ou)  # CFG, linear in the prediction (eps or v alike)
            ab = self.alpha_bar[t]
            a, b = ab.sqrt(), (1 - ab).sqrt()
            if self.prediction == "eps":
                eps, x0 = out, (x - b * out) / a
            else:
                eps, x0 = b * x + a * out, a * x - b * out
            x0 = x0.clamp(-1.5, 1.5)
            ab_prev = self.alpha_bar[ts[i + 1]] if i + 1 < len(ts) else torch.tensor(1.0)
            x = ab_prev.sqrt() * x0 + (1 - ab_prev).sqrt() * eps
        return x


# ------------------------------------------------------------------------------------------------ oracle
class Oracle(nn.Module):
    """Attribute classifiers of one modality (a shared conv trunk, one head per attribute)."""

    def __init__(self, modality: str) -> None:
        super().__init__()
        s = W.spec(modality)
        self.modality = modality
        self.trunk = ConvEncoder(s.shape[0], 64)
        self.heads = nn.ModuleDict({a: nn.Linear(64, len(v)) for a, v in s.attrs})

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h = F.gelu(self.trunk(x))
        return {a: head(h) for a, head in self.heads.items()}

    @torch.no_grad()
    def attribute_accuracy(self, x: torch.Tensor, attrs: list[dict[str, str]]) -> torch.Tensor:
        """Per item: the fraction of its attributes the oracle recognises in ``x`` (B,)."""
        s = W.spec(self.modality)
        out = self(x)
        hits = torch.zeros(len(attrs))
        for a, vals in s.attrs:
            pred = out[a].argmax(1)
            gold = torch.tensor([vals.index(d[a]) for d in attrs])
            hits += (pred == gold).float()
        return hits / len(s.attrs)


# ------------------------------------------------------------------------------------------------ bundle
@dataclass
class Frozen:
    """Everything frozen: tokenizer, LLM, joint encoder, decoders and oracles (all in eval mode, no grads)."""

    cfg: FrozenConfig
    tok: WordTokenizer
    llm: nn.Module
    encoder: JointEncoder
    decoders: dict[str, DiffusionDecoder]
    oracles: dict[str, Oracle]
    info: dict[str, Any]


def _freeze(m: nn.Module) -> nn.Module:
    m.eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m


def _augment(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    return x + 0.15 * torch.randn(x.shape, generator=g)


def train_frozen(cfg: FrozenConfig) -> Frozen:
    """Train every frozen part of the world ``cfg`` from scratch (deterministic given ``cfg.world_seed``)."""
    specs = [W.spec(m) for m in cfg.modalities]
    seed = cfg.world_seed
    rng = np.random.default_rng(seed)
    g = torch.Generator().manual_seed(seed)
    tok = WordTokenizer(W.vocabulary())
    info: dict[str, Any] = {}

    llm = build_llm(vocab_size=len(tok), hidden=cfg.llm_hidden, layers=cfg.llm_layers, heads=cfg.llm_heads,
                    seed=seed, context=cfg.llm_context)
    t_llm = time.perf_counter()
    info["llm_loss"] = pretrain_llm(llm, tok, W.lm_corpus(specs, rng, cfg.llm_corpus), steps=cfg.llm_steps,
                                    batch=cfg.llm_windows if cfg.llm_packing else cfg.batch, lr=cfg.lr, seed=seed,
                                    context=cfg.llm_context if cfg.llm_packing else None)[-50:]
    info["llm_pretrain_s"] = round(time.perf_counter() - t_llm, 1)

    torch.manual_seed(seed + 1)
    enc = JointEncoder(cfg.modalities, len(tok), cfg.embed_dim)
    opt = torch.optim.AdamW(enc.parameters(), lr=cfg.lr)
    for _ in progress(range(cfg.encoder_steps), desc="next_gpt: joint encoder"):
        loss = torch.zeros(())
        for s in specs:  # text is the hub: every modality is bound to text only
            x, attrs = W.sample_items(s, cfg.batch, rng)
            caps = [s.caption(a) for a in attrs]
            same = torch.tensor([[c1 == c2 for c2 in caps] for c1 in caps])
            loss = loss + _info_nce(enc.encode(s.name, _augment(x, g)),
                                    enc.encode_text(text_ids(tok, caps, 12)), same, enc.logit_scale)
        opt.zero_grad()
        loss.backward()
        opt.step()
    info["encoder_loss"] = float(loss)

    decoders, oracles = {}, {}
    for s in specs:
        torch.manual_seed(seed + 2)
        dec = DiffusionDecoder(s.name, tok, width=cfg.decoder_channels, cond_tokens=cfg.cond_tokens,
                               cond_dim=cfg.cond_dim, T=cfg.diffusion_T, frames=cfg.frames(s.name),
                               prediction=cfg.prediction)
        opt = torch.optim.AdamW(dec.parameters(), lr=cfg.lr)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=cfg.decoder_steps,
                                                    pct_start=0.05)
        for _ in progress(range(cfg.decoder_steps), desc=f"next_gpt: {s.name} decoder"):
            # a frame-shared decoder sees decoder_batch frames per step (the same cost as an image batch)
            x, attrs = W.sample_items(s, max(1, cfg.decoder_batch // cfg.frames(s.name)), rng)
            caps = [s.caption(a) if rng.random() > 0.1 else "" for a in attrs]  # p_uncond = 0.1 (CFG)
            loss = dec.loss(x, dec.encode_condition(caps), g)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(dec.parameters(), 1.0)
            opt.step()
            sched.step()
        info[f"{s.name}_decoder_loss"] = float(loss)
        decoders[s.name] = _freeze(dec)

        torch.manual_seed(seed + 3)
        orc = Oracle(s.name)
        opt = torch.optim.AdamW(orc.parameters(), lr=cfg.lr)
        for _ in progress(range(cfg.oracle_steps), desc=f"next_gpt: {s.name} oracle"):
            x, attrs = W.sample_items(s, cfg.batch, rng)
            x = x + torch.rand(()) * 0.4 * torch.randn(x.shape, generator=g)
            out = orc(x)
            loss = sum(F.cross_entropy(out[a], torch.tensor([vals.index(d[a]) for d in attrs]))
                       for a, vals in s.attrs)
            opt.zero_grad()
            loss.backward()
            opt.step()
        oracles[s.name] = _freeze(orc)
    return Frozen(cfg, tok, _freeze(llm), _freeze(enc), decoders, oracles, info)


def load_or_train_frozen(cfg: FrozenConfig, cache_dir: Path | None = None) -> Frozen:
    """The frozen parts of world ``cfg``, loaded from ``cache_dir/<hash(cfg)>/frozen.pt`` or trained and cached."""
    path = Path(cache_dir or default_cache_dir()) / cfg.key() / "frozen.pt"
    if path.exists():
        blob = torch.load(path, weights_only=False)
        fr = train_frozen_shell(cfg)
        fr.llm.load_state_dict(blob["llm"])
        fr.encoder.load_state_dict(blob["encoder"])
        for m in cfg.modalities:
            fr.decoders[m].load_state_dict(blob["decoders"][m])
            fr.oracles[m].load_state_dict(blob["oracles"][m])
        fr.info = blob["info"]
        return fr
    fr = train_frozen(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"cfg": asdict(cfg), "llm": fr.llm.state_dict(), "encoder": fr.encoder.state_dict(),
                "decoders": {m: d.state_dict() for m, d in fr.decoders.items()},
                "oracles": {m: o.state_dict() for m, o in fr.oracles.items()}, "info": fr.info}, tmp)
    tmp.replace(path)
    return fr


def train_frozen_shell(cfg: FrozenConfig) -> Frozen:
    """Untrained (random-init) frozen parts with the right shapes (for loading, or a tiny untrained demo)."""
    tok = WordTokenizer(W.vocabulary())
    llm = build_llm(vocab_size=len(tok), hidden=cfg.llm_hidden, layers=cfg.llm_layers, heads=cfg.llm_heads,
                    seed=cfg.world_seed, context=cfg.llm_context)
    enc = JointEncoder(cfg.modalities, len(tok), cfg.embed_dim)
    decs = {m: _freeze(DiffusionDecoder(m, tok, width=cfg.decoder_channels, cond_tokens=cfg.cond_tokens,
                                        cond_dim=cfg.cond_dim, T=cfg.diffusion_T, frames=cfg.frames(m),
                                        prediction=cfg.prediction))
            for m in cfg.modalities}
    orcs = {m: _freeze(Oracle(m)) for m in cfg.modalities}
    return Frozen(cfg, tok, _freeze(llm), _freeze(enc), decs, orcs, {})
