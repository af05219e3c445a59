"""The README's command lines, checked against the code that runs them."""

from __future__ import annotations

import os
import re
import shlex

from tb_parity_plugin import cli

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def _synopsis() -> str:
    """The ``tb-parity diff LOGDIR ...`` block under "Compare in CI"."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    found = re.search(r"```\n(tb-parity diff LOGDIR.*?)```", text, re.S)
    assert found, "the README's tb-parity diff synopsis"
    return found.group(1)


def test_the_diff_synopsis_names_every_option_the_cli_takes_and_no_other() -> None:
    """A new user read the synopsis for the flags: it named no ``--allow-unmatched``,
    ``--accept-read-problems``, ``--accept-fewer-steps`` or ``--require-values``, which the
    structure lines, the exit codes 3 and 4 and the prose ask for."""
    shown = set(re.findall(r"--[a-z][a-z-]*", _synopsis()))
    taken = {o for a in cli.comparison_options()._actions for o in a.option_strings if o.startswith("--")}
    taken = (taken - {"--help"}) | {"--json"}  # diff's own flag beside the shared ones
    assert shown == taken, f"README lacks {sorted(taken - shown)}, names {sorted(shown - taken)} the CLI lacks"


def test_every_flag_the_readme_shows_with_its_value_parses_as_the_cli_takes_it() -> None:
    """Each code span of the README that starts with a comparison flag and gives its value
    (``--allow-unmatched 'slot/*'``) parses as ``tb-parity diff LOGDIR <span>`` with nothing left
    over: ``--allow-unmatched 'state/*' 'slot/*'`` stopped the CLI with "unrecognized arguments:
    slot/*" (the flag takes one pattern, repeated)."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    parser = cli.comparison_options()
    flags = {o for a in parser._actions for o in a.option_strings}
    checked = 0
    for span in re.findall(r"`(--[^`]+)`", text):
        words = shlex.split(span)
        if words[0].split("=")[0] not in flags or (len(words) == 1 and "=" not in words[0]):
            continue  # another command's flag, or a flag named without a value
        _, rest = parser.parse_known_args(["LOGDIR", *words])
        assert not rest, f"README's `{span}`: the CLI leaves {rest} unparsed"
        checked += 1
    assert checked >= 20  # the README's flag examples were found
