"""LoRA+ costs the same as LoRA: time per training step and optimizer-state memory, λ = 1 vs λ > 1.

LoRA+ only changes the learning rate of one parameter group, so a step (forward, backward, AdamW update) and the
optimizer state must cost the same as LoRA's. Measured on a ViT with LoRA on every ``qkv``/``proj``/``fc1``/``fc2``
(``torch.utils.benchmark``, median over repeats).

    python benchmarks/loraplus_step_cost.py [--embed-dim 192] [--depth 6] [--batch 64] [--device cpu]
"""

from __future__ import annotations

import argparse

import torch
from torch.utils import benchmark

from icml24.common.nets import TinyViT
from icml24.loraplus import apply_lora, create_loraplus_optimizer


def _setup(ratio: float, a: argparse.Namespace):
    torch.manual_seed(0)
    model = TinyViT(img_size=32, patch_size=4, in_chans=3, num_classes=100, embed_dim=a.embed_dim, depth=a.depth,
                    num_heads=a.heads)
    model = apply_lora(model, target_modules=["qkv", "proj", "fc1", "fc2"], r=a.rank, alpha=2 * a.rank,
                       modules_to_save=["head"]).to(a.device)
    opt = create_loraplus_optimizer(model, optimizer_cls=torch.optim.AdamW, lr=1e-4, loraplus_lr_ratio=ratio)
    x = torch.randn(a.batch, 3, 32, 32, device=a.device)
    y = torch.randint(0, 100, (a.batch,), device=a.device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    step()  # create the optimizer state
    return model, opt, step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--embed-dim", type=int, default=192)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--heads", type=int, default=3)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--ratios", type=float, nargs="+", default=[1.0, 16.0])
    ap.add_argument("--min-run-time", type=float, default=3.0, help="seconds of timing per arm")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"ViT d={a.embed_dim} depth={a.depth}, LoRA r={a.rank} on qkv/proj/fc1/fc2, batch {a.batch}, {a.device}")
    print("| arm | ms/step (median) | IQR ms | trainable params | optimizer state (MB) |")
    print("|---|---|---|---|---|")
    for ratio in a.ratios:
        model, opt, step = _setup(ratio, a)
        m = benchmark.Timer(stmt="step()", globals={"step": step}, num_threads=a.threads).blocked_autorange(
            min_run_time=a.min_run_time)
        n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
        state_mb = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
                       if torch.is_tensor(t)) / 2**20
        name = "LoRA (λ=1)" if ratio == 1.0 else f"LoRA+ (λ={ratio:g})"
        print(f"| {name} | {m.median * 1e3:.2f} | {m.iqr * 1e3:.2f} | {n_train} | {state_mb:.2f} |")


if __name__ == "__main__":
    main()
