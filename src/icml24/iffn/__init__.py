"""IFFN / AGeLU: amplifying the non-linearity of the ViT feed-forward module (Xu et al., ICML 2024)."""

from icml24.iffn.iffn import (
    IFFN,
    AGeLU,
    agelu_parameter_names,
    agelu_shift_spread,
    agelu_shifts,
    count_flops,
    ffn_flops_per_token,
    ffn_num_params,
    replace_ffn,
)

__all__ = ["AGeLU", "IFFN", "agelu_parameter_names", "agelu_shift_spread", "agelu_shifts", "count_flops",
           "ffn_flops_per_token", "ffn_num_params", "replace_ffn"]
