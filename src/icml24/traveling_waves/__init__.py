"""Traveling Wave Memory: hidden traveling waves bind working-memory variables in RNNs (Karuvally, Sejnowski,
Siegelmann, ICML 2024, arXiv 2402.10163)."""

from icml24.traveling_waves.analysis import (
    decode_lags,
    eigenvalues,
    expected_unit_count,
    gradient_norms,
    linear_r2,
    near_unit_count,
    spectral_error,
    theory_spectrum,
)
from icml24.traveling_waves.rnn import (
    ElmanRNN,
    LSTMNet,
    TrainResult,
    evaluate_accuracy,
    orthogonal_rnn,
    train_rnn,
    wave_init_rnn,
)
from icml24.traveling_waves.tasks import TASKS, Curriculum, hds_targets, make_batch, task_matrix
from icml24.traveling_waves.twm import (
    AttentionBoundary,
    LinearBoundary,
    LinearWaveRNN,
    TravelingWaveMemory,
    hds_recursion,
    linear_wave_rnn,
    shift_operator,
)

__all__ = ["AttentionBoundary", "Curriculum", "ElmanRNN", "LSTMNet", "LinearBoundary", "LinearWaveRNN", "TASKS",
           "TrainResult", "TravelingWaveMemory", "decode_lags", "eigenvalues", "evaluate_accuracy",
           "expected_unit_count", "gradient_norms", "hds_recursion", "hds_targets", "linear_r2", "linear_wave_rnn",
           "make_batch", "near_unit_count", "orthogonal_rnn", "shift_operator", "spectral_error", "task_matrix",
           "theory_spectrum", "train_rnn", "wave_init_rnn"]
