"""``kvsim calibrate``: time one real torch decoder layer with a paged KV pool and fit a cost profile.

torch is an optional extra (``pip install 'kvsim[calibrate]'``). Nothing in this package imports it at
import time: :mod:`calibrate.kernels` and :mod:`calibrate.runner` load it when a calibration runs, so the
simulator, the fitting code (:mod:`calibrate.fit`) and the analytic profiles work without it.
"""

TORCH_HINT = "torch is needed for calibration: pip install 'kvsim[calibrate]' (torch==2.13.0)"


class CalibrationError(ValueError):
    """A calibration that cannot run as asked (no CUDA device, not enough memory...): raised before any
    timing starts."""
