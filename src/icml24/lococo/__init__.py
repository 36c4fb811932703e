"""LoCoCo: fixed-size KV cache by convolutional fusion (Cai, Tian, Wang, Chen; ICML 2024; arXiv 2406.05317)."""

from icml24.lococo.cache import (
    LoCoCoCache,
    lococo_attention,
    make_compressors,
    register_lococo_attention,
    use_lococo_attention,
)
from icml24.lococo.compressor import LoCoCoCompressor, h2o_keep, streaming_keep, tova_keep
from icml24.lococo.data import passkey_batch, sample_windows, stdlib_documents
from icml24.lococo.model import chunked_nll, pretrain, tiny_llama, train_compressors

__all__ = ["LoCoCoCache", "LoCoCoCompressor", "chunked_nll", "h2o_keep", "lococo_attention", "make_compressors",
           "passkey_batch", "pretrain", "register_lococo_attention", "sample_windows", "stdlib_documents",
           "streaming_keep", "tiny_llama", "tova_keep", "train_compressors", "use_lococo_attention"]
