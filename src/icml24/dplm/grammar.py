"""A synthetic "protein" grammar with exact likelihoods and per-residue secondary-structure posteriors (notes §5.3).

An explicit-duration HMM over secondary-structure segments, written as an ordinary HMM on (segment type, position
in segment) states with hazard transitions, so that the forward–backward recursions give the exact
log-likelihood log p(x) and the posteriors p(type_i | x):

* helix H: length 4 + Poisson(8), amphipathic: hydrophobic {L,A,I,M,F,V} at heptad positions a, d, e
  (phase mod 7 in {0, 3, 4}), polar {E,K,Q,R,A} elsewhere;
* strand E: length 3 + Poisson(3), alternating hydrophobic {V,I,Y,F,W,T} / polar {T,S,R,K,E};
* coil C: length 2 + Poisson(4), {G,P,N,D,S};
* a rare motif segment M: a fixed 6-mer (``MOTIF``), the handle for motif-scaffolding tests.

After H, E or M always C; after C: H (0.55) or E (0.45), less the motif probability. Every emission is
(1 − ε) uniform on the preferred set + ε uniform on all 20 residues.

NOTE(deviation): the notes start and end every sequence in coil; here a sequence is a window of fixed length L
that starts at phase 0 of a segment drawn from ``start_probs`` and has no end constraint, so that log p(x) is a
plain forward sum.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import poisson

from icml24.common import validate as v
from icml24.dplm.tokens import AMINO_ACIDS

TYPES = ("C", "H", "E", "M")
SS_CLASSES = ("H", "E", "C")  # 3-state labels; the motif counts as coil (a loop)
MOTIF = "GCGWHG"
_AA = {a: i for i, a in enumerate(AMINO_ACIDS)}


def _duration_pmf(offset: int, rate: float, d_max: int) -> np.ndarray:
    """p(D = d) for d = 1..d_max of D = offset + Poisson(rate), truncated at d_max and renormalised."""
    d = np.arange(1, d_max + 1)
    p = np.where(d >= offset, poisson.pmf(d - offset, rate), 0.0)
    return p / p.sum()


def _set_emission(chars: str, eps: float) -> np.ndarray:
    e = np.full(20, eps / 20)
    for c in chars:
        e[_AA[c]] += (1.0 - eps) / len(chars)
    return e


@dataclass(frozen=True)
class ProteinGrammar:
    """The grammar's parameters; ``sample``, ``log_likelihood`` and ``posteriors`` are exact under them.

    Args:
        motif_prob: probability that a coil segment is followed by the motif instead of a helix/strand.
        eps: uniform-mixture weight of every emission (ε).
        start_probs: probabilities of the first segment's type (C, H, E).
    """

    motif_prob: float = 0.04
    eps: float = 0.1
    start_probs: tuple[float, float, float] = (0.5, 0.3, 0.2)

    def __post_init__(self) -> None:
        v.probability("ProteinGrammar", "motif_prob", self.motif_prob)
        v.probability("ProteinGrammar", "eps", self.eps, open_low=True)
        if len(self.start_probs) != 3 or abs(sum(self.start_probs) - 1) > 1e-9 or min(self.start_probs) < 0:
            raise ValueError(f"ProteinGrammar: start_probs must be 3 probabilities summing to 1, "
                             f"got {self.start_probs!r}")
        object.__setattr__(self, "_tables", self._build())

    # ---------------------------------------------------------------------------------------------- tables
    def _build(self) -> dict[str, np.ndarray]:
        durations = {"C": _duration_pmf(2, 4.0, 14), "H": _duration_pmf(4, 8.0, 28),
                     "E": _duration_pmf(3, 3.0, 14), "M": np.eye(6)[5]}
        states = [(k, i) for k in TYPES for i in range(len(durations[k]))]
        index = {s: j for j, s in enumerate(states)}
        S = len(states)
        pm = self.motif_prob
        next_type = {"C": {"H": 0.55 * (1 - pm), "E": 0.45 * (1 - pm), "M": pm}, "H": {"C": 1.0},
                     "E": {"C": 1.0}, "M": {"C": 1.0}}
        A = np.zeros((S, S))
        B = np.zeros((S, 20))
        for (k, i), j in index.items():
            p = durations[k]
            survive = p[i:].sum()
            hazard = p[i] / survive if survive > 0 else 1.0
            if i + 1 < len(p):
                A[j, index[(k, i + 1)]] = 1.0 - hazard
            for k2, q in next_type[k].items():
                A[j, index[(k2, 0)]] += hazard * q
            if k == "H":
                B[j] = _set_emission("LAIMFV" if i % 7 in (0, 3, 4) else "EKQRA", self.eps)
            elif k == "E":
                B[j] = _set_emission("VIYFWT" if i % 2 == 0 else "TSRKE", self.eps)
            elif k == "C":
                B[j] = _set_emission("GPNDS", self.eps)
            else:
                B[j] = _set_emission(MOTIF[i], self.eps / 2)
        pi = np.zeros(S)
        for k, q in zip(("C", "H", "E"), self.start_probs, strict=False):
            pi[index[(k, 0)]] = q
        state_type = np.array([TYPES.index(k) for k, _ in states])
        ss_of_type = np.array([SS_CLASSES.index("C"), SS_CLASSES.index("H"), SS_CLASSES.index("E"),
                               SS_CLASSES.index("C")])
        return {"A": A, "B": B, "pi": pi, "state_type": state_type, "state_ss": ss_of_type[state_type]}

    @property
    def n_states(self) -> int:
        return len(self._tables["pi"])

    # ---------------------------------------------------------------------------------------------- sampling
    def sample(self, n: int, length: int, *, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Draw n sequences of the given length: residue ids (n, L) in ``AMINO_ACIDS`` order and states (n, L)."""
        v.integer("ProteinGrammar", "n", n, minimum=1)
        v.integer("ProteinGrammar", "length", length, minimum=1)
        t = self._tables
        a_cum, b_cum = np.cumsum(t["A"], 1), np.cumsum(t["B"], 1)
        states = np.empty((n, length), dtype=np.int64)
        s = (rng.random(n)[:, None] > np.cumsum(t["pi"])[None]).sum(1)
        for i in range(length):
            states[:, i] = s
            if i + 1 < length:
                s = np.minimum((rng.random(n)[:, None] > a_cum[s]).sum(1), self.n_states - 1)
        x = np.minimum((rng.random((n, length))[..., None] > b_cum[states]).sum(-1), 19)
        return x.astype(np.int64), states

    def ss_labels(self, states: np.ndarray) -> np.ndarray:
        """3-state labels (indices into ``SS_CLASSES``) of a state path."""
        return self._tables["state_ss"][states]

    # ---------------------------------------------------------------------------------------------- inference
    def _forward(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t = self._tables
        n, L = x.shape
        alpha = np.empty((n, L, self.n_states))
        log_c = np.empty((n, L))
        a = t["pi"][None] * t["B"][:, x[:, 0]].T
        for i in range(L):
            if i:
                a = (alpha[:, i - 1] @ t["A"]) * t["B"][:, x[:, i]].T
            c = a.sum(1)
            alpha[:, i] = a / c[:, None]
            log_c[:, i] = np.log(c)
        return alpha, log_c

    def _check(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] < 1:
            raise ValueError(f"ProteinGrammar: residue ids must have shape (n, L) with L >= 1, got {x.shape}")
        if x.size and (x.min() < 0 or x.max() > 19):
            raise ValueError("ProteinGrammar: residue ids must lie in 0..19 (AMINO_ACIDS order); decode tokens "
                             "with tokens_to_residue_ids and drop rows holding non-residue tokens")
        return x.astype(np.int64)

    def log_likelihood(self, x: np.ndarray) -> np.ndarray:
        """Exact log p(x) (nats) of each row of residue ids (n, L)."""
        _, log_c = self._forward(self._check(x))
        return log_c.sum(1)

    def posteriors(self, x: np.ndarray) -> np.ndarray:
        """p(state_i = s | x), shape (n, L, S), by forward–backward."""
        x = self._check(x)
        t = self._tables
        alpha, log_c = self._forward(x)
        n, L = x.shape
        beta = np.ones((n, self.n_states))
        post = np.empty_like(alpha)
        post[:, L - 1] = alpha[:, L - 1]
        for i in range(L - 2, -1, -1):
            beta = ((t["B"][:, x[:, i + 1]].T * beta) @ t["A"].T) / np.exp(log_c[:, i + 1])[:, None]
            post[:, i] = alpha[:, i] * beta
        return post / post.sum(-1, keepdims=True)

    def ss_posterior(self, x: np.ndarray) -> np.ndarray:
        """p(SS_i = c | x) for the 3 classes of ``SS_CLASSES``, shape (n, L, 3)."""
        post = self.posteriors(x)
        onehot = np.eye(3)[self._tables["state_ss"]]
        return post @ onehot

    def motif_posterior(self, x: np.ndarray) -> np.ndarray:
        """p(position i is inside a motif segment | x), shape (n, L)."""
        post = self.posteriors(x)
        return post[..., self._tables["state_type"] == TYPES.index("M")].sum(-1)
