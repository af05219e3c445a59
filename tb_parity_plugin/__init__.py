"""tb-parity: compare a TF1 run with its TF2 port, step by step and tensor by tensor.

The public API is re-exported lazily so that ``import tb_parity_plugin`` (which
TensorBoard does at start-up through the entry point) imports neither TensorFlow
nor the engine.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# name -> module that defines it
_EXPORTS = {
    "compare": "tb_parity_plugin.api",
    "assert_parity": "tb_parity_plugin.api",
    "ParityReport": "tb_parity_plugin.engine",
    "TolerancePolicy": "tb_parity_plugin.engine.tolerance",
    "ToleranceOverride": "tb_parity_plugin.engine.tolerance",
    "LogdirReader": "tb_parity_plugin.logdir.reader",
}
# Submodules users reach as attributes (``tb_parity_plugin.notebook.show(...)``), imported on first use.
_SUBMODULES = {
    "v1": "tb_parity_plugin.summary_v1",
    "v2": "tb_parity_plugin.summary_v2",
    "notebook": "tb_parity_plugin.report.notebook",
}

__all__ = sorted([*_EXPORTS, *_SUBMODULES])


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(_SUBMODULES[name])
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'tb_parity_plugin' has no attribute {name!r}")


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext tb_parity_plugin``: registers ``%tb_parity`` (notebook code imported only then)."""
    from tb_parity_plugin.report import notebook

    notebook.load_ipython_extension(ipython)
