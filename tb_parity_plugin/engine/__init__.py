"""The one comparison engine behind every verdict (numpy only, no TensorFlow).

Front ends (CLI, API, dashboard, report) receive the value classes of
:mod:`~tb_parity_plugin.engine.verdicts`; they never judge on their own.
"""

from tb_parity_plugin.engine.comparison import Comparison, compare_runs
from tb_parity_plugin.engine.matrix import ParityMatrix
from tb_parity_plugin.engine.tolerance import ToleranceOverride, TolerancePolicy
from tb_parity_plugin.engine.verdicts import Divergence, ParityReport, TensorDetail

__all__ = [
    "Comparison",
    "Divergence",
    "ParityMatrix",
    "ParityReport",
    "TensorDetail",
    "ToleranceOverride",
    "TolerancePolicy",
    "compare_runs",
]
