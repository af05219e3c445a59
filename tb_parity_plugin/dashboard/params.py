"""Parses the dashboard routes' query parameters into typed values.

Route handlers stay one line of parsing plus one call: every malformed or unknown
parameter becomes ``errors.InvalidArgumentError`` here, which the plugin turns into
a 400 JSON answer. Run names are only ever looked up among the reader's runs, never
joined to a filesystem path, so nothing here can reach outside the logdir.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Optional, Protocol

from tensorboard import errors

from tb_parity_plugin.engine import align
from tb_parity_plugin.engine.tolerance import TolerancePolicy

#: Parameters each route accepts; anything else is a 400 (catches typos like ``rtoll``).
POLICY_PARAMS = (
    "atol",
    "rtol",
    "warmup",
    "equal_nan",
    "override",
    "mapping",
    "allow_unmatched",
    "accept_read_problems",
    "accept_fewer_steps",
)
PAIR_PARAMS = ("baseline", "candidate")
ROUTE_PARAMS = {
    "runs": (),
    "summary": PAIR_PARAMS + POLICY_PARAMS,
    "matrix": PAIR_PARAMS + POLICY_PARAMS + ("width",),
    "tensor": PAIR_PARAMS + POLICY_PARAMS + ("tensor", "values_at", "replica"),
    "scalars": PAIR_PARAMS + POLICY_PARAMS,
}
#: Bounds that keep one request cheap; the canvas never needs more columns than this.
MAX_WIDTH = 4096
MAX_TEXT = 4096


class MultiDictLike(Protocol):
    """What :class:`Args` reads: werkzeug's ``MultiDict``, or :func:`from_mapping`'s stand-in."""

    def keys(self) -> Iterable[str]: ...

    def getlist(self, key: str) -> list[str]: ...


class Args:
    """Read-only view of a request's query string (werkzeug ``MultiDict`` or a dict of lists)."""

    def __init__(self, multidict: MultiDictLike) -> None:
        self._md = multidict

    def keys(self) -> Iterable[str]:
        return list(self._md.keys())

    def getlist(self, key: str) -> list[str]:
        return list(self._md.getlist(key))


def check_known(route: str, args: Args) -> None:
    """400 on any parameter the route does not take."""
    allowed = ROUTE_PARAMS[route]
    unknown = sorted(k for k in args.keys() if k not in allowed)
    if unknown:
        raise errors.InvalidArgumentError(f"unknown parameter(s) {unknown} for /{route}; allowed: {list(allowed)}")


def _one(args: Args, key: str, required: bool = False) -> Optional[str]:
    values = args.getlist(key)
    if len(values) > 1:
        raise errors.InvalidArgumentError(f"parameter {key!r} given {len(values)} times")
    if not values:
        if required:
            raise errors.InvalidArgumentError(f"missing parameter {key!r}")
        return None
    value = values[0]
    if len(value) > MAX_TEXT or "\x00" in value:
        raise errors.InvalidArgumentError(f"parameter {key!r} is malformed")
    return value


def _float(args: Args, key: str) -> Optional[float]:
    text = _one(args, key)
    if text is None or text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        raise errors.InvalidArgumentError(f"{key} must be a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise errors.InvalidArgumentError(f"{key} must be a finite number >= 0, got {text!r}")
    return value


def _int(args: Args, key: str, low: int, high: int) -> Optional[int]:
    text = _one(args, key)
    if text is None or text == "":
        return None
    try:
        value = int(text)
    except ValueError:
        raise errors.InvalidArgumentError(f"{key} must be an integer, got {text!r}") from None
    if not low <= value <= high:
        raise errors.InvalidArgumentError(f"{key} must be in [{low}, {high}], got {value}")
    return value


def _bool(args: Args, key: str) -> bool:
    text = _one(args, key)
    if text in (None, "", "0", "false"):
        return False
    if text in ("1", "true"):
        return True
    raise errors.InvalidArgumentError(f"{key} must be 0/1/true/false, got {text!r}")


@dataclasses.dataclass(frozen=True)
class PairQuery:
    """A baseline/candidate pair plus the tolerance policy and name mapping to compare with."""

    baseline: str
    candidate: str
    policy: TolerancePolicy
    mapping: tuple[str, ...]

    @property
    def cache_key(self) -> tuple[str, str, TolerancePolicy, tuple[str, ...]]:
        return (self.baseline, self.candidate, self.policy, self.mapping)


def parse_pair(args: Args) -> PairQuery:
    """The pair and policy shared by summary, matrix, tensor and scalars."""
    baseline = _one(args, "baseline", required=True) or ""
    candidate = _one(args, "candidate", required=True) or ""
    if not baseline or not candidate:
        raise errors.InvalidArgumentError("baseline and candidate must be non-empty run names")
    mapping = tuple(args.getlist("mapping"))
    for item in mapping:
        if len(item) > MAX_TEXT:
            raise errors.InvalidArgumentError(f"mapping {item[:80]!r}... is longer than {MAX_TEXT} characters")
    try:
        align.parse_mappings(mapping)
    except ValueError as exc:
        raise errors.InvalidArgumentError(str(exc)) from None
    try:
        policy = TolerancePolicy.build(
            atol=_float(args, "atol"),
            rtol=_float(args, "rtol"),
            warmup_steps=_int(args, "warmup", 0, 10**9),
            equal_nan=_bool(args, "equal_nan"),
            overrides=args.getlist("override"),
            allow_unmatched=args.getlist("allow_unmatched"),
            accept_read_problems=_bool(args, "accept_read_problems"),
            accept_fewer_steps=_bool(args, "accept_fewer_steps"),
        )
    except ValueError as exc:
        raise errors.InvalidArgumentError(str(exc)) from None
    return PairQuery(baseline, candidate, policy, mapping)


def parse_width(args: Args) -> Optional[int]:
    """Number of step buckets the heat map wants (``None``: one column per step)."""
    return _int(args, "width", 1, MAX_WIDTH)


def parse_tensor(args: Args) -> tuple[str, Optional[int], Optional[int]]:
    """The baseline tag ``<kind>/<name>``, the optional step whose full values to send, and the
    optional candidate replica to show instead of the one-device value (multi-replica runs)."""
    tag = _one(args, "tensor", required=True) or ""
    if "/" not in tag:
        raise errors.InvalidArgumentError(f"tensor must be a tag '<kind>/<name>', got {tag[:80]!r}")
    return tag, _int(args, "values_at", -(2**62), 2**62), _int(args, "replica", 0, MAX_WIDTH)
