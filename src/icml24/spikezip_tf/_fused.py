"""Fused ST-BIF kernel for CPU tensors: the whole multi-step neuron update in one pass over memory.

The pure-PyTorch neuron (:class:`~icml24.spikezip_tf.snn.STBIFNeuron`) spends ~13 full-tensor operations per time
step (divide, add, floor, clamps, differences, spike counts). This module compiles a ~40-line C kernel that does
the same per element in registers, one vectorised loop over the elements for each step, and loads it with
``ctypes``. It is used only where it gives the *same bits* as the PyTorch path:

- the arithmetic is the PyTorch path's, operation for operation, in the tensor's own precision (float32 or
  float64): ``w = v + x / s``, ``f = clamp(floor(w), lo, 1)``, ``S' = clamp(S + f, n_min, p_max)``,
  ``o = S' - S``, ``v = w - o``, output ``o * s``; IEEE division, floor, additions and comparisons are exact
  operations, so the results equal PyTorch's bit for bit (``-ffp-contract=off`` forbids fused multiply-adds,
  and no ``-ffast-math``; ``-fno-trapping-math`` only lets ``floor`` vectorise);
- spike counts per step and sample are integers (exact).

It is compiled on first use with the system C compiler (``$CC`` or ``cc``) into a per-user cache directory
(``$ICML24_KERNEL_CACHE`` or ``~/.cache/icml24``), keyed by a hash of the source, the flags and the CPU, and
reused afterwards (~0.5 s once). Without a compiler, on another device than the CPU, for other dtypes, with
``ICML24_SPIKEZIP_KERNEL=0`` in the environment or ``ENABLED = False``, :func:`available` is False and the neuron
runs its PyTorch loop, with identical results (tested).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

_SOURCE = r"""
#include <math.h>
#include <stdint.h>
#define BLK 512
/* one time step of a block of m elements (state vv, aa in registers / L1); returns the spike count */
#define DEFINE(SUF, REAL, FLOOR)                                                                         \
static inline int64_t step_##SUF(const REAL* restrict xt, REAL* restrict vv, REAL* restrict aa,          \
                                 REAL* restrict ot, int64_t m, REAL s, REAL lo, REAL nmin, REAL pmax) {  \
  int64_t c = 0;                                                                                         \
  for (int64_t j = 0; j < m; ++j) {                                                                      \
    REAL w = vv[j] + xt[j] / s;                                                                          \
    REAL f = FLOOR(w);                                                                                   \
    f = f < lo ? lo : f;                                                                                 \
    f = f > (REAL)1 ? (REAL)1 : f;                                                                       \
    REAL a = aa[j];                                                                                      \
    REAL n = a + f;                                                                                      \
    n = n < nmin ? nmin : n;                                                                             \
    n = n > pmax ? pmax : n;                                                                             \
    REAL o = n - a;                                                                                      \
    vv[j] = w - o;                                                                                       \
    aa[j] = n;                                                                                           \
    ot[j] = o * s;                                                                                       \
    c += (o != (REAL)0);                                                                                 \
  }                                                                                                      \
  return c;                                                                                              \
}                                                                                                        \
/* element (t, b, r, j) of x at x[t sT + b sB + r sR + j] (j < rl: rows of rl contiguous elements); out
   (T, nb, nrow, rl), v, acc (nb, nrow, rl) contiguous; counts (T, nb): spikes per step and sample; returns the
   number of neurons that would still spike without further input */                                    \
int64_t stbif_##SUF(const REAL* x, REAL s, REAL* v, REAL* acc, int64_t T, int64_t nb, int64_t nrow,        \
                    int64_t rl, int64_t sT, int64_t sB, int64_t sR, REAL lo, REAL nmin, REAL pmax,        \
                    REAL* out, double* counts) {                                                         \
  int64_t E = nb * nrow * rl;                                                                            \
  REAL vv[BLK], aa[BLK];                                                                                 \
  int64_t live = 0;                                                                                      \
  for (int64_t i = 0; i < T * nb; ++i) counts[i] = 0.0;                                                  \
  for (int64_t b = 0; b < nb; ++b) {                                                                     \
    for (int64_t r = 0; r < nrow; ++r) {                                                                 \
      for (int64_t j0 = 0; j0 < rl; j0 += BLK) {                                                         \
        int64_t e0 = (b * nrow + r) * rl + j0, m = rl - j0 < BLK ? rl - j0 : BLK;                        \
        const REAL* xb = x + b * sB + r * sR + j0;                                                       \
        for (int64_t j = 0; j < m; ++j) { vv[j] = v[e0 + j]; aa[j] = acc[e0 + j]; }                      \
        for (int64_t t = 0; t < T; ++t)                                                                  \
          counts[t * nb + b] += (double)step_##SUF(xb + t * sT, vv, aa, out + t * E + e0, m, s, lo,      \
                                                   nmin, pmax);                                          \
        for (int64_t j = 0; j < m; ++j) {                                                                \
          v[e0 + j] = vv[j]; acc[e0 + j] = aa[j];                                                        \
          live += (vv[j] >= (REAL)1 && aa[j] < pmax) || (lo < (REAL)0 && vv[j] < (REAL)0 && aa[j] > nmin); \
        }                                                                                                \
      }                                                                                                  \
    }                                                                                                    \
  }                                                                                                      \
  return live;                                                                                           \
}
DEFINE(f64, double, floor)
DEFINE(f32, float, floorf)
"""

_FLAGS = ["-O3", "-fPIC", "-shared", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math", "-march=native"]
#: use the kernel where it applies (initially ``False`` if ``ICML24_SPIKEZIP_KERNEL=0``); set ``False`` to force the
#: PyTorch loop, e.g. to time or test it against the kernel
ENABLED = os.environ.get("ICML24_SPIKEZIP_KERNEL", "1") != "0"
_LOCK = threading.Lock()
_LIB: ctypes.CDLL | None = None
_TRIED = False
#: why the kernel is unavailable (``None`` while it is, or before the first try)
reason: str | None = None


def _cpu_tag() -> str:
    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        pass
    return f"{platform.machine()}|{platform.processor()}|{flags}"


def _build() -> ctypes.CDLL:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise RuntimeError("no C compiler (cc, gcc, clang) on PATH")
    key = hashlib.sha256("\n".join([_SOURCE, " ".join(_FLAGS), cc, _cpu_tag()]).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("ICML24_KERNEL_CACHE") or Path.home() / ".cache" / "icml24")
    lib = cache / f"spikezip_stbif_{key}.so"
    if not lib.exists():
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            src = Path(tmp) / "stbif.c"
            src.write_text(_SOURCE)
            out = Path(tmp) / "stbif.so"
            for flags in (_FLAGS, [f for f in _FLAGS if f != "-march=native"]):  # (some compilers lack it)
                res = subprocess.run([cc, *flags, "-o", str(out), str(src), "-lm"], capture_output=True, text=True,
                                     timeout=120)
                if res.returncode == 0:
                    break
            else:
                raise RuntimeError(f"{cc} failed: {res.stderr.strip()[:500]}")
            os.replace(out, lib)  # atomic: concurrent builders never load a half-written file
    dll = ctypes.CDLL(str(lib))
    p, i = ctypes.c_void_p, ctypes.c_int64
    for name, real in (("stbif_f64", ctypes.c_double), ("stbif_f32", ctypes.c_float)):
        fn = getattr(dll, name)
        fn.restype = ctypes.c_int64
        fn.argtypes = [p, real, p, p, i, i, i, i, i, i, i, real, real, real, p, p]
    return dll


def _lib() -> ctypes.CDLL | None:
    global _LIB, _TRIED, reason
    if _TRIED:
        return _LIB
    with _LOCK:
        if not _TRIED:
            try:
                _LIB = _build()
            except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                reason = f"fused ST-BIF kernel unavailable ({e}); using the PyTorch loop"
            _TRIED = True
    return _LIB


def available(x: torch.Tensor) -> bool:
    """Whether :func:`stbif` can run on ``x`` (a CPU float32/float64 tensor, kernel enabled and compiled)."""
    return ENABLED and x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and _lib() is not None


def _rows(x: torch.Tensor) -> tuple[int, int, int] | None:
    """``x`` ``(T, B, *S)`` as ``(T, B, R, L)`` rows of ``L`` contiguous elements: ``(R, L, row stride)``, or None."""
    size, stride = x.shape[2:], x.stride()[2:]
    d, run = len(size) - 1, 1
    while d >= 0 and (size[d] == 1 or stride[d] == run):
        run *= size[d]
        d -= 1
    if d < 0:
        return 1, run, run
    rows = [k for k in range(d + 1) if size[k] != 1]
    if len(rows) != 1:
        return None
    return size[rows[0]], run, stride[rows[0]]


def stbif(x: torch.Tensor, threshold: float, v: torch.Tensor, acc: torch.Tensor, *, lo: float, neg_min: int,
          pos_max: int) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """T steps of ST-BIF neurons in place of the PyTorch loop (same bits).

    Args:
        x: input ``(T, B, ...)`` (raw, not divided by the threshold); any layout whose per-sample dims are rows of
            contiguous elements with one row stride (e.g. a head slice of a fused ``qkv`` output) is read in
            place, others are copied first.
        threshold: ``s`` as a Python float of the tensor's precision.
        v, acc: contiguous membrane and spike tracer ``(B, ...)``, updated in place.
        lo: -1 (negative spikes allowed) or 0.
        neg_min, pos_max: spike-tracer range.

    Returns:
        ``(out, counts, live)``: contiguous outputs ``o_t * s`` ``(T, B, ...)``, spikes per step and sample ``(T, B)``
        float64, and whether any neuron would still spike without further input (``False``: settled).
    """
    lib = _lib()
    assert lib is not None and v.is_contiguous() and acc.is_contiguous()
    steps, nb = x.shape[0], x.shape[1]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    counts = torch.empty(steps, nb, dtype=torch.float64)
    if x.numel() == 0:
        return out, counts.zero_(), False
    layout = _rows(x)
    if layout is None:
        x = x.contiguous()
        layout = _rows(x)
    nrow, rl, s_row = layout
    fn = lib.stbif_f64 if x.dtype == torch.float64 else lib.stbif_f32
    live = fn(x.data_ptr(), threshold, v.data_ptr(), acc.data_ptr(), steps, nb, nrow, rl, x.stride(0), x.stride(1),
              s_row, lo, float(neg_min), float(pos_max), out.data_ptr(), counts.data_ptr())
    return out, counts, bool(live)


#: freed heap memory (bytes) that glibc keeps mapped once :func:`keep_heap` ran (``mallopt(M_TOP_PAD)``); from
#: ``$ICML24_SPIKEZIP_HEAP_PAD`` (``0``: leave the allocator alone)
HEAP_PAD = int(os.environ.get("ICML24_SPIKEZIP_HEAP_PAD", str(64 << 20)))
_M_TOP_PAD = -2  # glibc <malloc.h>
_HEAP_DONE = False
#: whether :func:`keep_heap` changed the allocator's setting
heap_padded = False


def keep_heap() -> bool:
    """Let glibc keep up to :data:`HEAP_PAD` bytes of freed heap memory instead of returning it to the kernel.

    A simulation allocates and frees tens of MB per chunk (each layer's multi-step outputs); with glibc's default
    trimming, the freed top of the heap goes back to the kernel and every new chunk faults its pages in again
    (~10^4 page faults per simulation of the benchmark's batch, ~20% of its CPU time, all of it system time).
    ``mallopt(M_TOP_PAD, HEAP_PAD)`` keeps that memory mapped. It is process-wide and permanent (it also fixes
    glibc's dynamic mmap threshold at its current value); it changes no result. Done once, on glibc only;
    ``ICML24_SPIKEZIP_HEAP_PAD=0`` turns it off. Returns whether the setting is in place.
    """
    global _HEAP_DONE, heap_padded
    if _HEAP_DONE:
        return heap_padded
    _HEAP_DONE = True
    if HEAP_PAD <= 0 or platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        heap_padded = bool(ctypes.CDLL(None).mallopt(_M_TOP_PAD, ctypes.c_int(min(HEAP_PAD, 2**31 - 1))))
    except (OSError, AttributeError):  # pragma: no cover - no mallopt in this C library
        heap_padded = False
    return heap_padded
