"""Which two runs to compare: the one rule set behind the CLI, the API and the dashboard.

A run's ``side`` comes from its ``run_info`` record (``"tf1"`` / ``"tf2"``, or ``""``
when unknown). The rules, everywhere:

* Named runs must exist, and baseline and candidate must be different runs.
* One name given: the other is the only other run in scope.
* No names: with exactly one TF1 run and one other run, the TF1 run is the baseline;
  with exactly two runs and one of them TF2, the TF2 run is the candidate. Anything
  else is ambiguous, and the error lists the runs.

The dashboard applies the same rules to each folder of sibling runs to suggest pairs.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Optional

#: The same choice in Python's words: the message reaches ``compare()`` and ``assert_parity`` too
#: (a new user was told the CLI's flags there).
_IN_PYTHON = " (baseline= and candidate= in Python)"


class RunPairError(ValueError):
    """The runs cannot be chosen as given: missing, the same, or ambiguous.

    ``missing`` names a run that does not exist (the dashboard answers 404 for it, 400 otherwise).
    """

    def __init__(self, message: str, missing: Optional[str] = None) -> None:
        super().__init__(message)
        self.missing = missing


def choose_pair(
    sides: Mapping[str, str], baseline: Optional[str] = None, candidate: Optional[str] = None, where: str = "logdir"
) -> tuple[str, str]:
    """``(baseline, candidate)`` among ``sides`` (run name -> side), by the module's rules."""
    names = sorted(sides)
    listing = ", ".join(names) or "none"
    for name in (baseline, candidate):
        if name is not None and name not in sides:
            raise RunPairError(f"no run {name!r} in {where} (runs: {listing})", missing=name)
    if baseline is not None and candidate is not None:
        if baseline == candidate:
            raise RunPairError(f"baseline and candidate are the same run {baseline!r}")
        return baseline, candidate
    if baseline is not None or candidate is not None:
        given = baseline if baseline is not None else candidate
        assert given is not None
        others = [n for n in names if n != given]
        if len(others) != 1:
            raise RunPairError(
                f"{where} holds {len(names)} runs ({listing}); pass both --baseline and --candidate{_IN_PYTHON}"
            )
        return (given, others[0]) if baseline is not None else (others[0], given)
    if len(names) != 2:
        raise RunPairError(
            f"{where} holds {len(names)} runs ({listing}); pass --baseline RUN and --candidate RUN{_IN_PYTHON}"
        )
    tf1 = [n for n in names if sides[n] == "tf1"]
    tf2 = [n for n in names if sides[n] == "tf2"]
    if len(tf1) == 1:
        return tf1[0], next(n for n in names if n != tf1[0])
    if len(tf2) == 1:
        return next(n for n in names if n != tf2[0]), tf2[0]
    raise RunPairError(f"cannot tell which of {listing} is the TF1 run; pass --baseline RUN{_IN_PYTHON}")


def suggest_pairs(sides: Mapping[str, str]) -> list[dict[str, str]]:
    """One ``{folder, baseline, candidate}`` per folder whose sibling runs :func:`choose_pair` accepts."""
    by_folder: dict[str, dict[str, str]] = {}
    for name, side in sides.items():
        by_folder.setdefault(posixpath.dirname(name), {})[name] = side
    pairs = []
    for folder in sorted(by_folder):
        try:
            base, cand = choose_pair(by_folder[folder], where=folder or "logdir")
        except RunPairError:
            continue
        pairs.append({"folder": folder, "baseline": base, "candidate": cand})
    return pairs
