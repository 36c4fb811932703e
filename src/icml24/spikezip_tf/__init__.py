"""SpikeZIP-TF (ICML 2024, arXiv:2406.03470): exact QANN -> spiking-transformer conversion.

Pipeline: a ReLU transformer -> :func:`quantize` (LSQ quantizers; train it: QAT) -> :func:`convert` (ST-BIF
neurons + spike-equivalent operators) -> :func:`simulate` until quiescence; ``sum_t out_t == QANN(x)``.
"""

from icml24.spikezip_tf.qann import (
    NONLINEAR_ACTIVATIONS,
    QAttention,
    QSelfAttention,
    Quantizer,
    additive_mask,
    calibrate,
    check_activations,
    check_mask,
    check_supported,
    hf_head,
    is_hf_encoder,
    is_hf_vit,
    quantize,
    quantizers,
)
from icml24.spikezip_tf.ratecode import RateCodedModel, RateIFNeuron, rate_convert, rate_simulate
from icml24.spikezip_tf.snn import (
    AnnHead,
    SimulationResult,
    SpikeConv2d,
    SpikeLinear,
    SpikeMatmul,
    SpikingAttention,
    SpikingLayerNorm,
    SpikingModel,
    SpikingSelfAttention,
    SpikingSoftmax,
    STBIFNeuron,
    convert,
    count_macs,
    register_runner,
    simulate,
)
from icml24.spikezip_tf.text import MaskedAttention, TextBlock, TinyTextEncoder

__all__ = [
    "NONLINEAR_ACTIVATIONS", "QAttention", "QSelfAttention", "Quantizer", "is_hf_encoder", "is_hf_vit", "hf_head", "additive_mask", "calibrate", "check_activations", "check_mask", "check_supported",
    "quantize", "quantizers",
    "AnnHead", "SimulationResult", "SpikeConv2d", "SpikeLinear", "SpikeMatmul", "SpikingAttention", "SpikingLayerNorm",
    "SpikingModel", "SpikingSelfAttention", "SpikingSoftmax", "STBIFNeuron", "convert", "count_macs", "register_runner", "simulate",
    "MaskedAttention", "TextBlock", "TinyTextEncoder",
    "RateCodedModel", "RateIFNeuron", "rate_convert", "rate_simulate",
]
