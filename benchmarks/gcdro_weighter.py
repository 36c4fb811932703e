"""Cost of ``GCDROWeighter.update`` per batch: the torch kNN graph (``core.knn_edges``) vs the scikit-learn one.

Arms, on the same batches: ``sklearn graph`` (the update before issue 29: features to the CPU as numpy,
``core.knn_graph`` with scikit-learn's ``kneighbors_graph``, then ``EdgeList.from_adjacency``), ``torch graph``
(today's ``GCDROWeighter.update``: pairwise distances by one matmul + ``topk`` on the batch's device), and, for scale, one SGD
step of a small MLP (forward, backward, step) on the same batch, and the two graph constructions alone
(``graph only``, on the standardised batch). Both weighter arms run the same gradient flow
(``n_inner`` steps). Reported per batch size: the median over ``--repeats`` of the process CPU time and of the
wall time (the machine may be shared: CPU time is the steadier of the two), arms interleaved in rounds.

    python benchmarks/gcdro_weighter.py [--batches 64 256 1024] [--dim 16] [--repeats 30] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from icml24.gcdro import GCDROWeighter, core


def sklearn_update(wt: GCDROWeighter, losses: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """The update as it was before the torch graph (same flow, scikit-learn kNN graph on the CPU)."""
    b = losses.shape[0]
    ell = losses.detach()
    z = features.detach().reshape(b, -1).to("cpu", torch.float64).numpy()
    sd = z.std(0)
    z = (z - z.mean(0)) / np.where(sd > 0, sd, 1.0)
    graph = core.knn_graph(z, n_neighbors=min(wt.n_neighbors, b - 1), sigma=wt.sigma)
    edges = core.EdgeList.from_adjacency(graph, device=ell.device, dtype=torch.float64)
    ell64 = ell.to(torch.float64)
    ell64 = ell64 / ell64.mean().clamp_min(1e-12)
    q = core.gradient_flow(ell64, edges, alpha=wt.alpha, beta=wt.beta, n_steps=wt.n_inner,
                           step_scale=wt.step_scale)
    return (q / q.sum()).to(losses.dtype)


def _timed(fn) -> tuple[float, float]:
    c0, w0 = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - c0, time.perf_counter() - w0


def _bench_batch(a: argparse.Namespace, wt: GCDROWeighter, b: int, g: torch.Generator) -> None:
    x = torch.randn(b, a.dim, generator=g).to(a.device)
    y = torch.randn(b, generator=g).to(a.device)
    net = torch.nn.Sequential(torch.nn.Linear(a.dim, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                              torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(a.device)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    losses = ((net(x).squeeze(-1) - y) ** 2).detach()

    def sgd_step() -> None:
        opt.zero_grad()
        ((net(x).squeeze(-1) - y) ** 2).mean().backward()
        opt.step()

    q_new, q_old = wt.update(losses, x), sklearn_update(wt, losses, x)
    torch.testing.assert_close(q_new, q_old)  # same weights from both graphs
    zs = ((x - x.mean(0)) / x.std(0, unbiased=False)).double()
    zn = zs.cpu().numpy()
    arms = {"sklearn graph": lambda: sklearn_update(wt, losses, x),
            "torch graph": lambda: wt.update(losses, x), "one SGD step": sgd_step,
            "graph only, sklearn": lambda: core.EdgeList.from_adjacency(
                core.knn_graph(zn, n_neighbors=a.k), device=zs.device),
            "graph only, torch": lambda: core.knn_edges(zs, n_neighbors=a.k)}
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in arms}
    for fn in arms.values():
        fn()  # warm-up
    for _ in range(a.repeats):
        for name, fn in arms.items():
            times[name].append(_timed(fn))
    med = {k: (statistics.median(c for c, _ in t) * 1e3, statistics.median(w for _, w in t) * 1e3)
           for k, t in times.items()}
    step = med["one SGD step"]
    row = "  ".join(f"{k}: {c:.2f} / {w:.2f} ms ({c / step[0]:.1f}x SGD CPU)" for k, (c, w) in med.items())
    print(f"B = {b:5d}  {row}  speed-up (CPU) update {med['sklearn graph'][0] / med['torch graph'][0]:.2f}x, "
          f"graph {med['graph only, sklearn'][0] / med['graph only, torch'][0]:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--n-inner", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    wt = GCDROWeighter(n_neighbors=a.k, n_inner=a.n_inner)
    print(f"torch {torch.__version__}, {a.threads} thread(s), device {a.device}, D = {a.dim}, k = {a.k}, "
          f"n_inner = {a.n_inner}; median of {a.repeats} (CPU ms / wall ms)")
    for b in a.batches:
        _bench_batch(a, wt, b, g)


if __name__ == "__main__":
    main()
