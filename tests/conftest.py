"""The whole suite computes on one thread, whatever ``OMP_NUM_THREADS`` says.

A training run's numbers depend on the reduction order of BLAS/oneDNN kernels, which changes with the thread count;
over thousands of steps that is a different trajectory. Pinning torch and the BLAS pools (and what subprocesses
inherit) to one thread makes every test compute the same numbers under ``OMP_NUM_THREADS=1``, ``=2`` or unset.
Tests that assert a trained number still carry a tolerance measured over seeds (see ``tests/test_data.py``), since
another CPU's kernels change the order too. ``ICML24_TEST_THREADS=k`` runs the suite on k threads instead: a probe
for assertions that hold on one reduction order only.
"""

from __future__ import annotations

import os

import torch
from threadpoolctl import threadpool_limits

THREADS = int(os.environ.get("ICML24_TEST_THREADS", "1"))
_limits = None


def pytest_configure(config):
    global _limits
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(THREADS)  # subprocesses (CLI runs, torchrun workers) start with the same count
    torch.set_num_threads(THREADS)
    _limits = threadpool_limits(THREADS)


def pytest_unconfigure(config):
    if _limits is not None:
        _limits.restore_original_limits()
