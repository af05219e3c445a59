"""Why a divergence happened: the notes a :class:`~tb_parity_plugin.engine.verdicts.Divergence`
carries, each read from what both runs recorded (``context`` says what they read).

``Comparison`` inherits them all through :class:`Notes`; each family lives in its own module.
"""

from __future__ import annotations

from tb_parity_plugin.engine.notes.inputs import InputNotes
from tb_parity_plugin.engine.notes.marginal import MarginalNotes
from tb_parity_plugin.engine.notes.schedules import ScheduleNotes
from tb_parity_plugin.engine.notes.state import StateNotes
from tb_parity_plugin.engine.notes.updates import UpdateNotes

__all__ = ["Notes"]


class Notes(StateNotes, InputNotes, UpdateNotes, ScheduleNotes, MarginalNotes):
    """Every note family, for ``Comparison`` to inherit."""
