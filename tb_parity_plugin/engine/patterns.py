"""User patterns: tolerance overrides, name mappings and ``allow_unmatched``, matched one way.

Patterns come from command lines and from URL parameters of a shared TensorBoard, so a pattern
must never be able to stall the process: Python's ``re`` backtracks (``re:(.*.*)*X`` against a
15-character tag takes seconds, and grows exponentially). Regular expressions are therefore
compiled by RE2 (Google's ``google-re2`` binding, kept by the RE2 authors): it matches in time
linear in the text, with bounded memory, and refuses what it cannot do so (backreferences,
lookaround) with an error instead of a slow path.

Accepted syntax (README, "Patterns"):
- a glob (``grad/*``, ``*/dense*/kernel*``): ``fnmatch`` rules, matched against the whole tag;
- ``re:<regex>``: RE2 syntax (https://github.com/google/re2/wiki/Syntax), searched in the tag;
- in a mapping ``re:<regex>=<replacement>``, the replacement may use ``\\1``..``\\99`` and
  ``\\g<name>``, each naming a group the regex has.

Every problem is a :class:`ValueError` naming the parameter; front ends turn it into a 400 or an
exit status 2.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any, Callable

import re2

#: Longest pattern accepted (a CLI argument or a URL parameter); RE2's memory is bounded too.
MAX_PATTERN = 1000
_MAX_MEM = 8 << 20
_TEMPLATE_REF = re.compile(r"\\(?:g<([^>]*)>|(\d{1,2})|(.))", re.S)


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False  # errors are raised to the caller, not printed by RE2's logger
    options.max_mem = _MAX_MEM
    return options


def regex(text: str, what: str) -> Any:
    """A compiled RE2 regex; ``ValueError`` naming ``what`` if it is too long or not valid RE2."""
    if len(text) > MAX_PATTERN:
        raise ValueError(f"{what}: pattern longer than {MAX_PATTERN} characters")
    try:
        return re2.compile(text, options=_options())
    except re2.error as exc:
        message = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise ValueError(f"{what}: bad regex {text!r}: {message} (RE2 syntax)") from None


def matcher(pattern: str, what: str) -> Callable[[str], bool]:
    """``tag -> bool`` for a glob or an ``re:`` pattern (see the module doc)."""
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"{what}: a pattern must be a non-empty string, got {pattern!r}")
    if pattern.startswith("re:"):
        compiled = regex(pattern[3:], what)
        return lambda tag: compiled.search(tag) is not None
    if len(pattern) > MAX_PATTERN:
        raise ValueError(f"{what}: pattern longer than {MAX_PATTERN} characters")
    # fnmatch translates a glob so that its stars cannot backtrack into each other (lookahead and
    # a backreference per star), so globs stay on Python's engine, bounded by MAX_PATTERN.
    return lambda tag: fnmatch.fnmatchcase(tag, pattern)


def check_template(compiled: Any, template: str, what: str) -> None:
    """Refuse a replacement that names a group the regex lacks (``\\g<x>``, ``\\9``) or ends in ``\\``."""
    for name, number, other in _TEMPLATE_REF.findall(template):
        if name:
            ok = name in compiled.groupindex or (name.isdigit() and int(name) <= compiled.groups)
            if not ok:
                raise ValueError(f"{what}: replacement {template!r} names group {name!r}, which the regex lacks")
        elif number and int(number) > compiled.groups:
            raise ValueError(f"{what}: replacement {template!r} uses group {number}; the regex has {compiled.groups}")
        del other  # any other escape (\n, \\) is the replacement's own text
    if (len(template) - len(template.rstrip("\\"))) % 2 == 1:
        raise ValueError(f"{what}: replacement {template!r} ends in a lone backslash")
