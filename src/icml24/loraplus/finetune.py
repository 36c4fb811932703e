"""The fine-tuning regime of the LoRA+ reproduction: a small transformer pretrained on a source task of MNIST-1D,
then adapted to a shifted target task with LoRA / LoRA+ (or a new head on the frozen backbone).

The network is a 1-D ViT built from the shared timm-layout blocks of :mod:`icml24.common.nets`: the length-40 series
is cut into ``40 / patch`` patches, each embedded by one linear map, a cls token and learned positions are added, and
``depth`` pre-norm blocks (``attn.qkv``, ``attn.proj``, ``mlp.fc1``, ``mlp.fc2``) follow; the head reads the cls token.
Source task: the MNIST-1D classes ``0..4``; target task: the classes ``5..9`` (a new 5-way head), the target series
optionally time-reversed (``reverse_target``). The target's features are not those of the source, so the frozen
backbone + new head is a weak baseline and the adapters must move the features.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from icml24.common import validate as v
from icml24.common.data import load_mnist1d
from icml24.common.nets import Block
from icml24.common.seeding import seed_everything, torch_generator
from icml24.loraplus.lora import apply_lora
from icml24.loraplus.optimizer import create_loraplus_optimizer

__all__ = ["SeqViT", "TransferTask", "make_transfer_task", "pretrain", "finetune_transformer", "LORA_TARGETS"]

LORA_TARGETS = ["qkv", "proj", "fc1", "fc2"]


class SeqViT(nn.Module):
    """A ViT for 1-D series (timm layout): patch embedding, cls token, learned positions, pre-norm blocks, head.

    Args:
        length: series length (40 for MNIST-1D).
        patch: patch length; ``length`` must be divisible by it.
        dim: token width ``d``.
        depth: number of blocks.
        num_heads: attention heads.
        num_classes: outputs of the head.
    """

    def __init__(self, *, length: int = 40, patch: int = 4, dim: int = 32, depth: int = 2, num_heads: int = 4,
                 num_classes: int = 5) -> None:
        super().__init__()
        for name, val in (("length", length), ("patch", patch), ("dim", dim), ("depth", depth),
                          ("num_heads", num_heads), ("num_classes", num_classes)):
            v.integer("SeqViT", name, val, minimum=1)
        if length % patch:
            raise ValueError(f"SeqViT: length ({length}) must be divisible by patch ({patch})")
        self.patch = patch
        self.patch_embed = nn.Linear(patch, dim)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, length // patch + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*[Block(dim, num_heads, 4.0) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The cls-token feature ``(B, d)`` of series ``x`` ``(B, length)``."""
        t = self.patch_embed(x.view(x.shape[0], -1, self.patch))
        t = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), t], dim=1) + self.pos_embed
        return self.norm(self.blocks(t))[:, 0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(x))


@dataclass(frozen=True)
class TransferTask:
    """Source (pretraining) and target (fine-tuning) splits; labels re-indexed to ``0..4``."""

    xs_train: torch.Tensor
    ys_train: torch.Tensor
    xt_train: torch.Tensor
    yt_train: torch.Tensor
    xt_val: torch.Tensor
    yt_val: torch.Tensor
    xt_test: torch.Tensor
    yt_test: torch.Tensor


def make_transfer_task(*, seed: int, num_samples: int = 8000, reverse_target: bool = True,
                       device: str | torch.device = "cpu") -> TransferTask:
    """MNIST-1D classes 0-4 as the source task, classes 5-9 (time-reversed if ``reverse_target``) as the target.

    The series are standardised with the source training set's mean/std. ``seed`` sets the train/validation split.
    """
    s = load_mnist1d(seed=seed, val_fraction=0.2, num_samples=num_samples)
    src, tgt = s.y_train < 5, s.y_train >= 5
    mu, sd = s.x_train[src].mean(), s.x_train[src].std()

    def prep(x: torch.Tensor, target: bool) -> torch.Tensor:
        x = (x - mu) / sd
        return (x.flip(-1) if (target and reverse_target) else x).to(device)

    tv, tt = s.y_val >= 5, s.y_test >= 5
    return TransferTask(prep(s.x_train[src], False), s.y_train[src].to(device),
                        prep(s.x_train[tgt], True), (s.y_train[tgt] - 5).to(device),
                        prep(s.x_val[tv], True), (s.y_val[tv] - 5).to(device),
                        prep(s.x_test[tt], True), (s.y_test[tt] - 5).to(device))


def pretrain(task: TransferTask, *, dim: int, depth: int, steps: int, lr: float, batch_size: int,
             seed: int) -> SeqViT:
    """Train a :class:`SeqViT` on the source task (AdamW, cosine schedule); returns it in eval mode."""
    seed_everything(seed)
    model = SeqViT(dim=dim, depth=depth, num_classes=5).to(task.xs_train.device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    g = torch_generator(seed)
    n = len(task.xs_train)
    for _ in range(steps):
        idx = torch.randint(n, (batch_size,), generator=g).to(task.xs_train.device)
        loss = F.cross_entropy(model(task.xs_train[idx]), task.ys_train[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    return model.eval()


@torch.no_grad()
def _evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    logits = model(x)
    return float(F.cross_entropy(logits, y)), float((logits.argmax(1) == y).float().mean() * 100)


def finetune_transformer(backbone: SeqViT, task: TransferTask, *, mode: str, lr: float, ratio: float = 1.0,
                         rank: int = 4, steps: int, batch_size: int, eval_every: int, seed: int) -> dict[str, np.ndarray]:
    """Adapt a copy of ``backbone`` to the target task and record held-out curves.

    Args:
        backbone: the pretrained source model (not modified).
        task: the transfer task.
        mode: ``"lora"`` (LoRA on every ``qkv/proj/fc1/fc2``, a new trainable head, LoRA+ groups with λ = ``ratio``;
            λ = 1 is plain LoRA) or ``"head"`` (the frozen backbone + a new head).
        lr: η_A (``"lora"``) or the head's lr (``"head"``); Adam, constant.
        ratio: λ = η_B / η_A.
        rank: LoRA rank r (α = r).
        steps: optimisation steps.
        batch_size: minibatch size.
        eval_every: steps between evaluations on the validation and test sets (step 0 included).

    Returns:
        ``{"step", "val_loss", "val_acc", "test_loss", "test_acc"}`` arrays, one entry per evaluation.
    """
    v.one_of("finetune_transformer", "mode", mode, ("lora", "head"))
    seed_everything(seed + 1000)
    model = SeqViT(dim=backbone.head.in_features, depth=len(backbone.blocks), num_classes=5)
    model.load_state_dict({k: t for k, t in backbone.state_dict().items() if not k.startswith("head.")},
                          strict=False)
    model = model.to(task.xt_train.device)
    if mode == "lora":
        apply_lora(model, target_modules=LORA_TARGETS, r=rank, alpha=float(rank), modules_to_save=["head"])
        opt = create_loraplus_optimizer(model, torch.optim.Adam, lr=lr, loraplus_lr_ratio=ratio)
    else:
        for name, p in model.named_parameters():
            p.requires_grad_(name.startswith("head."))
        opt = torch.optim.Adam(model.head.parameters(), lr=lr)
    model.eval()  # no dropout anywhere; eval mode throughout
    xs = (task.xt_train, task.xt_val, task.xt_test)
    net: nn.Module = model
    if mode == "head":  # the backbone is frozen: its features are computed once
        with torch.no_grad():
            xs = tuple(model.forward_features(x) for x in xs)
        net = model.head
    g = torch_generator(seed + 2000)
    n = len(task.xt_train)
    rows = []
    for t in range(steps + 1):
        if t % eval_every == 0 or t == steps:
            rows.append((t, *_evaluate(net, xs[1], task.yt_val), *_evaluate(net, xs[2], task.yt_test)))
            if not np.isfinite(rows[-1][1]):
                break
        if t == steps:
            break
        idx = torch.randint(n, (batch_size,), generator=g).to(task.xt_train.device)
        loss = F.cross_entropy(net(xs[0][idx]), task.yt_train[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    arr = np.array(rows, dtype=float)
    arr[~np.isfinite(arr)] = np.inf
    return {k: arr[:, i] for i, k in enumerate(("step", "val_loss", "val_acc", "test_loss", "test_acc"))}
