"""IFFN / AGeLU: amplifying the non-linearity of the ViT feed-forward module (Xu et al., ICML 2024)."""

from icml24.iffn.iffn import IFFN, AGeLU, count_flops, ffn_flops_per_token, ffn_num_params, replace_ffn

__all__ = ["AGeLU", "IFFN", "count_flops", "ffn_flops_per_token", "ffn_num_params", "replace_ffn"]
