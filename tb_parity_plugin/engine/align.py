"""Pairs the baseline's tensors with the candidate's, within the same kind.

TF1 and its Keras port name the same variable differently (``dense_1/kernel:0`` vs
``simple_model/dense_4/kernel:0``), so exact names are only the first try. In order,
each stage pairing only what earlier stages left:

1. ``map``: the user's mappings, ``OLD=NEW`` (exact) or ``re:PATTERN=REPL`` (regex
   substitution on baseline names); ``OLD`` may be a name or a ``kind/name`` tag. A mapping
   that pairs tensors of different shapes is kept (the user asked for it) with a warning;
2. ``exact``: identical names, a scope at a time: when a tensor under a scope has another shape
   on the other side (one that is not the same elements regrouped: :func:`reshaped`), none of
   that scope's tensors is paired by name (Keras names layers of
   other widths created in another order alike: ``dense_2/bias`` may be another layer's bias of
   the same shape); identical names of other shapes are paired after every other stage, as a
   shape divergence, unless their layer holds variables named otherwise in the two runs (another
   parametrisation: a TF1 ``LSTMCell`` scoped ``lstm`` against Keras ``LSTM``; left unpaired, with
   the gradients and slots of its unpaired variables, :meth:`_Pairing.parametrised_otherwise`);
3. ``canonical``: names with ``:0`` and the run-wide shared scope prefix stripped (optimizer
   slots first spelled ``<variable>/<role>`` whatever the optimizer family, :func:`slot_canonical`),
   then additionally with Keras ``_N`` suffixes renumbered by first appearance;
4. ``fallback``: by kind and shape: the only free tensor of a kind and shape on each side;
   then tensors under scopes already paired one-to-one (a kernel's bias follows it); then the
   k-th free tensor of a kind and shape with the k-th of the other side in execution order,
   only when both sides have as many of that kind and shape. Tensors the user expects one run
   alone to record (``allow_unmatched``) take no part in this stage: a TF1 ``GRUCell``'s
   ``candidate/bias [4]`` made a faithful port's LayerNorm ``gamma``/``beta [4]`` three against
   two, so they stayed unmatched (a false structure DIVERGE on a port following the README).
   After the layers are settled, every gradient, slot and moving average whose variable is
   paired goes with the tensor named after its variable's partner (``follow_variables``).
   Last of all, after the stages that pair by layers and values, a tensor whose shape has an
   unknown dimension (``[None, 6]``) is paired with the one free tensor of its kind on the other
   side whose shape fits it, when each is the other's only fit.

Element samples (``<name>#sample``) take no part in the stages: each is paired after them with
its tensor's partner's sample, unless both tensors have full values at every step.

No stage but ``exact`` and ``map`` pairs tensors whose shapes differ: a canonical scope (``dense#0`` on both sides) is accepted only when every tensor under it has the same shape on both sides,
so layers created in another order do not pair a (3, 2) kernel with a (2, 2) one, nor
their biases with each other. What stays unmatched is listed with its candidates (free
tensors of the same kind and shape on the other side): never paired blindly.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import operator
import re
from typing import Any, Callable, Hashable, Iterable, Optional, Protocol, Sequence

import numpy as np

from tb_parity_plugin.engine import patterns
from tb_parity_plugin.records import metadata

Key = tuple[str, str]  # (kind, name)


class SeriesLike(Protocol):
    kind: str
    name: str
    order: int
    shape: tuple[Optional[int], ...]


@dataclasses.dataclass(frozen=True)
class Match:
    base: Key
    cand: Key
    how: str  # exact | canonical | map | fallback | first values | layer | variable


@dataclasses.dataclass
class Alignment:
    matches: list[Match]  # in baseline execution order
    unmatched_base: list[Key]  # in execution order
    unmatched_cand: list[Key]
    warnings: list[str]  # e.g. a mapping that matched nothing
    #: unmatched baseline key -> free candidate keys of the same kind and shape (ambiguous matches)
    candidates: dict[Key, list[Key]] = dataclasses.field(default_factory=dict)
    #: (side 0 base / 1 candidate, key) -> how many first rows of its statistics the pairing read:
    #: with the names, orders and shapes, all the alignment depends on (:func:`evidence`)
    read: dict[tuple[int, Key], int] = dataclasses.field(default_factory=dict)


def shapes_compatible(a: tuple[Optional[int], ...], b: tuple[Optional[int], ...]) -> bool:
    """Same rank and equal dims where both are known (``None`` is unknown; ``(None,)`` unknown rank)."""
    a, b = tuple(a), tuple(b)
    if a == (None,) or b == (None,):
        return True
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b))


def reshaped(a: Sequence[Optional[int]], b: Sequence[Optional[int]]) -> bool:
    """Two static shapes, not equal, that hold the same elements in the same row-major order
    because one is the other with adjacent dimensions merged (or dimensions of 1 added): Keras
    ``MultiHeadAttention``'s query kernel ``[d, heads, key_dim]`` against a TF1 dense's
    ``[d, heads * key_dim]``, its output kernel ``[heads, key_dim, d]`` against
    ``[heads * key_dim, d]``; a TF1 activation ``[None, 27]`` (a placeholder's batch) against the
    port's ``[10, 3, 3, 3]`` (dropout before flatten). Paired by name or ``--map``, they are
    compared element for element: a faithful attention port was a shape divergence. A
    transposed layout is not such a pair. See :func:`reshaped_prefix`."""
    return reshaped_prefix(a, b) is not None


def reshaped_prefix(a: Sequence[Optional[int]], b: Sequence[Optional[int]]) -> Optional[int]:
    """For a :func:`reshaped` pair, how many leading dimensions the two shapes share (a graph's
    unknown batch dimension among them, matched at run time: :meth:`Pair.dims_differ`); the
    dimensions after them are known and regroup the same elements. None when not reshaped."""
    a, b = tuple(a), tuple(b)
    if a == b or a == (None,) or b == (None,):
        return None
    lead = 0
    while lead < min(len(a), len(b)) and (a[lead] is None or b[lead] is None or a[lead] == b[lead]):
        if None not in a[lead:] and None not in b[lead:]:
            break  # the rest is known: regrouped from here (or from an earlier known dimension)
        lead += 1
    rest_a, rest_b = a[lead:], b[lead:]
    if None in rest_a or None in rest_b or rest_a == rest_b:
        return None
    dims_a, dims_b = [int(x) for x in rest_a if x is not None], [int(x) for x in rest_b if x is not None]
    if math.prod(dims_a) != math.prod(dims_b) or math.prod(dims_a) == 0:
        return None
    cuts_a, cuts_b = set(itertools.accumulate(dims_a, operator.mul)), set(itertools.accumulate(dims_b, operator.mul))
    return lead if cuts_a <= cuts_b or cuts_b <= cuts_a else None


def same_elements(a: Sequence[Optional[int]], b: Sequence[Optional[int]]) -> bool:
    """:func:`shapes_compatible` or :func:`reshaped`: a pairing by name compares them element-wise."""
    return shapes_compatible(tuple(a), tuple(b)) or reshaped(a, b)


def _outputs_named(series: Sequence[SeriesLike]) -> dict[str, list[SeriesLike]]:
    """The tensors of an output kind by name (a layer's output is named after its scope)."""
    named: dict[str, list[SeriesLike]] = {}
    for s in series:
        if s.kind in _OUTPUT_KINDS:
            named.setdefault(s.name, []).append(s)
    return named


def _scope_outputs(named: dict[str, list[SeriesLike]], scope: str, scopes: Iterable[str]) -> list[SeriesLike]:
    """The outputs named after layer ``scope``: its whole scope (TF1's ``wide/dense``), else its own
    name (Keras's ``dense_3`` for a subclassed model's ``two_tower/dense_3``) when no other of
    ``scopes`` has that own name."""
    if scope in named:
        return named[scope]
    own = scope.rpartition("/")[2]
    if sum(1 for other in scopes if other.rpartition("/")[2] == own) != 1:
        return []
    return named.get(own, [])


def _output_orders(series: Sequence[SeriesLike], scopes: Iterable[str]) -> Optional[dict[str, int]]:
    """Each scope's output's execution order: the one tensor of an output kind named after the
    scope (:func:`_scope_outputs`); None when a scope has none, or several."""
    named = _outputs_named(series)
    scopes = list(scopes)
    found = {}
    for scope in scopes:
        outputs = _scope_outputs(named, scope, scopes)
        if len(outputs) != 1:
            return None
        found[scope] = outputs[0].order
    return found


def execution_key(series: SeriesLike) -> tuple[int, int, str, str]:
    """Sort key for execution order within a step (ties broken by phase, then tag)."""
    return (series.order, metadata.kind_phase(series.kind), series.kind, series.name)


_SUFFIX = re.compile(r"^(.*?)_(\d+)$")
#: Stages that pair by name, or by kind, shape and execution order (creation order, for weights):
#: what :meth:`_Pairing.by_first_values` may correct. Not the user's ``map``.
_GUESSED = frozenset({"exact", "canonical", "fallback"})
#: Kinds that hold a layer's own variables: how layers are told apart.
_LAYER_KINDS = frozenset({"weight", "state"})
#: Kinds whose tensors may be named after the layer that output them (``by_layer_outputs``).
_OUTPUT_KINDS = frozenset({"activation", "output"})
#: Layers that start identical (batch norm) are told apart at the first of this many steps both
#: runs logged where they differ (a gradient at step 0, a weight after its first update) ...
TELL_APART_STEPS = 3
#: ... among the first this many steps each run logged (a run may log every k-th step).
TELL_APART_SCAN = 64
#: ... by a pairing at least this many times closer there than any other: a faithful port differs
#: from its baseline by rounding (1e-7 of the values), two layers by their own data (1e-3 and up).
TELL_APART_MARGIN = 100.0


def _strip_output_index(name: str) -> str:
    return name[:-2] if name.endswith(":0") else name


def _strip_shared_prefix(names: Sequence[str]) -> list[str]:
    """Drop the leading scope components shared by every scoped name (keeping the last)."""
    scoped = [n.split("/") for n in names if "/" in n]
    depth = 0
    if scoped:
        shortest = min(len(parts) for parts in scoped) - 1
        while depth < shortest and len({parts[depth] for parts in scoped}) == 1:
            depth += 1
    if depth == 0:
        return list(names)
    return ["/".join(n.split("/")[depth:]) if "/" in n else n for n in names]


def _renumber(names: Sequence[str]) -> list[str]:
    """Renumber ``layer_N`` scope components per layer-type base by first appearance.

    ``dense, dense_1`` and ``dense_3, dense_4`` both become ``dense#0, dense#1``. The
    last component (the variable's own name) is kept as is. ``names`` must be in
    execution order.
    """
    seen: dict[str, dict[str, int]] = {}

    def token(component: str) -> str:
        m = _SUFFIX.match(component)
        base = m.group(1) if m else component
        ids = seen.setdefault(base, {})
        return f"{base}#{ids.setdefault(component, len(ids))}"

    out = []
    for name in names:
        parts = name.split("/")
        out.append("/".join([token(p) for p in parts[:-1]] + parts[-1:]))
    return out


#: An optimizer slot's role, from the name each optimizer family gives it: TF1 ``train``
#: optimizers suffix the variable (``dense/kernel/Momentum``, ``/Adam``, ``/Adam_1``), tf_keras
#: legacy ones too (``dense/kernel/momentum``, ``/m``, ``/v``), tf_keras's current ones prefix it
#: (``m/dense/kernel``), and the shim names Keras 3 slots ``<variable path>/<slot>``
#: (``dense/kernel/momentum``, ``/velocity``). Momentum's accumulator and Adam's first moment
#: are both ``m`` (an SGD has no Adam moment to confuse it with); RMSProp's mean square and Adam's
#: second moment are both ``v``, the moving average of squared gradients: tf_keras's RMSprop names
#: it ``velocity`` like Adam's, and TF1's ``<variable>/RMSProp`` stayed unpaired against it (a
#: faithful RMSProp port's structure DIVERGE, new user 6).
SLOT_ROLES = {
    "Momentum": "m",
    "Adam": "m",
    "Adam_1": "v",
    "RMSProp": "v",
    "RMSProp_1": "m",  # "mg" when the variable also has RMSProp_2 (:func:`centered_rmsprop`)
    "RMSProp_2": "m",
    "mg": "mg",
    "average_gradient": "mg",
    "Adagrad": "accumulator",
    "momentum": "m",
    "m": "m",
    "v": "v",
    "velocity": "v",
    "vhat": "vhat",
    "velocity_hat": "vhat",  # Keras 3's AMSGrad maximum (``<variable path>/velocity_hat``)
    "rms": "v",
    "accumulator": "accumulator",
    # BERT's AdamWeightDecayOptimizer and the LAMB copies (shim/slots.py MOMENT_LEAVES): Adam's
    # moments without bias correction, kept as plain variables the TF1 shim records as slots
    "adam_m": "m",
    "adam_v": "v",
    "lamb_m": "m",
    "lamb_v": "v",
    # Adadelta's mean square of the gradients (``v``, as RMSProp's) and of its updates (``delta``),
    # Ftrl's accumulator and linear term: TF1 names them after the optimizer (``<variable>/Adadelta``,
    # ``/Adadelta_1``; ``/Ftrl``, ``/Ftrl_1``), tf_keras prefixes ``accumulated_grad``,
    # ``accumulated_delta_var``, ``accumulator``, ``linear``, its legacy ones suffix ``accum_grad``,
    # ``accum_var``, ``accumulator``, ``linear``. Unknown, they were paired by shape and order, had no
    # gradient to bound them, and a helper's Adadelta port with another rho was told nothing of it.
    "Adadelta": "v",
    "accumulated_grad": "v",
    "accum_grad": "v",
    "Adadelta_1": "delta",
    "accumulated_delta_var": "delta",
    "accum_var": "delta",
    "Ftrl": "accumulator",
    "Ftrl_1": "linear",
    "linear": "linear",
}
_PREFIX_SLOT_ROLES = (
    "m",
    "v",
    "vhat",
    "momentum",
    "velocity",
    "accumulator",
    "average_gradient",
    "accumulated_grad",
    "accumulated_delta_var",
    "linear",
)
#: The power of the gradient each role sums: first moments and momenta ``g``, second moments and
#: accumulators ``g²`` (``Pair.allowance``; a role not listed is held to both).
ROLE_MOMENT = {"m": 1, "mg": 1, "v": 2, "vhat": 2, "accumulator": 2}
#: Spellings of slots that hold a moving average (``b s + (1 - b) g^p``: Adam's moments, RMSprop's
#: mean square), which move by at most the largest difference of what they average, and of slots
#: that sum (momentum ``m s + g``, Adagrad's accumulator), which move by the sum. tf_keras spells
#: both SGD's momentum and Adam's first moment ``m``: a slot is averaging only when a side says so
#: and neither says it sums (``Pair.allowance``; unknown: summing, the looser bound).
AVERAGING_SPELLINGS = frozenset(
    {"Adam", "Adam_1", "RMSProp", "v", "vhat", "velocity_hat", "velocity", "rms", "mg", "average_gradient"}
    | {"adam_m", "adam_v", "lamb_m", "lamb_v", "Adadelta", "accumulated_grad", "accum_grad"}
)
SUMMING_SPELLINGS = frozenset({"Momentum", "momentum", "Adagrad", "accumulator", "Ftrl"})
#: Spellings of Adadelta's mean square of the gradients, whose decay is ``rho`` (0.95 by default
#: in TF1 and Keras), not Adam's ``beta_2`` (the first-update note names the one it is).
RHO_SPELLINGS = frozenset({"Adadelta", "accumulated_grad", "accum_grad"})


def decay_name(base_name: str, cand_name: str, power: int) -> tuple[str, float, str]:
    """(the decay parameter, its default, whose default) of two paired moving averages of the
    gradient's ``power``: Adadelta's ``rho`` for its spellings (:data:`RHO_SPELLINGS`), else Adam's
    ``beta_1`` or ``beta_2``."""
    spelled = {_slot_parts(_strip_output_index(n))[1] for n in (base_name, cand_name)}
    if spelled & RHO_SPELLINGS:
        return "rho", 0.95, "Adadelta's"
    return ("beta_1", 0.9, "Adam's") if power == 1 else ("beta_2", 0.999, "Adam's")


def _slot_parts(name: str) -> tuple[str, str]:
    """(variable, the role as the name spells it) of a slot's name; (name, "") if no role is known."""
    var, _, last = name.rpartition("/")
    if var and last in SLOT_ROLES:
        return var, last
    first, _, rest = name.partition("/")
    return (rest, first) if rest and first in _PREFIX_SLOT_ROLES else (name, "")


#: Words in a name's last part that say it holds an optimizer's moment though no spelling of
#: :data:`SLOT_ROLES` (``dense/kernel/Momentum_3``, ``first_moment``, ``adam_mu``).
_MOMENT_WORDS = ("momentum", "moment", "velocity", "accumulator", "adam", "lamb")


def moment_like(name: str) -> Optional[tuple[str, str]]:
    """(variable, role, "" when the spelling says none) when ``name``, whatever kind it was recorded
    as, is spelled as an optimizer's moment of a variable (:data:`SLOT_ROLES`, :data:`_MOMENT_WORDS`);
    else None. For the structure hints: a moment recorded as ``state`` in one run and as a slot in
    the other is one quantity under two kinds (``engine/structure.py``)."""
    name = _strip_output_index(name)
    var, spelled = _slot_parts(name)
    if spelled:
        return var, SLOT_ROLES[spelled]
    var, _, leaf = name.rpartition("/")
    if var and any(word in leaf.lower() for word in _MOMENT_WORDS):
        return var, ""
    return None


def slot_rule(base_name: str, cand_name: str) -> tuple[int, bool]:
    """(the power of the gradient two paired slots hold, :data:`ROLE_MOMENT`, 0 when unknown;
    whether they hold a moving average, :data:`AVERAGING_SPELLINGS`), for ``Pair.allowance``."""
    spelled = {_slot_parts(_strip_output_index(n))[1] for n in (base_name, cand_name)}
    moment = ROLE_MOMENT.get(variable_and_role("slot", base_name)[2], 0)
    return moment, bool(spelled & AVERAGING_SPELLINGS) and not spelled & SUMMING_SPELLINGS


#: TF1's ``RMSPropOptimizer`` makes its slots in the order rms, mg (``centered=True`` only),
#: momentum (made even with momentum 0), named by TF1's uniquifier ``<variable>/RMSProp``,
#: ``/RMSProp_1``, ``/RMSProp_2``: ``RMSProp_1`` is the momentum unless the variable also has an
#: ``RMSProp_2``, and then it is the centered mean gradient. Taken as the momentum, a new user's
#: faithful centered port compared mg with Keras's momentum: a false DIVERGE at step 1.
_TF1_RMSPROP_2 = "/RMSProp_2"


def centered_rmsprop(names: Iterable[str]) -> frozenset[str]:
    """The variables among one run's slot ``names`` whose TF1 RMSProp is centered (they have an
    ``RMSProp_2``): pass it to :func:`slot_canonical` and the functions built on it."""
    stripped = (_strip_output_index(n) for n in names)
    return frozenset(n[: -len(_TF1_RMSPROP_2)] for n in stripped if n.endswith(_TF1_RMSPROP_2))


def slot_canonical(name: str, centered: frozenset[str] = frozenset()) -> str:
    """``<variable>/<role>`` for a slot's name in any optimizer family's spelling (:data:`SLOT_ROLES`);
    ``centered``: its run's :func:`centered_rmsprop` (else ``RMSProp_1`` is read as the momentum)."""
    var, spelled = _slot_parts(name)
    if spelled == "RMSProp_1" and var in centered:
        return f"{var}/mg"
    return f"{var}/{SLOT_ROLES[spelled]}" if spelled else name


#: A variable's exponential moving average, in each family's spelling: TF1's (and TF2's)
#: ``ExponentialMovingAverage`` names its shadow ``<variable>/ExponentialMovingAverage``, tf_keras's
#: ``use_ema`` ``average/<variable>``, Keras 3's (as the shim names it) ``<variable path>/average``.
#: All are ``state`` (``shim/slots.py``, ``AVERAGE_ROLE``).
_AVERAGE_LEAVES = ("ExponentialMovingAverage", "average")


def average_canonical(name: str) -> str:
    """``<variable>/average`` for a moving average's name in any family's spelling (:data:`_AVERAGE_LEAVES`)."""
    var, _, last = name.rpartition("/")
    if var and last in _AVERAGE_LEAVES:
        return f"{var}/average"
    first, _, rest = name.partition("/")
    if rest and first == "average":
        return f"{rest}/average"
    return name


def role_canonical(kind: str, name: str, centered: frozenset[str] = frozenset()) -> str:
    """``<variable>/<role>`` for a slot or a moving average (``state``), else ``name`` as it is."""
    if kind == "slot":
        return slot_canonical(name, centered)
    if kind == "state":
        return average_canonical(name)
    return name


def variable_and_role(kind: str, name: str, centered: frozenset[str] = frozenset()) -> tuple[str, str, str]:
    """``(variable, "/", role)`` of a slot's or moving average's name (``:0`` stripped; the variable
    is empty when the name has no scope)."""
    return role_canonical(kind, _strip_output_index(name), centered).rpartition("/")


def variable_of(kind: str, name: str, centered: frozenset[str] = frozenset()) -> Optional[tuple[str, str]]:
    """(variable, role) a weight, gradient, slot or moving average is named after (role "" for a
    weight or gradient: named after the variable itself); None for any other tensor."""
    if kind in ("weight", "grad"):
        return _strip_output_index(name), ""
    if kind not in ("slot", "state"):
        return None
    var, _, role = variable_and_role(kind, name, centered)
    return (var, role) if var and (kind == "slot" or role == "average") else None


#: Slot roles not fed by their variable's gradient alone (Adadelta's ``delta``, the mean square of
#: its updates, of the size of lr² x the gradient's): no gradient pair bounds them.
_UNFED_ROLES = frozenset({"delta"})


def gradient_matches(matches: Sequence[Match]) -> dict[int, int]:
    """Index of each slot's and weight's match -> index of the match of its variable's gradient,
    when both sides' tensors are named after the two variables whose gradients that match pairs.
    Why: a slot sums its variable's gradients, so the differences the gradients were allowed add
    up in it (``Pair.feeder``); a weight that diverges after agreeing gradients was moved by
    another update (``Comparison._divergence``'s note)."""
    grads = {
        (_strip_output_index(m.base[1]), _strip_output_index(m.cand[1])): i
        for i, m in enumerate(matches)
        if m.base[0] == m.cand[0] == "grad"
    }
    found = {}
    for i, m in enumerate(matches):
        if m.base[0] == m.cand[0] and m.base[0] in ("slot", "weight"):
            b, c = variable_of(*m.base), variable_of(*m.cand)
            if b is not None and b[1] in _UNFED_ROLES:
                continue  # Adadelta's mean square of its updates moves by no bound of its gradient's
            j = None if b is None or c is None else grads.get((b[0], c[0]))
            if j is not None:
                found[i] = j
    return found


def _canonical_names(series: Sequence[SeriesLike], renumber: bool) -> list[str]:
    stripped = [_strip_output_index(s.name) for s in series]
    centered = centered_rmsprop(n for s, n in zip(series, stripped) if s.kind == "slot")
    names = _strip_shared_prefix([role_canonical(s.kind, n, centered) for s, n in zip(series, stripped)])
    return _renumber(names) if renumber else names


def _abbreviates(short: str, name: str) -> bool:
    """Whether a mapping's ``short`` names ``name``: itself, without ``:0``, or its last scopes
    (``dense_3/kernel`` for ``sequential/dense_3/kernel:0``)."""
    return any(name == form or name.endswith("/" + form) for form in (short, short + ":0"))


def parse_mapping(item: str) -> tuple[Optional[Any], str, str]:
    """``OLD=NEW`` or ``re:PATTERN=REPL`` (the first ``=`` separates; RE2, engine/patterns.py);
    ``ValueError`` if malformed, including a replacement naming a group the regex lacks."""
    text = item[3:] if item.startswith("re:") else item
    old, sep, new = text.partition("=")
    if not sep or not old:
        raise ValueError(f"mapping {item!r} is not OLD=NEW or re:PATTERN=REPL")
    if item.startswith("re:"):
        regex = patterns.regex(old, f"mapping {item!r}")
        patterns.check_template(regex, new, f"mapping {item!r}")
        return regex, old, new
    return None, old, new


def parse_mappings(items: Sequence[str]) -> list[tuple[Optional[Any], str, str]]:
    """:func:`parse_mapping` of each, and ``ValueError`` when two exact mappings give one name two
    targets, or two names one target: the first silently won and the second "paired no tensors", so
    which tensors the verdict compared depended on the flags' order (a repeated identical mapping is
    harmless)."""
    parsed = [parse_mapping(item) for item in items]
    targets: dict[str, tuple[str, str]] = {}
    sources: dict[str, list[tuple[str, str, str]]] = {}
    for item, (regex, old, new) in zip(items, parsed):
        if regex is not None:
            continue
        # one name with and without its output index (dense/kernel and dense/kernel:0) is one name
        key, target = _strip_output_index(old), _strip_output_index(new)
        earlier = targets.setdefault(key, (target, item))
        if earlier[0] != target:
            raise ValueError(
                f"mappings {earlier[1]!r} and {item!r} pair {old} with two tensors: give one mapping for it"
            )
        # a candidate tensor pairs once: `--map a=z --map b=z` compared a or b by the flags' order; within a
        # kind, which a tag's prefix names (`weight/a=z` and `grad/b=z` pair two kinds' tensors; a name, all)
        head, _, rest = key.partition("/")
        kind, name = (head, rest) if rest and head in metadata.KIND_PHASE else ("*", key)
        for other_kind, other_name, other_item in sources.setdefault(target, []):
            if other_name != name and (kind == other_kind or "*" in (kind, other_kind)):
                raise ValueError(
                    f"mappings {other_item!r} and {item!r} pair two tensors with {new}: a tensor pairs with one "
                    "other, give one mapping for it"
                )
        sources[target].append((kind, name, item))
    return parsed


class _Pairing:
    """Mutable state of one alignment: what is still free on each side."""

    def __init__(
        self, base: Sequence[SeriesLike], cand: Sequence[SeriesLike], expected: Callable[[str], bool] = lambda _: False
    ) -> None:
        self.base = sorted(base, key=execution_key)
        self.cand = sorted(cand, key=execution_key)
        self.free_base = {(s.kind, s.name) for s in self.base}
        self.free_cand = {(s.kind, s.name) for s in self.cand}
        #: Tags one run alone may record (``allow_unmatched``): never paired by shape and order.
        self.expected = {(s.kind, s.name) for s in [*self.base, *self.cand] if expected(f"{s.kind}/{s.name}")}
        self.matches: list[Match] = []
        self.read: dict[tuple[int, Key], int] = {}

    def rows(self, side: int, series: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The first ``n`` logged steps of ``series`` and their statistics, noted as read (a refresh
        aligns anew when they change)."""
        key = (side, (series.kind, series.name))
        self.read[key] = max(self.read.get(key, 0), n)
        steps, stats = getattr(series, "steps", None), getattr(series, "stats", None)
        if steps is None or stats is None:
            return np.zeros(0, np.int64), np.zeros((0, metadata.N_STATS))
        return steps[:n], stats[:n]

    def start(self, side: int, leaves: dict[tuple[str, str], Any]) -> Optional[tuple[Any, ...]]:
        """How the series ``leaves`` (a layer's variables by kind and leaf) start: a hashable (leaf, first
        step, statistics there) per leaf, equal exactly when every statistic is (-0.0 as 0.0, NaN as
        NaN); None when one has logged nothing."""
        found = []
        for leaf, series in sorted(leaves.items()):
            steps, stats = self.rows(side, series, 1)
            if not len(steps):
                return None
            row = np.where(np.isnan(stats[0]), np.nan, stats[0] + 0.0)
            found.append((leaf, int(steps[0]), row.tobytes()))
        return tuple(found)

    def row_at(self, side: int, series: Any, step: int) -> Optional[np.ndarray]:
        """The statistics of ``series`` at ``step`` if it is one of its first :data:`TELL_APART_SCAN`
        steps (noted as read up to there)."""
        steps = getattr(series, "steps", None)
        if steps is None:
            return None
        at = np.flatnonzero(steps[:TELL_APART_SCAN] == step)
        if not len(at):
            return None
        row: np.ndarray = self.rows(side, series, int(at[0]) + 1)[1][at[0]]
        return row

    def _first_common_steps(self, pairs: list[tuple[Any, Any]]) -> list[int]:
        """The first :data:`TELL_APART_STEPS` steps that both runs logged for ``pairs`` (base,
        candidate series), among the first :data:`TELL_APART_SCAN` each logged (a run may log every
        k-th step). While there are fewer, every series' scan window is noted as read: a refresh
        aligns anew when a step arrives."""
        logged: list[set[int]] = [set(), set()]
        for b, c in pairs:
            for side, series in ((0, b), (1, c)):
                steps = getattr(series, "steps", None)
                if steps is not None:
                    logged[side].update(steps[:TELL_APART_SCAN].tolist())
        common = sorted(logged[0] & logged[1])[:TELL_APART_STEPS]
        if len(common) < TELL_APART_STEPS:
            for b, c in pairs:
                self.rows(0, b, TELL_APART_SCAN)
                self.rows(1, c, TELL_APART_SCAN)
        return common

    def pair(self, b: Key, c: Key, how: str) -> None:
        self.free_base.discard(b)
        self.free_cand.discard(c)
        self.matches.append(Match(b, c, how))

    def by_key(
        self,
        key_of: Callable[[Sequence[SeriesLike]], Sequence[Hashable]],
        how: str,
        scoped: bool,
        same_shape: bool = True,
        skip: Callable[[SeriesLike], bool] = lambda _: False,
    ) -> None:
        """Pair free tensors whose (kind, key) is unique among the free ones on both sides.

        With ``same_shape``, pairs of different shapes are refused; with ``scoped``, a key's
        scope (all but its last component) is one unit: if any pair under a scope pair has
        different shapes, none of that scope's pairs is made (renumbered scopes guessed
        wrong). Without ``same_shape`` (identical names, last), pairs of other shapes are made: a
        shape mismatch between aligned tensors, which the structure report names.
        """

        def index(series: list[SeriesLike]) -> dict[Hashable, Optional[SeriesLike]]:
            free = self.free_base if series is self.base else self.free_cand
            table: dict[Hashable, Optional[SeriesLike]] = {}
            for s, key in zip(series, key_of(series)):
                if (s.kind, s.name) in free and not skip(s):
                    k = (s.kind, key)
                    table[k] = None if k in table else s  # None: ambiguous
            return table

        cand_index = index(self.cand)
        found: list[tuple[SeriesLike, SeriesLike, Hashable]] = []
        for k, b in index(self.base).items():
            c = cand_index.get(k)
            if b is not None and c is not None:
                found.append((b, c, k))
        if scoped:
            bad_scopes = set()
            for b, c, k in found:
                if not same_elements(b.shape, c.shape):
                    bad_scopes.add(_scope_of(k))
            found = [(b, c, k) for b, c, k in found if _scope_of(k) not in bad_scopes]
        for b, c, _ in found:
            if not same_shape or same_elements(b.shape, c.shape):
                self.pair((b.kind, b.name), (c.kind, c.name), how)

    def by_mapping(self, items: Iterable[str]) -> list[str]:
        warnings = []
        cand_names = {(s.kind, s.name) for s in self.cand}
        kinds_of: dict[str, list[str]] = {}
        for kind, name in sorted(cand_names):
            kinds_of.setdefault(name, []).append(kind)
        unique = list(dict.fromkeys(items))  # a mapping given twice: once, not "paired no tensors" the second time
        for item, (regex, old, new) in zip(unique, parse_mappings(unique)):
            used = False
            elsewhere: list[str] = []  # targets the candidate records under another kind
            ambiguous: list[str] = []  # a short name that fits several tensors of one kind
            sources = (
                self._mapped_sources(old, new, ambiguous)
                if regex is None
                else [(s, regex.sub(new, s.name)) for s in self.base if regex.search(s.name) is not None]
            )
            for s, target in sources:
                b = (s.kind, s.name)
                if b not in self.free_base:
                    continue
                c = (s.kind, target)
                if c not in cand_names and regex is None:
                    fit = self._short_name(s.kind, target, self.cand, ambiguous)
                    c = (s.kind, fit.name if fit is not None else target)
                if c in cand_names and c in self.free_cand:
                    self.pair(b, c, "map")
                    used = True
                elif c not in cand_names and target in kinds_of:
                    elsewhere.append(f"{s.kind}/{s.name} -> {'/'.join(kinds_of[target][:1])}/{target}")
            if not used:
                why = ""
                if elsewhere:
                    why = (
                        f": a mapping pairs tensors of one kind, and the candidate records its target under another "
                        f"({', '.join(elsewhere[:3])})"
                    )
                elif ambiguous:
                    why = f": {'; '.join(ambiguous[:3])}; give the full name"
                warnings.append(f"mapping {item!r} paired no tensors{why}")
            elif ambiguous:  # paired in one kind, not in another: say which it left
                warnings.append(
                    f"mapping {item!r} paired no tensor where {'; '.join(ambiguous[:3])}; give the full name"
                )
        return warnings

    def _mapped_sources(self, old: str, new: str, ambiguous: list[str]) -> list[tuple[SeriesLike, str]]:
        """(baseline tensor, target name) of an exact ``OLD=NEW``: the tensors named or tagged ``OLD``;
        if none, per kind the one tensor ``OLD`` abbreviates (:func:`_abbreviates`). A new user's
        ``dense/kernel=dense_3/kernel`` paired nothing: the names were ``dense/kernel:0`` and
        ``sequential/dense_3/kernel:0``."""
        exact = [
            (s, new[len(s.kind) + 1 :] if old != s.name and new.startswith(s.kind + "/") else new)
            for s in self.base
            if old in (s.name, f"{s.kind}/{s.name}")
        ]
        if exact:
            return exact
        found = []
        for kind in dict.fromkeys(s.kind for s in self.base):
            short, target = old, new
            if old.startswith(kind + "/"):
                short, target = old[len(kind) + 1 :], new[len(kind) + 1 :] if new.startswith(kind + "/") else new
            fit = self._short_name(kind, short, self.base, ambiguous)
            if fit is not None:
                found.append((fit, target))
        return found

    @staticmethod
    def _short_name(kind: str, short: str, side: Sequence[SeriesLike], ambiguous: list[str]) -> Optional[SeriesLike]:
        """The one tensor of ``kind`` on ``side`` whose name ``short`` abbreviates, else None (several
        are noted in ``ambiguous``)."""
        fits = [s for s in side if s.kind == kind and _abbreviates(short, s.name)]
        whole = [s for s in fits if s.name in (short, short + ":0")]  # only ":0" dropped: meant as is
        fits = whole or fits
        if len(fits) > 1:
            ambiguous.append(f"{short!r} fits {len(fits)} {kind} tensors ({', '.join(s.name for s in fits[:3])})")
        return fits[0] if len(fits) == 1 else None

    def _free_groups(self, kind: str) -> dict[tuple[Any, ...], tuple[list[SeriesLike], list[SeriesLike]]]:
        """Free tensors of ``kind`` grouped by static shape: shape -> (base list, cand list), execution order.

        A shape with a dimension the graph does not know (``[None, 6]``) is left out: two parallel
        branches of one width built in another order by the port would be paired by execution order
        (a reviewer's faithful port: a false DIVERGE at step 0); such outputs are paired by their
        layers (:meth:`by_layer_outputs`) or their first values (:meth:`by_output_values`), else stay
        unmatched, listed, for a ``--map``."""
        groups: dict[tuple[Any, ...], tuple[list[SeriesLike], list[SeriesLike]]] = {}
        for side, free, series in ((0, self.free_base, self.base), (1, self.free_cand, self.cand)):
            for s in series:
                key = (s.kind, s.name)
                if s.kind == kind and key in free and key not in self.expected and None not in tuple(s.shape):
                    groups.setdefault(tuple(s.shape), ([], []))[side].append(s)
        return groups

    def by_unique_shape(self) -> None:
        """Pair the only free tensor of a kind and shape on each side."""
        for kind in sorted({s.kind for s in self.base}):
            for bs, cs in self._free_groups(kind).values():
                if len(bs) == 1 and len(cs) == 1:
                    self.pair((bs[0].kind, bs[0].name), (cs[0].kind, cs[0].name), "fallback")

    def by_inferred_scope(self) -> None:
        """Pair free tensors under scopes already paired one-to-one (a kernel's bias follows it).

        Layers created in another order swap Keras names: once ``dense/kernel`` has been paired
        with ``dense_1/kernel`` by shape, ``dense/bias`` goes with ``dense_1/bias``, not with the
        other layer's bias of the same shape.
        """
        scope_pairs: dict[tuple[str, str], set[str]] = {}
        for m in self.matches:
            b_scope, c_scope = m.base[1].rpartition("/")[0], m.cand[1].rpartition("/")[0]
            if b_scope and c_scope:
                scope_pairs.setdefault((m.base[0], b_scope), set()).add(c_scope)
        owners: dict[tuple[str, str], set[str]] = {}
        for (kind, b_scope), c_scopes in scope_pairs.items():
            for c_scope in c_scopes:
                owners.setdefault((kind, c_scope), set()).add(b_scope)
        cand_by_name = {(s.kind, s.name): s for s in self.cand}
        for b in self.base:
            key = (b.kind, b.name)
            b_scope, _, leaf = b.name.rpartition("/")
            c_scopes = scope_pairs.get((b.kind, b_scope), set())
            if key not in self.free_base or len(c_scopes) != 1:
                continue
            (c_scope,) = c_scopes
            if owners.get((b.kind, c_scope)) != {b_scope}:
                continue  # not one-to-one
            c = cand_by_name.get((b.kind, f"{c_scope}/{leaf}"))
            if c is None or key in self.expected or (c.kind, c.name) in self.expected:
                continue  # declared: a --map of a cell's kernel leaves its bias, parametrised otherwise, alone
            if (c.kind, c.name) in self.free_cand and shapes_compatible(b.shape, c.shape):
                self.pair(key, (c.kind, c.name), "fallback")

    def by_first_values(self) -> list[str]:
        """Re-pair layers whose names were paired wrongly because they were created in another order.

        Keras names layers by creation order (``dense``, ``dense_1``): a port that creates two
        layers of the same shapes in another order than the baseline gets the names swapped, and
        the exact or canonical stage pairs them by name (or the fallback by creation order, when
        the names differ, as under a custom layer's scope). When the paired variables' (weights',
        and state's such as moving statistics) first-step statistics differ and another one-to-one
        pairing of those scopes makes every variable's first-step statistics identical (the
        initial weights a port copies from its baseline; one scope left over may start
        differently, as a wrong initializer would), the scopes are paired that way, every kind
        under them with them (weights, gradients, slots), and a tensor named after the layer
        itself (its output). Layers that start identical (batch norm's gamma 1, beta 0) are paired
        where they first differ instead (:meth:`_by_first_difference`). Anything less clear-cut is
        left as it was guessed. Returns a warning per re-paired scope, and per group of layers
        that start identical and could not be told apart.
        """
        base_of = {(s.kind, s.name): s for s in self.base}  # one dict per side: names may be equal
        cand_of = {(s.kind, s.name): s for s in self.cand}
        current = {m.base: m for m in self.matches}
        # Scope pairs of the guessed pairs of layer variables, and their variables by (kind, leaf).
        scopes: dict[tuple[str, str], dict[tuple[str, str], tuple[Key, Key]]] = {}
        own: set[str] = set()  # the scopes that are a top-level variable's own name
        for m in self.matches:
            # not a moving average named after a variable (EMA shadows): it follows its variable
            # (follow_variables), and one layer may have one where its same-shaped twin has none
            if m.base[0] in _LAYER_KINDS and m.how in _GUESSED and not (m.base[0] == "state" and variable_of(*m.base)):
                # a variable outside any scope (TF1's `get_variable("user_emb")`, `tf.Variable(name="w1")`)
                # is a layer of its own: its name is its scope, its tensors are named after it. Its
                # name, when both runs gave it, is no creation-order guess: a converter that swapped
                # two top-level variables `x` and `y` was re-paired by value and agreed. Alike but for
                # ':0' too: Keras 3 records a top-level `keras.Variable(name="x")` by its path, `x`
                if not _scope_name(m.base[1]) and _strip_output_index(m.base[1]) == _strip_output_index(m.cand[1]):
                    continue
                b_scope, c_scope = layer_scope(m.base[1]), layer_scope(m.cand[1])
                own.update(n for n in (m.base[1], m.cand[1]) if not _scope_name(n))
                leaf = (m.base[0], m.base[1][len(b_scope) + 1 :])
                scopes.setdefault((b_scope, c_scope), {})[leaf] = (m.base, m.cand)
        # A base scope paired with one candidate scope only (and the reverse), grouped by what
        # the scope holds: leaves and shapes.
        b_count: dict[str, int] = {}
        c_count: dict[str, int] = {}
        for b_scope, c_scope in scopes:
            b_count[b_scope] = b_count.get(b_scope, 0) + 1
            c_count[c_scope] = c_count.get(c_scope, 0) + 1
        groups: dict[tuple[Any, ...], list[tuple[str, str]]] = {}
        for (b_scope, c_scope), leaves in scopes.items():
            if b_count[b_scope] == 1 and c_count[c_scope] == 1:
                sig = tuple(sorted((leaf, tuple(base_of[b].shape)) for leaf, (b, _) in leaves.items()))
                groups.setdefault(sig, []).append((b_scope, c_scope))
        warnings: list[str] = []
        for pairs in groups.values():
            if len(pairs) < 2:
                continue
            c_of = {b: c for b, c in pairs}
            b_of = {c: b for b, c in pairs}

            # Each scope's variables as they start (leaf, first step, statistics there): scopes whose
            # starts are equal start identically (hashed: a group may hold hundreds of layers).
            start_b = {b: self.start(0, {leaf: base_of[k[0]] for leaf, k in scopes[(b, c)].items()}) for b, c in pairs}
            start_c = {c: self.start(1, {leaf: cand_of[k[1]] for leaf, k in scopes[(b, c)].items()}) for b, c in pairs}
            c_by_start: dict[Any, list[str]] = {}
            for _, c in pairs:
                if start_c[c] is not None:
                    c_by_start.setdefault(start_c[c], []).append(c)
            choice = {b: c_by_start.get(start_b[b], []) if start_b[b] is not None else [] for b, _ in pairs}
            if all(choice[b] == [c] for b, c in pairs):
                warnings += self._by_forward_order(c_of)
                continue  # the names (or creation order) paired them as their first values do, and only so
            step: Optional[int] = None
            singles = [cs[0] for cs in choice.values() if len(cs) == 1]
            if any(len(cs) > 1 for cs in choice.values()) or len(set(singles)) != len(singles):
                # Layers that start identical (batch norm), or that start like one port layer while
                # another port layer starts like none (a bug in one of two identical layers): told
                # apart where they first differ, any candidate allowed.
                everyone = [c for _, c in pairs]
                allowed = {b: everyone for b, _ in pairs}
                found = self._by_first_difference(pairs, allowed, b_of, current, base_of, cand_of)
                if found is None:  # never told apart clearly: leave the names' pairing, and say so
                    warnings.append(
                        f"layers {', '.join(sorted(b for b, _ in pairs))} cannot be told apart by how they start "
                        f"(identically), nor clearly where they first differ (their first {TELL_APART_STEPS} common "
                        "steps): they are paired by name (or creation order); if the port created them in another "
                        "order, pair them with --map"
                    )
                    continue
                chosen, step = found
            else:
                chosen = {b: cs[0] for b, cs in choice.items() if len(cs) == 1}
            left_b = [b for b, _ in pairs if b not in chosen]
            left_c = [c for _, c in pairs if c not in chosen.values()]
            if len(set(chosen.values())) != len(chosen):
                continue  # not one clear one-to-one pairing: leave the names' pairing
            if len(left_b) > 1 or len(left_c) != len(left_b):
                continue  # every layer of the group is paired, each with another: else two would share one
            if left_b:  # one layer starts differently (a port's wrong initializer): it pairs with the one left
                chosen[left_b[0]] = left_c[0]
            if self._against_forward_order(chosen, c_of) and self._outputs_agree(chosen) is False:
                crossed = ", ".join(
                    f"{b} starts like the port's {c}" for b, c in sorted(chosen.items()) if c != c_of[b]
                )
                warnings.append(
                    f"layers {', '.join(sorted(chosen))} start like other layers of the port than their names say "
                    f"({crossed}), but their outputs run in the order of their names and, paired by values, "
                    "differ: paired by name; weights loaded into the wrong layers (a checkpoint's name mapping) "
                    "diverge on those weights"
                )
                continue
            moves = self._repair_scopes(chosen, c_of, b_of, current)
            if moves is None:
                continue
            # with no output of theirs recorded, the order they ran in cannot tell a port that created them in
            # another order from one that loaded their weights crosswise (a helper's MobileNetV2 converter
            # sorted its names: the expand kernels re-paired and agreed, the divergence found downstream, and
            # this warning blamed Keras's numbering alone)
            unseen = _output_orders(self.base, chosen) is None or _output_orders(self.cand, chosen.values()) is None
            for b, new_c in moves:
                how = (
                    "by their first-step values"
                    if step is None
                    else f"by their values at step {step}, the first where such layers differ (they start identical)"
                )
                warnings.append(
                    f"paired {_scope_text(b, own)} with {_scope_text(new_c, own)} {how}, not by name or creation order: "
                    "Keras numbers layers of one type by creation order, and these have the same shapes"
                    + (
                        "; or the port loaded their weights into other layers than their counterparts (a converter's "
                        "name mapping crossed), a bug this pairing hides until a tensor downstream differs: no output "
                        "of theirs is recorded, whose order would tell the two apart; record them, or pair them by "
                        "name with --map"
                        if unseen
                        else ""
                    )
                )
        return warnings

    def _by_forward_order(self, c_of: dict[str, str]) -> list[str]:
        """A warning for layers paired by creation order whose first values agree with that pairing
        (``c_of``), but whose outputs ran in another order and, paired so, all differ at once: weights
        loaded into the wrong layers look like this (the first values follow the weights, not the
        layers), and so does a difference upstream of them all. A new user's port copied a wide
        tower's kernel into the deep tower's same-shaped layer and the reverse, and was told of the
        wide output against the deep one with no word of the weights. Only a warning: re-pairing by
        the order the outputs ran made a review's port, whose input alone differed, a false weight
        divergence. A faithful port whose independent branches run in another order has outputs that
        agree when paired by values: no warning."""
        order_b = _output_orders(self.base, c_of)
        order_c = _output_orders(self.cand, c_of.values())
        if order_b is None or order_c is None:
            return []
        forward = dict(zip(sorted(c_of, key=order_b.__getitem__), sorted(c_of.values(), key=order_c.__getitem__)))
        if forward == c_of or self._outputs_agree(c_of) is not False:
            return []
        crossed = ", ".join(
            f"{b} (the port's {c_of[b]}, which ran where its {forward[b]} ran)"
            for b in sorted(c_of)
            if forward[b] != c_of[b]
        )
        return [
            f"layers {crossed} start like the layers they are paired with, but their outputs ran in another order "
            "and, paired so, all differ at their first step: weights loaded into the wrong layers (a checkpoint's "
            "or a copy's mapping) would look like this, as would a difference upstream of them all; to compare "
            "them by the order they ran, pair them with --map"
        ]

    def _against_forward_order(self, chosen: dict[str, str], c_of: dict[str, str]) -> bool:
        """Whether pairing the base scopes as ``chosen`` (by values) crosses the order in which
        their outputs ran while pairing them as ``c_of`` (by name) keeps it: each scope's output
        named after it (``rec.activation("dense_1", ...)``, instrument's layer names) on both
        sides. A port created in another order runs its layers where their values say; one whose
        checkpoint loaded dense_1's weights into dense_2 runs them where their names say, and
        re-pairing by values hid the swapped weights behind an output (a new user's, told "every
        weight agrees"). Without outputs on both sides, no evidence: False."""
        order_b = _output_orders(self.base, chosen)
        order_c = _output_orders(self.cand, {*chosen.values(), *(c_of[b] for b in chosen)})
        if order_b is None or order_c is None:
            return False
        ranked = sorted(chosen, key=order_b.__getitem__)

        def keeps_order(pairing: dict[str, str]) -> bool:
            runs = [order_c[pairing[b]] for b in ranked]
            return all(x < y for x, y in zip(runs, runs[1:]))

        return keeps_order(c_of) and not keeps_order(chosen)

    def _outputs_agree(self, chosen: dict[str, str]) -> Optional[bool]:
        """Whether pairing the layers as ``chosen`` (base scope -> candidate scope) makes some of
        the outputs named after them agree, each at its own first common step (statistics within
        1e-3 of their scale); None when no such output is known. Independent branches run in
        either order: a review's faithful two-tower port, created in the other order, ran its
        towers in the order of their names, and only its outputs, which agree when paired by values,
        showed it faithful; with a real bug in one tower the other still agrees, which is evidence
        enough (the next review's). Weights loaded crosswise leave every output apart."""
        named = [_outputs_named(self.base), _outputs_named(self.cand)]
        found: Optional[bool] = None
        for b, c in chosen.items():
            ours, theirs = _scope_outputs(named[0], b, chosen), _scope_outputs(named[1], c, chosen.values())
            if len(ours) != 1 or len(theirs) != 1:
                continue
            steps = self._first_common_steps([(ours[0], theirs[0])])  # its own: one may start later
            if not steps:
                continue
            (d,) = _distances({0: (self.row_at(0, ours[0], steps[0]), self.row_at(1, theirs[0], steps[0]))}).values()
            if d is None:
                continue
            if d <= 1e-3:
                return True
            found = False
        return found

    def _by_first_difference(
        self,
        pairs: list[tuple[str, str]],
        choice: dict[str, list[str]],
        b_of: dict[str, str],
        current: dict[Key, Match],
        base_of: dict[Key, Any],
        cand_of: dict[Key, Any],
    ) -> Optional[tuple[dict[str, str], int]]:
        """Layers that first values cannot pair, paired where they first differ. Each tensor under a
        base scope (weights, gradients, state, slots, as guessed) is set against the same-named one
        under each candidate scope it may pair with (``choice``), at each of the first
        :data:`TELL_APART_STEPS` steps both runs logged. A tensor and step whose one-to-one pairing is
        :data:`TELL_APART_MARGIN` times closer than any other for every layer is evidence; one
        that is not (a port's bug there spreads to every layer, e.g. through the gradients) is
        none. Returns (base scope -> candidate scope, first step of evidence) when there is
        evidence and all of it agrees, else None."""
        under: dict[str, list[tuple[Key, str]]] = {b: [] for b, _ in pairs}
        for key, m in current.items():
            own = key[1] in under and key[0] not in _OUTPUT_KINDS and any((k, key[1]) in current for k in _LAYER_KINDS)
            b_scope = key[1] if own else _scope_name(key[1])  # a scope-less variable's own tensors
            if b_scope in under and m.how in _GUESSED:
                under[b_scope].append((key, key[1][len(b_scope) :]))
        # (kind, name under the scope) -> (base scope, candidate scope) -> the two series
        compared: dict[tuple[str, str], dict[tuple[str, str], tuple[Any, Any]]] = {}
        for b_scope, cands in choice.items():
            for c_scope in cands:
                donor = b_of[c_scope]  # the base scope the names paired with c_scope
                for key, rel in under[b_scope]:
                    other = current.get((key[0], donor + rel))
                    if other is not None and other.how in _GUESSED:
                        compared.setdefault((key[0], rel), {})[(b_scope, c_scope)] = (base_of[key], cand_of[other.cand])
        hypotheses = len([c for cands in choice.values() for c in cands])
        found: list[tuple[dict[str, str], int]] = []
        for step in self._first_common_steps([bc for by in compared.values() for bc in by.values()]):
            for _, by in sorted(compared.items()):
                if len(by) != hypotheses:
                    continue  # not under every candidate scope: no fair comparison
                dist = _distances(
                    {scopes: (self.row_at(0, b, step), self.row_at(1, c, step)) for scopes, (b, c) in by.items()}
                )
                known = [d for d in dist.values() if d is not None]
                if not known or max(known) == 0:
                    continue  # not logged here, or still identical in every layer
                chosen = _clear_assignment(dist)
                if chosen is not None:
                    found.append((chosen, step))
        if not found or any(chosen != found[0][0] for chosen, _ in found):
            return None
        return found[0]

    def _repair_scopes(
        self, new_c: dict[str, str], c_of: dict[str, str], b_of: dict[str, str], current: dict[Key, Match]
    ) -> Optional[list[tuple[str, str]]]:
        """Move every match under the base scopes of ``new_c`` to the partner that the same relative
        name has under the new candidate scope; None (nothing moved) if one has no such partner.
        A gradient, slot or moving average without one is left to :meth:`follow_variables`, which
        pairs it as its variable is paired: two same-shaped layers under different optimizers, or
        with an EMA of one only, have no namesakes, and a new user's port that created them in
        another order was left paired crosswise, silently (a false DIVERGE at step 0)."""
        plan: list[tuple[Match, Key]] = []
        for b_scope, c_scope in new_c.items():
            if c_scope == c_of[b_scope]:
                continue
            donor = b_of[c_scope]  # the base scope the names paired with c_scope
            for key, m in current.items():
                if key[1] == b_scope:  # named after the layer itself (its output, as instrument_layer names it)
                    other = current.get((key[0], donor))
                    if m.how in _GUESSED and other is not None and other.how in _GUESSED:
                        plan.append((m, other.cand))
                    continue
                if not key[1].startswith(b_scope + "/"):
                    continue
                if m.how not in _GUESSED:
                    return None
                rel = key[1][len(b_scope) + 1 :]
                other = current.get((key[0], f"{donor}/{rel}"))
                if other is None or other.how not in _GUESSED:
                    if key[0] in ("grad", "slot", "state") and variable_of(*key) is not None:
                        continue  # named after a variable: it follows it
                    return None
                plan.append((m, other.cand))
        if not plan:
            return None
        for m, cand in plan:
            self.matches[self.matches.index(m)] = Match(m.base, cand, "first values")
        return [(b, c) for b, c in new_c.items() if c != c_of[b]]

    def _repair(
        self,
        b: Key,
        c: Key,
        how: str,
        displaced: tuple[Optional[Match], ...],
        by_base: dict[Key, Match],
        by_cand: dict[Key, Match],
    ) -> None:
        """Pair ``b`` with ``c``, freeing the partners of the ``displaced`` matches; the lookups
        ``by_base``/``by_cand`` (key -> its match) are kept current."""
        for old in displaced:
            if old is not None and old in self.matches:
                self._unpair([old])
                by_base.pop(old.base, None)
                by_cand.pop(old.cand, None)
        self.pair(b, c, how)
        by_base[b] = by_cand[c] = self.matches[-1]

    def _unpair(self, matches: Iterable[Match]) -> None:
        """Undo ``matches``: their tensors are free again on both sides."""
        for m in matches:
            self.matches.remove(m)
            self.free_base.add(m.base)
            self.free_cand.add(m.cand)

    def follow_variables(self) -> None:
        """Pair each gradient, slot and moving average as its variable is paired (gradients are named
        after their variable, slots and averages ``<variable>/<role>`` in any family's spelling).

        Guessed stages pair them on their own, by name, shape and order, and re-paired layers moved
        them by the partner their scope's namesake had: a new user's faithful GAN port (generator and
        discriminator first layers of one shape, two Adams) had its weights paired right by their first
        values and its gradients (or its slots, paired by recording order) crosswise: a false DIVERGE at
        step 0. A pairing the user mapped is kept; one whose variable's partner has no tensor of that
        kind and role named after it, or more than one, is left as it was."""
        guessed = _GUESSED | {"first values"}
        partner = {
            _strip_output_index(m.base[1]): _strip_output_index(m.cand[1])
            for m in self.matches
            if m.base[0] == "weight"
        }
        if not partner:
            return

        named: dict[tuple[str, str, str], list[Key]] = {}
        centered = [centered_rmsprop(s.name for s in side if s.kind == "slot") for side in (self.base, self.cand)]
        for s in self.cand:
            if s.kind in ("grad", "slot", "state"):
                found = variable_of(s.kind, s.name, centered[1])
                if found is not None:
                    named.setdefault((s.kind, *found), []).append((s.kind, s.name))
        by_base = {m.base: m for m in self.matches}
        by_cand = {m.cand: m for m in self.matches}
        for s in self.base:
            found = variable_of(s.kind, s.name, centered[0]) if s.kind in ("grad", "slot", "state") else None
            if found is None or found[0] not in partner:
                continue
            targets = named.get((s.kind, partner[found[0]], found[1]), [])
            if len(targets) != 1:
                continue
            b, c = (s.kind, s.name), targets[0]
            now, taken = by_base.get(b), by_cand.get(c)
            if (now is not None and (now.cand == c or now.how not in guessed)) or (
                taken is not None and taken.how not in guessed
            ):
                continue
            self._repair(b, c, "variable", (now, taken), by_base, by_cand)

    def parametrised_otherwise(self) -> set[str]:
        """Scopes named alike in both runs whose variables are named otherwise and, where named
        alike, some of other sizes: one layer parametrised two ways. TF1's ``dynamic_rnn(...,
        scope="lstm")`` names its ``LSTMCell``'s ``lstm/lstm_cell/kernel:0`` ``[in + units, 4 units]``
        and ``bias:0``, Keras's ``LSTM(name="lstm")`` its kernel ``[in, 4 units]``, a
        ``recurrent_kernel`` and a bias: pairing the identical names (the last stage) made the
        kernels a shape divergence and the biases (gates in another order, the forget bias folded
        in) a value one, a faithful port's false DIVERGE at step 0 that ``--allow-unmatched
        '*lstm_cell*'`` could not lift. A layer of another width holds the same names: still a shape
        divergence."""
        leaves: list[dict[str, dict[str, tuple[Optional[int], ...]]]] = [{}, {}]
        for side, series in ((0, self.base), (1, self.cand)):
            for s in series:
                if s.kind in _LAYER_KINDS and _scope_name(s.name):
                    scope, _, leaf = _strip_output_index(s.name).rpartition("/")
                    leaves[side].setdefault(scope, {})[leaf] = tuple(s.shape)
        found = set()
        for scope, b_leaves in leaves[0].items():
            c_leaves = leaves[1].get(scope)
            if not c_leaves or set(b_leaves) == set(c_leaves):
                continue
            if any(not same_elements(b_leaves[k], c_leaves[k]) for k in set(b_leaves) & set(c_leaves)):
                found.add(scope)
        return found

    def unpair_unpaired_variables(self, scopes: set[str]) -> None:
        """Unpair the gradients and slots, named after a variable under ``scopes``
        (:meth:`parametrised_otherwise`), whose variables were left unpaired (but a ``--map``'s):
        Keras's ``m/lstm/lstm_cell/bias`` and TF1's ``lstm/lstm_cell/bias/Adam:0`` share a canonical
        name, and a faithful port's unpaired biases had their Adam slots compared (a false DIVERGE at
        step 1 under ``--allow-unmatched '*lstm_cell*'``)."""
        if not scopes:
            return
        paired_vars = {
            (_strip_output_index(m.base[1]), _strip_output_index(m.cand[1]))
            for m in self.matches
            if m.base[0] in _LAYER_KINDS
        }
        drop = []
        for m in self.matches:
            if m.how == "map" or m.base[0] not in ("grad", "slot"):
                continue
            b, c = variable_of(*m.base), variable_of(*m.cand)
            if b is None or c is None or (b[0], c[0]) in paired_vars:
                continue
            if _scope_name(b[0]) in scopes or _scope_name(c[0]) in scopes:
                drop.append(m)
        self._unpair(drop)

    def unpair_partial_layers(self) -> list[str]:
        """Unpair variables paired by shape alone whose layers' other variables stayed unmatched on
        both sides, with their gradients and slots: such layers are parametrised differently. A TF1
        ``LSTMCell`` holds one kernel ``[in + units, 4 units]`` and a bias, Keras ``LSTM`` a kernel,
        a recurrent kernel and a bias in another gate order with the forget bias folded in: the two
        biases share a shape and nothing else, and comparing them was a false divergence at step 0
        of a faithful port. Returns a warning per unpaired layer (``--map`` pairs them anyway)."""
        free_b: dict[tuple[str, str], int] = {}
        free_c: dict[tuple[str, str], int] = {}
        for free, counts in ((self.free_base, free_b), (self.free_cand, free_c)):
            for kind, name in free:
                if kind in _LAYER_KINDS and _scope_name(name):
                    counts[(kind, _scope_name(name))] = counts.get((kind, _scope_name(name)), 0) + 1
        layers: set[tuple[str, str]] = set()
        for m in self.matches:
            if m.base[0] in _LAYER_KINDS and m.how == "fallback":
                b_scope, c_scope = _scope_name(m.base[1]), _scope_name(m.cand[1])
                if b_scope and c_scope and free_b.get((m.base[0], b_scope)) and free_c.get((m.cand[0], c_scope)):
                    layers.add((b_scope, c_scope))
        if not layers:
            return []
        drop = []
        for m in self.matches:
            kind = m.base[0]
            if kind in _LAYER_KINDS and m.how != "fallback":
                continue  # a variable paired by shape alone goes...
            if kind not in _LAYER_KINDS and (kind not in ("grad", "slot") or m.how == "map"):
                continue  # ...with its gradient and slots, however they were paired but by --map
            b_var, c_var = m.base[1], m.cand[1]  # a gradient is named after its variable
            if m.base[0] == "slot":  # <variable>/<role>
                b_var, c_var = _scope_name(slot_canonical(b_var)), _scope_name(slot_canonical(c_var))
            if (_scope_name(b_var), _scope_name(c_var)) in layers:
                drop.append(m)
        self._unpair(drop)
        warnings = []
        for b, c in sorted(layers):
            resized = self._resized(b, c)
            if resized:
                warnings.append(
                    f"{b}/* and {c}/* share variables of the same shapes, but {resized}: the same variable "
                    "of another size, so the layer's input or width differs (an earlier output of another "
                    "shape, such as a padding, a stride or a flatten of other dimensions, or another layer "
                    "width): left unpaired; a real difference, not another parametrisation, so find where "
                    "the shapes part before declaring anything unmatched"
                )
                continue
            warnings.append(
                f"{b}/* and {c}/* share variables of the same shapes, but their other variables could not be "
                "paired (another parametrisation, such as TF1's LSTMCell against Keras LSTM, or a variable one side "
                "uses twice, tied, where the other keeps two): left unpaired; "
                "pair them with --map if they hold the same values, or declare them with --allow-unmatched "
                f"'*{b.rpartition('/')[2] or b}*' if they are parametrised otherwise (their layer's output is still compared)"
            )
        return warnings

    def _resized(self, b_scope: str, c_scope: str) -> str:
        """The unpaired weights of two layers holding the same variables by leaf name, of which some
        have the same rank and other shapes, in words ("kernel is [1352, 10] in one run and [1568, 10] in the other"), else "". A new user's
        port with ``padding="same"`` against TF1's valid one changed its dense kernel's input size; the
        warning called the two layers another parametrisation and offered ``--allow-unmatched``,
        which silences the layer the shapes part before."""
        leaves: list[dict[str, tuple[Any, ...]]] = []
        for series, free, scope in ((self.base, self.free_base, b_scope), (self.cand, self.free_cand, c_scope)):
            leaves.append(
                {
                    s.name.rpartition("/")[2].removesuffix(":0"): tuple(s.shape)
                    for s in series
                    if s.kind == "weight" and (s.kind, s.name) in free and _scope_name(s.name) == scope
                }
            )
        if set(leaves[0]) != set(leaves[1]):  # other variables: another parametrisation (LSTMCell's kernel)
            return ""
        found = [
            f"{leaf} is {list(leaves[0][leaf])} in one run and {list(leaves[1][leaf])} in the other"
            for leaf in sorted(leaves[0])
            if len(leaves[0][leaf]) == len(leaves[1][leaf]) and leaves[0][leaf] != leaves[1][leaf]
        ]
        return "; ".join(found)

    def by_layer_outputs(self) -> list[str]:
        """Pair a layer's output (an ``activation`` or ``output`` named after its layer:
        ``rec.activation(layer.name, ...)``, ``instrument(layers=...)``, ``forward_pass``'s
        ``inference/`` and ``training/`` names) with the output of the layer its variables are
        paired with. Keras numbers layers per process (a notebook that built a model before names
        the port's layers ``dense_2``, ``dense_3``): renumbering renames scopes, not an output's own
        name, and an output's name may equal another layer's on the other side, which paired
        outputs of different layers (or moved them with the wrong layer when the first values re-paired
        the layers). Every pair of an output is corrected so but a ``map`` one."""
        layer_of: list[dict[str, str]] = [{}, {}]  # per side: a layer's own name -> its scope
        scopes: list[set[str]] = [set(), set()]  # per side: every layer's scope
        for side, series in ((0, self.base), (1, self.cand)):
            last: dict[str, set[str]] = {}
            for s in series:
                if s.kind in _LAYER_KINDS and _scope_name(s.name):
                    scope = _scope_name(s.name)
                    scopes[side].add(scope)
                    last.setdefault(scope.rpartition("/")[2], set()).add(scope)
            layer_of[side] = {name: next(iter(scopes)) for name, scopes in last.items() if len(scopes) == 1}
        own = [{scope.rpartition("/")[2] for scope in scopes[side]} for side in (0, 1)]
        # a variable of no scope names a layer of its own too: TF1's embedding table is a bare
        # get_variable("tok_emb", ...), its lookup recorded as "tok_emb" beside Keras's Embedding of that
        # name, and a helper's faithful port was warned its outputs were named after the other run's layers
        bare = [
            {s.name.removesuffix(":0") for s in series if s.kind in _LAYER_KINDS and not _scope_name(s.name)}
            for series in (self.base, self.cand)
        ]
        for side, series in ((0, self.base), (1, self.cand)):
            # one run's outputs all named after the other run's layers, one naming none of its own: the
            # user named them alike on both sides (the migration guide's incremental port, a Keras layer
            # among tf.compat.v1 ones, renumbers the v1 layers after it, not the outputs' names), so an
            # output's name says nothing of which of its own layers output it: they stay paired by name
            named = {s.name.rpartition("/")[2] for s in series if s.kind in _OUTPUT_KINDS} & (own[0] | own[1])
            if named and named <= own[1 - side] and not named <= own[side] | bare[side]:
                stray = ", ".join(sorted(named - own[side] - bare[side]))
                return [
                    f"the {('baseline', 'candidate')[side]}'s layer outputs are named after the "
                    f"{('candidate', 'baseline')[side]}'s layers ({stray} names no layer of its own): paired by "
                    "their names, not with the outputs of the layers their variables are paired with"
                ]

        def output_layer(side: int, name: str) -> Optional[tuple[str, str]]:
            """(prefix, the layer's scope) of an output named after its layer: its whole name when
            that is a scope (TF1's ``variable_scope("wide")``: ``wide/dense``, beside ``deep/dense``),
            or after a first component (a mode); else its last component, a layer's own name."""
            if name in scopes[side]:
                return "", name
            first, _, rest = name.partition("/")
            if rest in scopes[side]:
                return first, rest
            prefix, _, own = name.rpartition("/")
            return (prefix, layer_of[side][own]) if own in layer_of[side] else None

        partners: dict[str, set[str]] = {}
        owners: dict[str, set[str]] = {}
        for m in self.matches:
            if m.base[0] in _LAYER_KINDS and _scope_name(m.base[1]) and _scope_name(m.cand[1]):
                partners.setdefault(_scope_name(m.base[1]), set()).add(_scope_name(m.cand[1]))
                owners.setdefault(_scope_name(m.cand[1]), set()).add(_scope_name(m.base[1]))
        layer = {b: next(iter(cs)) for b, cs in partners.items() if len(cs) == 1 and owners[next(iter(cs))] == {b}}
        # a layer pairing that no other layer could take: the user's map, values that told them apart,
        # or variable shapes no other layer of either run has; only such a pairing moves an output to
        # a partner of another shape (two convs of one kernel shape that nothing told apart stay as
        # guessed, and their outputs, of other strides, with the partner of their own shape)
        signature: list[dict[str, tuple[str, ...]]] = [{}, {}]
        for side, series in ((0, self.base), (1, self.cand)):
            shapes_of: dict[str, list[tuple[Any, ...]]] = {}
            for s in series:
                if s.kind == "weight" and _scope_name(s.name):
                    shapes_of.setdefault(_scope_name(s.name), []).append(tuple(s.shape))
            signature[side] = {
                scope: tuple(sorted(str(shape) for shape in shapes)) for scope, shapes in shapes_of.items()
            }
        count = [list(sig.values()) for sig in signature]
        settled = {
            _scope_name(m.base[1])
            for m in self.matches
            if m.how in ("map", "first values") and m.base[0] in _LAYER_KINDS
        }

        def certain(b_scope: str, c_scope: str) -> bool:
            if b_scope in settled:
                return True
            sb, sc = signature[0].get(b_scope), signature[1].get(c_scope)
            return sb is not None and sc is not None and count[0].count(sb) == 1 and count[1].count(sc) == 1

        cand_named: dict[tuple[str, str, str], list[Key]] = {}  # (kind, prefix, scope) -> outputs
        for s in self.cand:
            found_c = output_layer(1, s.name) if s.kind in _OUTPUT_KINDS else None
            if found_c is not None:
                cand_named.setdefault((s.kind, *found_c), []).append((s.kind, s.name))
        shapes_b = {(s.kind, s.name): tuple(s.shape) for s in self.base}  # one per side: a name both
        shapes_c = {(s.kind, s.name): tuple(s.shape) for s in self.cand}  # runs have may differ in shape
        current_b = {m.base: m for m in self.matches}
        current_c = {m.cand: m for m in self.matches}
        series_of = [{(s.kind, s.name): s for s in self.base}, {(s.kind, s.name): s for s in self.cand}]

        def agrees(b_key: Key, c_key: Key) -> Optional[bool]:
            """Whether two outputs agree at their first common step (statistics within 1e-3 of their
            scale); None when either is not logged in the first steps scanned."""
            pair = (series_of[0].get(b_key), series_of[1].get(c_key))
            steps = self._first_common_steps([pair]) if None not in pair else []
            if not steps:
                return None
            (d,) = _distances({0: (self.row_at(0, pair[0], steps[0]), self.row_at(1, pair[1], steps[0]))}).values()
            return None if d is None else d <= 1e-3

        moved: list[str] = []
        kept: list[str] = []
        for s in self.base:
            found_b = output_layer(0, s.name) if s.kind in _OUTPUT_KINDS else None
            if found_b is None or found_b[1] not in layer:
                continue
            prefix, b_scope = found_b
            found = cand_named.get((s.kind, prefix, layer[b_scope]), [])
            if len(found) != 1:
                continue
            key, target = (s.kind, s.name), found[0]
            now, taken = current_b.get(key), current_c.get(target)
            if now is not None and now.cand == target:
                continue
            if (now is not None and now.how == "map") or (taken is not None and taken.how == "map"):
                continue  # the user's word (anything else here was guessed, the first values' moves too)
            # of any shape when the layers' pairing is certain: outputs of other shapes are then that
            # layer's shape divergence (a new user's stride moved to the wrong conv was reported on another)
            if not shapes_compatible(shapes_b[key], shapes_c[target]) and not certain(b_scope, layer[b_scope]):
                continue
            # outputs the user named alike on both sides, agreeing so where the layers' would not: named
            # after the baseline's layers, not the port's own (the migration guide's incremental port: a
            # Keras layer among tf.compat.v1 ones renumbers the v1 layers after it, and a faithful port's
            # outputs were moved onto their neighbours', a false DIVERGE at step 0)
            by_name = [m for m in (now, taken) if m is not None and m.how in ("exact", "canonical")]
            if any(agrees(m.base, m.cand) for m in by_name) and not agrees(key, target):
                kept.extend(f"{m.base[0]}/{m.base[1]} with {m.cand[1]}" for m in by_name)
                continue
            self._repair(key, target, "layer", (now, taken), current_b, current_c)
            if now is not None:
                moved.append(f"{s.kind}/{s.name} with {target[1]} (not {now.cand[1]})")
        warnings = []
        if kept:
            warnings.append(
                "kept layer outputs paired by their names, which agree at their first step where the outputs of "
                "the layers their variables are paired with do not (outputs named after the other run's layers): "
                + ", ".join(dict.fromkeys(kept))
            )
        if moved:
            warnings.append(
                "paired layer outputs with the outputs of the layers their variables are paired with, not by name: "
                + ", ".join(moved)
            )
        return warnings

    def by_output_values(self) -> list[str]:
        """Pair outputs of one shape by their values at their first common steps, where only their
        order paired them, or nothing did. Outputs a user names (``branch_a``) are paired by
        shape and execution order (``fallback``), and a port that builds two parallel branches of one
        width in another order crossed them (a reviewer's false DIVERGE at step 0); with a ``None``
        dimension they stayed unmatched. A faithful port's outputs differ by rounding, two branches
        by their own data: when every output's nearest partner is
        :data:`TELL_APART_MARGIN` times closer than any other (:func:`_clear_rows`), or every output's
        but one (a port's bug there: it takes the one left over), at the first of the first
        :data:`TELL_APART_STEPS` common steps where they differ (outputs of zero-initialised layers
        differ from step 1), the group is paired that way (``how: "first values"``, with a warning
        when it moves a pair). Anything less clear-cut is left as it was."""
        groups: list[tuple[list[Any], list[Any], list[Match]]] = []
        base_of = {(s.kind, s.name): s for s in self.base}
        cand_of = {(s.kind, s.name): s for s in self.cand}
        guessed: dict[tuple[str, tuple[Any, ...]], list[Match]] = {}
        for m in self.matches:
            if m.base[0] in _OUTPUT_KINDS and m.how == "fallback":
                guessed.setdefault((m.base[0], tuple(base_of[m.base].shape)), []).append(m)
        for ms in guessed.values():
            if len(ms) > 1:
                groups.append(([base_of[m.base] for m in ms], [cand_of[m.cand] for m in ms], ms))
        for kind in sorted(_OUTPUT_KINDS):
            unknown: dict[tuple[Any, ...], tuple[list[Any], list[Any]]] = {}
            for side, free, series in ((0, self.free_base, self.base), (1, self.free_cand, self.cand)):
                for s in series:
                    if s.kind == kind and (s.kind, s.name) in free and None in tuple(s.shape):
                        unknown.setdefault(tuple(s.shape), ([], []))[side].append(s)
            groups += [(bs, cs, []) for bs, cs in unknown.values() if len(bs) == len(cs) > 1]
        warnings = []
        for bs, cs, current in groups:
            found = None
            for step in self._first_common_steps([(b, c) for b in bs for c in cs]):
                dist = _distances(
                    {(b.name, c.name): (self.row_at(0, b, step), self.row_at(1, c, step)) for b in bs for c in cs}
                )
                chosen = _clear_rows(dist)
                if len(chosen) == len(bs) - 1:  # one output unclear (a bug there): the one left over
                    (b_left,) = {b.name for b in bs} - set(chosen)
                    (c_left,) = {c.name for c in cs} - set(chosen.values())
                    chosen[b_left] = c_left
                if len(chosen) == len(bs):
                    found = (chosen, step)
                    break  # else a step where they do not differ yet (zero-initialised): the next one
            if found is None:
                continue
            chosen, step = found
            if current and all(chosen[m.base[1]] == m.cand[1] for m in current):
                continue  # the order paired them as their values do
            for m in current:
                self.matches.remove(m)
            for b in bs:
                self.pair((b.kind, b.name), (b.kind, chosen[b.name]), "first values")
            warnings.append(
                f"paired {', '.join(f'{b.kind}/{b.name} with {chosen[b.name]}' for b in bs)} by their values at step "
                f"{step} (outputs of one shape, {'not by execution order' if current else 'unmatched by name'})"
            )
        return warnings

    def by_sole_compatible_shape(self) -> None:
        """Pair a free tensor whose shape has a dimension the graph does not know with the one free
        tensor of its kind on the other side whose shape fits it, when each is the other's only fit.

        Last of the stages: TF1's ``rec.activation("hidden", h)`` on ``placeholder([None, 6])`` against
        a Keras port's layer output (``dense``, ``[8, 5]`` under ``fit``) shares no name and no static
        shape, and stayed unmatched (a false structure DIVERGE on the README's own usage). Two
        parallel branches of one width have two fits each, so they stay as they were."""
        for kind in sorted({s.kind for s in self.base}):
            bs, cs = (
                [
                    s
                    for s in side
                    if s.kind == kind and (s.kind, s.name) in free and (s.kind, s.name) not in self.expected
                ]
                for side, free in ((self.base, self.free_base), (self.cand, self.free_cand))
            )
            fits = {
                (b.name, c.name)
                for b in bs
                for c in cs
                if (None in tuple(b.shape) or None in tuple(c.shape)) and _fits(tuple(b.shape), tuple(c.shape))
            }
            by_b: dict[str, list[str]] = {}
            by_c: dict[str, list[str]] = {}
            for b_name, c_name in fits:
                by_b.setdefault(b_name, []).append(c_name)
                by_c.setdefault(c_name, []).append(b_name)
            for b_name, c_names in sorted(by_b.items()):
                if len(c_names) == 1 and len(by_c[c_names[0]]) == 1:
                    self.pair((kind, b_name), (kind, c_names[0]), "fallback")

    def still_free(self, cand_keys: list[Key]) -> list[Key]:
        """Those of ``cand_keys`` no stage has paired."""
        return [k for k in cand_keys if k in self.free_cand]

    def by_kind_shape_order(self) -> dict[Key, list[Key]]:
        """Per kind and shape, pair the k-th free tensors in execution order when the counts agree.

        Returns, for each baseline tensor left unmatched, the free candidate tensors of its kind
        and shape (its possible partners), so the report can list them.
        """
        candidates: dict[Key, list[Key]] = {}
        centered = [centered_rmsprop(s.name for s in side if s.kind == "slot") for side in (self.base, self.cand)]
        for kind in sorted({s.kind for s in self.base}):
            for bs, cs in self._free_groups(kind).values():
                if len(bs) == len(cs):
                    for b, c in _by_leaf_then_order(bs, cs):
                        self.pair((b.kind, b.name), (c.kind, c.name), "fallback")
                else:
                    for b in bs:
                        candidates[(b.kind, b.name)] = [(c.kind, c.name) for c in cs if _same_role(b, c, centered)]
        return candidates


def _by_leaf_then_order(bs: list[SeriesLike], cs: list[SeriesLike]) -> list[tuple[SeriesLike, SeriesLike]]:
    """Equally many free tensors of one kind and shape per side, paired: the k-th of each leaf
    name (``gamma``, ``beta``) with the k-th of the same leaf when each side holds every leaf as
    often, else the k-th with the k-th in execution order. BERT's layer norm creates ``beta``
    before ``gamma`` and Keras's ``gamma`` first: under scopes named otherwise, a faithful port
    was paired crosswise, a false DIVERGE at step 0 (gamma starts at 1, beta at 0)."""

    def by_leaf(side: list[SeriesLike]) -> dict[str, list[SeriesLike]]:
        leaves: dict[str, list[SeriesLike]] = {}
        for s in side:
            leaves.setdefault(s.name.rpartition("/")[2].removesuffix(":0"), []).append(s)
        return leaves

    lb, lc = by_leaf(bs), by_leaf(cs)
    if {k: len(v) for k, v in lb.items()} != {k: len(v) for k, v in lc.items()}:
        return list(zip(bs, cs))
    return [pair for leaf, group in lb.items() for pair in zip(group, lc[leaf])]


def _same_role(b: SeriesLike, c: SeriesLike, centered: Sequence[frozenset[str]]) -> bool:
    """A slot's possible partner holds the same role when both roles are known (a new user's
    ``Adam_1``, the second moment, was listed as ambiguous with Keras's ``m/`` slots beside the
    ``v/`` ones); any other tensor, or an unknown role, may be. ``centered``: each run's
    :func:`centered_rmsprop` (TF1's centered ``RMSProp_1`` is the mean gradient, not a momentum)."""
    if b.kind != "slot":
        return True
    roles = []
    for s, side in zip((b, c), centered):
        role = slot_canonical(_strip_output_index(s.name), side).rpartition("/")[2]
        if role not in _KNOWN_ROLES:  # a spelling of no known role
            return True
        roles.append(role)
    return roles[0] == roles[1]


#: Every slot role a spelling canonicalises to (:data:`SLOT_ROLES`, and centered RMSProp's mg).
_KNOWN_ROLES = frozenset({*SLOT_ROLES.values(), "mg"})


def _fits(a: tuple[Optional[int], ...], b: tuple[Optional[int], ...]) -> bool:
    """:func:`shapes_compatible` of the same rank: there ``(None,)`` may be an unknown rank and fits
    any shape, which says too little to pair on."""
    return len(a) == len(b) > 0 and shapes_compatible(a, b)


def _distances(rows: dict[Any, tuple[Optional[np.ndarray], Optional[np.ndarray]]]) -> dict[Any, Optional[float]]:
    """How far apart each pair of statistics rows is (None where one is missing), in units of the
    tensor's scale: counts as a fraction of the size, moments (min, max, mean, std, l2 per element)
    as a fraction of the largest |element| of either. 0 when identical; inf when dtype, rank or size
    differ, or NaN sits on one side only. One array computation for all the pairs."""
    keys = [k for k, (a, b) in rows.items() if a is not None and b is not None]
    found: dict[Any, Optional[float]] = {k: None for k in rows}
    if not keys:
        return found
    a = np.stack([rows[k][0] for k in keys])  # type: ignore[misc]
    b = np.stack([rows[k][1] for k in keys])  # type: ignore[misc]
    i = metadata.STAT_INDEX
    size = np.maximum(a[:, i["size"]], 1.0)
    far = np.abs(a[:, _COUNTS] - b[:, _COUNTS]).max(axis=1) / size
    ma, mb = a[:, _MOMENTS].copy(), b[:, _MOMENTS].copy()
    ma[:, -1] /= np.sqrt(size)  # l2 per element: on the scale of the elements
    mb[:, -1] /= np.sqrt(size)
    nan_a, nan_b = np.isnan(ma), np.isnan(mb)
    diff = np.where(nan_a & nan_b, 0.0, np.abs(ma - mb)).max(axis=1)
    scale = np.fmax(np.abs(ma[:, :2]), np.abs(mb[:, :2])).max(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        moments = np.where(diff == 0, 0.0, diff / scale)
    dist = np.maximum(far, moments)
    # dtype, rank or size differ, or NaN on one side only
    other = (a[:, _KIND] != b[:, _KIND]).any(axis=1) | (nan_a != nan_b).any(axis=1)
    dist[other | np.isnan(dist)] = np.inf
    for k, d in zip(keys, dist):
        found[k] = float(d)
    return found


_KIND = metadata.field_span(("dtype", "rank", "size"))
_COUNTS = metadata.field_span(("neg_inf", "pos_inf", "nan", "neg_finite", "zero", "pos_finite"))
_MOMENTS = metadata.field_span(("min", "max", "mean", "std", "l2"))


def _clear_assignment(dist: dict[tuple[str, str], Optional[float]]) -> Optional[dict[str, str]]:
    """The one-to-one pairing where each base scope's partner is :data:`TELL_APART_MARGIN` times
    closer than any other candidate scope it may pair with, and than any other base scope is to that
    partner (a candidate scope no base scope chose is left over); None when some base scope is not
    clear so (:func:`_clear_rows`: a partner chosen by two base scopes is clear for neither)."""
    chosen = _clear_rows(dist)
    return chosen if len(chosen) == len({b for b, _ in dist}) else None


def _clear_rows(dist: dict[tuple[str, str], Optional[float]]) -> dict[str, str]:
    """Each base name whose nearest candidate is :data:`TELL_APART_MARGIN` times closer than its
    next nearest, and than any other base name is to that candidate, with that candidate (none when
    a distance is missing): the rows that are clear on their own."""
    known = {pair: d for pair, d in dist.items() if d is not None}
    if len(known) != len(dist):
        return {}
    rows: dict[str, list[tuple[float, str]]] = {}
    for (b, c), d in known.items():
        rows.setdefault(b, []).append((d, c))
    chosen: dict[str, str] = {}
    for b, found in rows.items():
        found.sort()
        if len(found) > 1 and not found[0][0] * TELL_APART_MARGIN < found[1][0]:
            continue
        c, own = found[0][1], found[0][0]
        if any(d <= own * TELL_APART_MARGIN for (other, c2), d in known.items() if c2 == c and other != b):
            continue
        chosen[b] = c
    return chosen


def _declared_apart(
    state: _Pairing, shapes_b: dict[Key, tuple[Any, ...]], shapes_c: dict[Key, tuple[Any, ...]]
) -> list[str]:
    """State an ``allow_unmatched`` pattern declared, left unpaired while the other run leaves one of its
    leaf name and shape unpaired too: the declaration kept them from being paired by shape (a new
    user's ``--allow-unmatched 'state/*'``, meant for a metric's variables, left the batch-norm moving
    statistics named otherwise in each run uncompared, listed only as expected)."""

    def leaf(key: Key) -> str:
        return _strip_output_index(key[1]).rpartition("/")[2]

    # state only, of one leaf name (moving_mean, moving_variance): a weight declared so is often one of
    # another parametrisation (TF1's LSTMCell bias against Keras's, the same shape in another gate order)
    free_c: dict[tuple[str, tuple[Any, ...]], list[Key]] = {}
    for key in state.free_cand:
        if key[0] == "state":
            free_c.setdefault((leaf(key), shapes_c[key]), []).append(key)
    found = []
    for key in sorted(k for k in state.free_base if k[0] == "state"):
        others = free_c.get((leaf(key), shapes_b[key]), [])
        if others and (key in state.expected or any(o in state.expected for o in others)):
            found.append(f"{key[0]}/{key[1]} ~ {', '.join(f'{o[0]}/{o[1]}' for o in sorted(others)[:2])}")
    if not found:
        return []
    return [
        f"{len(found)} state tensor(s) an --allow-unmatched pattern declares stay unpaired beside one of their name "
        f"and shape in the other run, so neither is compared: {'; '.join(found[:4])}"
        + (f" and {len(found) - 4} more" if len(found) > 4 else "")
        + ": a declared tensor is never paired by shape; narrow the pattern to what one run alone records, or "
        "--map the two to compare them"
    ]


def _scope_name(name: str) -> str:
    return name.rpartition("/")[0]


def layer_scope(name: str) -> str:
    """The layer a variable belongs to: its scope, or, for a variable outside any scope (TF1's
    ``get_variable("user_emb")``, ``tf.Variable(name="w1")``), its own name. Used to tell layers apart
    (two such same-shaped tables created in another order than the port's were paired by creation
    order and never re-paired by their first values: a faithful two-table port's false DIVERGE at
    step 0) and to group the gradients whose scale a slot's allowance reads (``Comparison``: every
    top-level variable shared the scope ``""``, so one's gradient of 8 admitted another's 2x off near
    1e-6 in its slot, a false AGREE)."""
    return _scope_name(name) or name


def _scope_text(scope: str, own: set[str]) -> str:
    """A scope as the warnings name it: ``dense/*``, or, for a scope in ``own``, the top-level variable's
    own name (TF1's ``user_emb:0``; Keras 3's ``user_emb``, without ``:0``, was named ``user_emb/*``)."""
    return scope if scope in own else f"{scope}/*"


def _scope_of(key: Hashable) -> Hashable:
    """(kind, scope) of a (kind, canonical name) key: the name without its last component."""
    assert isinstance(key, tuple)  # by_key's keys are (kind, key_of(series)) pairs
    return (key[0], str(key[1]).rpartition("/")[0])


def evidence(alignment: Alignment, base: Any, cand: Any) -> tuple[Any, ...]:
    """The statistics rows ``alignment`` read (``Alignment.read``), as the runs ``base`` and ``cand``
    (``RunData``) hold them now: while they and the names, orders and shapes are unchanged, so is the
    alignment (a run that logs its first step later, rewrites it, or logs one more of the first
    steps that tell layers apart, is aligned anew)."""
    found = []
    for (side, key), n in alignment.read.items():
        series = (base, cand)[side].tensors.get(key)
        found.append(None if series is None else (series.steps[:n].tobytes(), series.stats[:n].tobytes()))
    return tuple(found)


def align(
    base: Sequence[SeriesLike],
    cand: Sequence[SeriesLike],
    mapping: Sequence[str] = (),
    allow_unmatched: Sequence[str] = (),
) -> Alignment:
    """Pair ``base`` and ``cand`` tensors; see the module docstring for the stages. Element samples
    (``<name>#sample``) are not aligned on their own: each follows its tensor's pair.
    ``allow_unmatched``: the policy's patterns of tags one run alone may record."""
    samples = [{(s.kind, s.name): s for s in side if _is_sample(s)} for side in (base, cand)]
    expected = [patterns.matcher(p, f"allow_unmatched pattern {p!r}") for p in allow_unmatched]
    state = _Pairing(
        [s for s in base if not _is_sample(s)],
        [s for s in cand if not _is_sample(s)],
        lambda tag: any(m(tag) for m in expected),
    )
    warnings = state.by_mapping(mapping)
    state.by_key(_names, "exact", scoped=True)
    state.by_key(lambda series: _canonical_names(series, renumber=False), "canonical", scoped=True)
    state.by_key(lambda series: _canonical_names(series, renumber=True), "canonical", scoped=True)
    state.by_unique_shape()
    state.by_inferred_scope()
    candidates = state.by_kind_shape_order()
    # A kernel paired there by order takes its bias along (two encoder blocks' [64, 16] output
    # kernels, their [16] biases among many of that shape): left free, the layer was called
    # "parametrised otherwise" and the warning offered --allow-unmatched '*dense*'.
    state.by_inferred_scope()
    candidates = {k: [c for c in cs if c in state.free_cand] for k, cs in candidates.items() if k in state.free_base}
    # Identical names of other shapes last: Keras names layers of other widths created in another
    # order alike (the stages above pair them by shape); what is left is a shape divergence.
    otherwise = state.parametrised_otherwise()

    def in_otherwise(s: SeriesLike) -> bool:
        var = variable_of(s.kind, s.name)
        return var is not None and _scope_name(var[0]) in otherwise

    state.by_key(_names, "exact", scoped=False, same_shape=False, skip=in_otherwise)
    warnings += state.by_first_values()
    state.unpair_unpaired_variables(otherwise)
    unpaired = state.unpair_partial_layers()
    warnings += unpaired
    for scope in sorted(otherwise):
        if any(w.startswith(f"{scope}/* and ") for w in unpaired):
            continue  # said once, by the layer's variables paired by shape and unpaired
        if not any(k[1].startswith(f"{scope}/") for k in state.free_base if k[0] in _LAYER_KINDS):
            continue  # a --map paired them
        warnings.append(
            f"{scope}/* holds variables named otherwise in each run, some of other sizes under one name "
            "(another parametrisation, such as TF1's LSTMCell against Keras LSTM): left unpaired, not a shape "
            "divergence; pair them with --map if they hold the same values, or declare them with --allow-unmatched "
            f"'*{scope.rpartition('/')[2] or scope}*' if they are parametrised otherwise (their layer's output is still "
            "compared)"
        )
    state.follow_variables()
    warnings += state.by_layer_outputs()
    warnings += state.by_output_values()
    state.by_sole_compatible_shape()
    warnings += _pair_samples(state.matches, samples, (state.base, state.cand))
    # one dict per side: an exact pairing's two keys are equal
    shapes_b = {(s.kind, s.name): tuple(s.shape) for s in state.base}
    shapes_c = {(s.kind, s.name): tuple(s.shape) for s in state.cand}
    regrouped = []
    for m in state.matches:
        b_shape, c_shape = shapes_b.get(m.base), shapes_c.get(m.cand)
        if b_shape is None or c_shape is None or shapes_compatible(b_shape, c_shape):
            continue
        if reshaped(b_shape, c_shape):
            regrouped.append(f"{m.base[0]}/{m.base[1]} {list(b_shape)} ~ {list(c_shape)}")
        elif m.how in ("map", "exact", "layer"):
            warnings.append(
                f"{m.how} pairing of {m.base[0]}/{m.base[1]} {list(b_shape)} with "
                f"{m.cand[1]} {list(c_shape)}: different shapes (a shape divergence)"
            )
    if regrouped:  # one line: an attention port has four kernels, their biases, gradients and slots
        warnings.append(
            f"{len(regrouped)} paired tensor(s) hold the same elements in shapes with adjacent dimensions "
            "merged (a dense [d, heads*key_dim] against MultiHeadAttention's [d, heads, key_dim], an activation "
            "after a flatten against one before it) and are "
            f"compared element for element in row-major order: {', '.join(regrouped[:4])}"
            + (f" and {len(regrouped) - 4} more" if len(regrouped) > 4 else "")
        )
    warnings += _declared_apart(state, shapes_b, shapes_c)
    base_rank = {(s.kind, s.name): i for i, s in enumerate(sorted(base, key=execution_key))}
    matches = sorted(state.matches, key=lambda m: base_rank[m.base])
    return Alignment(
        matches=matches,
        unmatched_base=[(s.kind, s.name) for s in state.base if (s.kind, s.name) in state.free_base],
        unmatched_cand=[(s.kind, s.name) for s in state.cand if (s.kind, s.name) in state.free_cand],
        warnings=warnings,
        # the partners still free at the end: a later stage may have paired some (a message naming
        # a slot already compared as "ambiguous" misled a new user)
        candidates={k: free for k, v in candidates.items() if k in state.free_base and (free := state.still_free(v))},
        read=state.read,
    )


def _names(series: Sequence[SeriesLike]) -> list[str]:
    return [s.name for s in series]


def _is_sample(series: SeriesLike) -> bool:
    return metadata.is_sample(series.name)


def _pair_samples(
    matches: list[Match], samples: list[dict[Key, Any]], tensors: tuple[Sequence[Any], Sequence[Any]]
) -> list[str]:
    """Add to ``matches`` the pair of element samples of each matched pair of ``tensors`` (base,
    candidate) that both runs sampled and that is not compared by full values at every step already
    (a size unknown to the graph is sampled in case it runs large). The samples of unmatched
    tensors go with them: unmatched tensors are reported already. Returns a warning when some
    matched tensors are sampled by one run only (another ``full_values_limit``, or a shim from
    before samples): those are compared by statistics alone."""
    whole = [{(s.kind, s.name) for s in side if getattr(s, "values", None) is not None} for side in tensors]
    one_side: list[str] = []
    for m in list(matches):
        if m.base in whole[0] and m.cand in whole[1]:
            continue
        bs = (m.base[0], metadata.sample_name(m.base[1]))
        cs = (m.cand[0], metadata.sample_name(m.cand[1]))
        if bs in samples[0] and cs in samples[1]:
            matches.append(Match(bs, cs, m.how))
        elif bs in samples[0] or cs in samples[1]:
            one_side.append(f"{m.base[0]}/{m.base[1]}")
    if not one_side:
        return []
    return [
        f"{len(one_side)} tensor(s) have an element sample in one run only, so they are compared by "
        f"statistics alone: {', '.join(one_side[:5])}{' ...' if len(one_side) > 5 else ''}"
    ]
