"""SimPro (ICML 2024, arXiv 2402.13505): long-tailed semi-supervised learning with an unknown unlabeled prior.

Public API: :class:`SimProLoss` (pseudo-labels, loss, closed-form prior M-step) for any PyTorch training loop,
the shared trainer :func:`train_ssl` with the baselines' criteria (:func:`make_criterion`), the ACR baseline
(:class:`ACRLoss`, :func:`dual_head`; Wei & Gan, CVPR 2023), and the long-tailed
data helpers (:func:`make_imb_data`, :func:`unlabeled_counts`, the five ``DISTRIBUTIONS``).
"""

from icml24.simpro.acr import ACRLoss, DualHeadNet, dual_head
from icml24.simpro.core import SimProLoss, bayes_posterior, em_prior, kl_divergence, masked_soft_cross_entropy
from icml24.simpro.data import (
    DISTRIBUTIONS,
    GaussianMixtureTier,
    gaussian_augment,
    make_imb_data,
    mnist1d_augment,
    split_labeled_unlabeled,
    unlabeled_counts,
)
from icml24.simpro.trainer import METHODS, class_recall, evaluate, make_criterion, train_ssl

__all__ = ["ACRLoss", "DualHeadNet", "dual_head", "SimProLoss", "bayes_posterior",
           "em_prior", "kl_divergence", "masked_soft_cross_entropy",
           "DISTRIBUTIONS", "GaussianMixtureTier", "gaussian_augment", "make_imb_data", "mnist1d_augment",
           "split_labeled_unlabeled", "unlabeled_counts", "METHODS", "class_recall", "evaluate", "make_criterion",
           "train_ssl"]
