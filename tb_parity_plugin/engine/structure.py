"""Structure parity, before any step is compared: what each run recorded, from its layouts.

A port whose batch norm has ``scale=False`` lacks every gamma; a port that calls a TF1 layer
function twice without ``reuse`` has ``dense_3`` next to ``dense``. Unmatched tensors once
never affected the verdict, so such ports were said to AGREE. Here, every tensor recorded by
one run only is a ``structure`` divergence, reported before any step, unless the user declared
it expected (``allow_unmatched`` patterns: globs over ``<kind>/<name>``, or ``re:REGEX``).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from tb_parity_plugin.engine import align, patterns
from tb_parity_plugin.records import metadata

#: Kinds that are variables (state of the model or the optimizer), for the per-side counts.
VARIABLE_KINDS = frozenset({"weight", "state", "slot"})
_SUFFIX = re.compile(r"_\d+$")


def _matcher(pattern: str) -> Any:
    return patterns.matcher(pattern, f"allow_unmatched pattern {pattern!r}")


def _is_variable(series: Any) -> bool:
    """A variable of the model or the optimizer (its element sample is not another one)."""
    return series.kind in VARIABLE_KINDS and not metadata.is_sample(series.name)


def _size(series: Any) -> int:
    """Elements of one tensor: the runtime size recorded at its first step, else its static shape."""
    if len(series.stats):
        return int(series.stats[0, metadata.STAT_INDEX["size"]])
    shape = tuple(series.shape)
    return math.prod(shape) if None not in shape else 0


@dataclasses.dataclass
class Structure:
    """What the two runs recorded, side by side; ``to_dict()`` is the report's ``structure``."""

    baseline: str
    candidate: str
    only_in: dict[str, list[dict[str, Any]]]  # run -> [{tag, kind, shape, size, expected, candidates, hints}]
    variables: dict[str, dict[str, int]]  # run -> {count, size}: every recorded variable (weight/state/slot)
    shape_mismatches: list[dict[str, Any]]  # [{kind, baseline, candidate, baseline_shape, candidate_shape, how}]
    created_twice: dict[str, list[dict[str, str]]]  # run -> [{tag, like}]
    allow_unmatched: tuple[str, ...]
    #: ``--map`` items pairing whole layers whose unmatched variables match (:func:`suggest_maps`)
    suggested_maps: list[str] = dataclasses.field(default_factory=list)
    #: run -> the kinds it recorded (``weight``, ``slot``, ...), in sorted order
    kinds: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    @property
    def unexpected(self) -> list[tuple[str, dict[str, Any]]]:
        """(run, entry) of every tensor recorded by one run only and not declared expected."""
        return [(run, e) for run, entries in self.only_in.items() for e in entries if not e["expected"]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "only_in": self.only_in,
            "variables": self.variables,
            "shape_mismatches": self.shape_mismatches,
            "created_twice": self.created_twice,
            "allow_unmatched": list(self.allow_unmatched),
            "suggested_maps": self.suggested_maps,
            "agree": not self.unexpected and not self.shape_mismatches,
        }


def sized_keys(run: Any, unmatched: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The tensors whose sizes :func:`structure_of` reads: the variables and the unmatched tensors
    (fixed with the alignment, so a refresh looks them up once, not once per tensor of the run)."""
    free = set(unmatched)
    return [key for key, s in run.tensors.items() if _is_variable(s) or key in free]


def sizes_read(run: Any, sized: Sequence[tuple[str, str]], unmatched: Sequence[tuple[str, str]]) -> tuple[Any, ...]:
    """What :func:`structure_of` reads of a run beyond its tensors' names, kinds and shapes (which
    the alignment was made from): the sizes of its variables and of its unmatched tensors
    (``sized``: :func:`sized_keys`). With the alignment and the run's name, a structure is
    unchanged while these are."""
    tensors = run.tensors
    sizes = tuple(_size(tensors[key]) for key in sized)
    # and the statistics unmatched weights start with, which pair the suggested maps
    starts = tuple(tuple(s.stats[0, _MOMENTS].tolist()) for key in unmatched if len((s := tensors[key]).stats))
    return sizes + starts


def structure_of(base: Any, cand: Any, alignment: align.Alignment, allow_unmatched: Sequence[str] = ()) -> Structure:
    """The structure report of two runs (reader ``RunData``) and their alignment."""
    allowed = [_matcher(p) for p in allow_unmatched]
    sides = ((base, alignment.unmatched_base), (cand, alignment.unmatched_cand))
    only_in: dict[str, list[dict[str, Any]]] = {}
    weights = {False: _weights_by_shape(cand), True: _weights_by_shape(base)}  # by ``run is base``
    centered = {
        r is base: align.centered_rmsprop(t.name for t in r.tensors.values() if t.kind == "slot") for r in (base, cand)
    }
    roles = {  # the slot roles each run keeps (by ``run is base``): a rule's slot the other keeps too is unpaired, not absent
        r is base: {
            found[1]
            for t in r.tensors.values()
            if t.kind == "slot" and (found := align.variable_of(t.kind, t.name, centered[r is base])) is not None
        }
        for r in (base, cand)
    }
    # the variables each run records a slot of that the other run pairs (by ``run is base``): only there does a
    # rule's slot kept by one run alone say the other's rule keeps none (a port that records the deep
    # optimizer's slots alone, its wide part under Ftrl, was told it trains that part with another optimizer)
    paired_slots = {
        side: {
            found[0]
            for m in alignment.matches
            if m.base[0] == "slot"
            and (found := align.variable_of("slot", (m.base if side else m.cand)[1], centered[side])) is not None
        }
        for side in (True, False)
    }
    no_gradient = _weights_without_gradient(base, cand, alignment)
    for run, keys in sides:
        entries = []
        for key in keys:
            s = run.tensors[key]
            tag = f"{s.kind}/{s.name}"
            entry: dict[str, Any] = {
                "tag": tag,
                "kind": s.kind,
                "shape": list(s.shape),
                "size": _size(s),
                "expected": any(m(tag) for m in allowed),
            }
            if run is base and key in alignment.candidates:
                entry["candidates"] = [f"{k}/{n}" for k, n in alignment.candidates[key]]
                copies = _copies_of(s, cand, alignment.candidates[key])
                if copies:
                    entry["copies"] = copies
            elif run is cand and s.kind == "weight":
                transposed = _transposed_copy_of(s, base)
                if transposed:
                    entry["transpose_of"] = transposed
            if "copies" not in entry and "transpose_of" not in entry:
                twins = _copy_per_use(s, weights[run is base], weights[run is not base])
                if twins:
                    entry["twins"] = twins
            if s.kind == "slot" and _tf1_rmsprop_momentum(s.name, centered[run is base]):
                entry["tf1_rmsprop_momentum"] = _tf1_rmsprop_momentum(s.name, centered[run is base])
            role = align.variable_of(s.kind, s.name, centered[run is base]) if s.kind == "slot" else None
            if (
                role is not None
                and role[1] in _RULE_SLOTS
                and role[1] not in roles[run is not base]
                and role[0] in paired_slots[run is base]
            ):
                entry["rule_slot"] = role[1]
            if s.kind == "grad" and (run is base, s.name) in no_gradient:
                entry["gradient_none"] = no_gradient[(run is base, s.name)]
            hints = entry_hints(entry, "baseline" if run is base else "candidate")
            if hints:
                entry["hints"] = hints
            entries.append(entry)
        only_in[run.name] = entries
    variables = {}
    for run, _ in sides:
        vs = [s for s in run.tensors.values() if _is_variable(s)]
        variables[run.name] = {"count": len(vs), "size": int(sum(_size(s) for s in vs))}
    mismatches = []
    for m in alignment.matches:
        b, c = base.tensors[m.base], cand.tensors[m.cand]
        if not align.same_elements(b.shape, c.shape):
            mismatches.append(
                {
                    "kind": b.kind,
                    "baseline": b.name,
                    "candidate": c.name,
                    "baseline_shape": list(b.shape),
                    "candidate_shape": list(c.shape),
                    "how": m.how,
                }
            )
    _moments_of_two_kinds(base, cand, alignment, [only_in[base.name], only_in[cand.name]])
    twice = {run.name: _created_twice(run, keys) for run, keys in sides}
    suggested = suggest_maps(base, cand, alignment, allowed)
    kinds = {run.name: sorted({s.kind for s in run.tensors.values()}) for run, _ in sides}
    return Structure(
        base.name, cand.name, only_in, variables, mismatches, twice, tuple(allow_unmatched), suggested, kinds
    )


def _moments_of_two_kinds(
    base: Any, cand: Any, alignment: align.Alignment, entries: list[list[dict[str, Any]]]
) -> None:
    """Marks each unmatched ``state`` named as an optimizer moment of a weight of its run, of that
    weight's shape (``align.moment_like``), with ``moment_of`` (the weight's tag) and ``recorded_as``
    (the other run's slots of the weight paired with it, of the same role when the name says one);
    those slots, when unmatched, get ``recorded_as`` the state. BERT's ``AdamWeightDecayOptimizer``
    keeps its moments as plain variables (``<variable>/adam_m``), which the TF1 shim recorded as
    ``state`` once, beside the Keras port's ``m``/``v`` slots: 96 structure lines, told
    the runs kept no state or no slots at all, and the hint's ``--allow-unmatched 'state/*' 'slot/*'``
    left every moment uncompared (``first_of`` now says they are one quantity under two kinds)."""
    runs = (base, cand)
    if base.name == cand.name:
        return
    partner: dict[tuple[int, tuple[str, str]], tuple[str, str]] = {}
    for m in alignment.matches:
        if m.base[0] == "weight" and m.cand[0] == "weight":
            partner[(0, m.base)], partner[(1, m.cand)] = m.cand, m.base
    keys = (alignment.unmatched_base, alignment.unmatched_cand)
    by_key = [dict(zip(side_keys, side_entries)) for side_keys, side_entries in zip(keys, entries)]
    for side, run in enumerate(runs):
        other = runs[1 - side]
        weights = {s.name.removesuffix(":0"): key for key, s in run.tensors.items() if s.kind == "weight"}
        centered = align.centered_rmsprop(s.name for s in other.tensors.values() if s.kind == "slot")
        slots_of: dict[str, list[tuple[tuple[str, str], str]]] = {}  # the other run's variable -> [(slot, role)]
        for key, o in other.tensors.items():
            found = align.variable_of(o.kind, o.name, centered) if o.kind == "slot" else None
            if found is not None and not metadata.is_sample(o.name):
                slots_of.setdefault(found[0], []).append((key, found[1]))
        for key, entry in by_key[side].items():
            s = run.tensors[key]
            named = align.moment_like(s.name) if s.kind == "state" and not metadata.is_sample(s.name) else None
            weight = weights.get(named[0]) if named else None
            if named is None or weight is None or tuple(run.tensors[weight].shape) != tuple(s.shape):
                continue
            entry["moment_of"] = f"weight/{run.tensors[weight].name}"
            theirs = partner.get((side, weight))
            held = slots_of.get(other.tensors[theirs].name.removesuffix(":0"), []) if theirs else []
            same = [k for k, role in held if role == named[1]] or ([] if named[1] else [k for k, _ in held])
            entry["recorded_as"] = [f"slot/{other.tensors[k].name}" for k in same]
            for k in same:
                if k in by_key[1 - side]:
                    by_key[1 - side][k].setdefault("recorded_as", []).append(entry["tag"])


def suggest_maps(base: Any, cand: Any, alignment: align.Alignment, allowed: Sequence[Any] = ()) -> list[str]:
    """``--map`` items for layers whose variables went unmatched on both sides: a baseline scope
    and a candidate scope whose unmatched weights have the same names under them and the same
    sizes (shapes may merge dimensions: a dense ``[16]`` bias against ``MultiHeadAttention``'s
    ``[2, 8]``); of several such layers, paired by their own last name when it is one of a kind on
    both sides, else by the statistics their weights start with when those single each one out
    (:func:`_by_first_statistics`), else not at all. A helper's TF1 BERT-style attention
    (``encoder/attention/query/...``) against Keras ``MultiHeadAttention`` (``mha/query/...``) was
    96 structure lines, their ambiguous partners all wrong, and the four maps written by hand.
    Declared (``allowed``) tensors are left out: another parametrisation shares no names anyway."""

    starts: list[dict[str, dict[str, np.ndarray]]] = [{}, {}]  # per side: scope -> leaf -> first statistics

    def scopes(run: Any, keys: Sequence[tuple[str, str]], side: int) -> dict[str, frozenset[tuple[str, int]]]:
        found: dict[str, set[tuple[str, int]]] = {}
        for key in keys:
            s = run.tensors[key]
            if s.kind != "weight" or any(m(f"{s.kind}/{s.name}") for m in allowed):
                continue
            scope, _, leaf = s.name.removesuffix(":0").rpartition("/")
            if scope:
                found.setdefault(scope, set()).add((leaf, _size(s)))
                if len(s.stats):
                    starts[side].setdefault(scope, {})[leaf] = s.stats[0, _MOMENTS]
        return {scope: frozenset(sig) for scope, sig in found.items()}

    ours, theirs = scopes(base, alignment.unmatched_base, 0), scopes(cand, alignment.unmatched_cand, 1)
    groups: dict[frozenset[tuple[str, int]], tuple[list[str], list[str]]] = {}
    for side, found in enumerate((ours, theirs)):
        for scope, sig in found.items():  # in recording order (dicts keep it): creation order
            groups.setdefault(sig, ([], []))[side].append(scope)
    out = []
    for b_scopes, c_scopes in groups.values():
        # layers of one signature (query, key, value): by their own last name when it is one of a
        # kind on both sides, the rest by their first recorded statistics when those single each
        # one out (a port that copied TF1's weights); by creation order, a review's TF1 that created
        # its key projection before its query was told to map them crosswise
        last = [[scope.rpartition("/")[2] for scope in scopes] for scopes in (b_scopes, c_scopes)]
        named = {
            b: c_scopes[last[1].index(name)]
            for b, name in zip(b_scopes, last[0])
            if last[0].count(name) == 1 and last[1].count(name) == 1
        }
        left_b = [b for b in b_scopes if b not in named]
        left_c = [c for c in c_scopes if c not in named.values()]
        rest = _by_first_statistics(left_b, left_c, starts[0], starts[1])
        for b, c in [*named.items(), *rest.items()]:
            if b != c and "=" not in b and not any(ch in c for ch in "\\$"):  # what a map item could not say
                out.append(f"re:^{re.escape(b)}/={c}/")
    return sorted(out)


#: The statistics a layer's weights start with that tell layers apart (min, max, mean, std).
_MOMENTS = [metadata.STAT_INDEX[name] for name in ("min", "max", "mean", "std")]


def _by_first_statistics(
    b_scopes: list[str],
    c_scopes: list[str],
    b_starts: dict[str, dict[str, np.ndarray]],
    c_starts: dict[str, dict[str, np.ndarray]],
) -> dict[str, str]:
    """Each baseline scope paired with the one candidate scope whose weights start with the same
    statistics (within 1e-5 of their scale, every leaf), when that is one to one; else nothing."""

    def same(b: str, c: str) -> bool:
        ours, theirs = b_starts.get(b, {}), c_starts.get(c, {})
        if not ours or ours.keys() != theirs.keys():
            return False
        for leaf, row in ours.items():
            a, z = np.asarray(row, np.float64), np.asarray(theirs[leaf], np.float64)
            if not (np.isfinite(a).all() and np.isfinite(z).all()):
                return False
            if np.abs(a - z).max() > 1e-5 * max(float(np.abs(a).max()), 1e-12):
                return False
        return True

    found = {b: [c for c in c_scopes if same(b, c)] for b in b_scopes}
    chosen = {b: cs[0] for b, cs in found.items() if len(cs) == 1}
    return chosen if len(set(chosen.values())) == len(chosen) else {}


_MIN, _MAX = metadata.STAT_INDEX["min"], metadata.STAT_INDEX["max"]


def _copies_of(b: Any, cand: Any, keys: Sequence[tuple[str, str]]) -> list[str]:
    """The tags of a baseline weight's ambiguous partners (``keys``) that start with its statistics,
    when at least two do and it holds more than one value: the candidate holds one copy per use of
    a layer the baseline shares (TF1's ``variable_scope(reuse=...)``, one layer called on two inputs),
    its weights copied from the baseline's. A new user's siamese port, its tower built once per input,
    got "ambiguous" for each tower variable and no word of why (each copy then takes only its own
    use's gradient, where a shared weight takes their sum)."""
    if b.kind != "weight":
        return []
    same = [f"{c.kind}/{c.name}" for c in (cand.tensors[key] for key in keys) if _starts_alike(b, c)]
    return same if len(same) >= 2 else []


def _starts_alike(a: Any, b: Any) -> bool:
    """``a`` and ``b`` start with the same statistics (within float32 rounding), not one value."""
    if not len(a.stats) or not len(b.stats):
        return False
    first = np.asarray(a.stats[0], np.float64)
    if not np.isfinite(first).all() or first[_MIN] == first[_MAX]:  # zeros or ones start many layers alike
        return False
    return bool(np.allclose(np.asarray(b.stats[0], np.float64), first, rtol=1e-5, atol=0.0))


def _weights_by_shape(run: Any) -> dict[tuple[Any, ...], list[Any]]:
    """A run's weights by shape: those a weight may be a copy of."""
    found: dict[tuple[Any, ...], list[Any]] = {}
    for t in run.tensors.values():
        if t.kind == "weight":
            found.setdefault(tuple(t.shape), []).append(t)
    return found


def _copy_per_use(
    s: Any, mine: dict[tuple[Any, ...], list[Any]], theirs: dict[tuple[Any, ...], list[Any]]
) -> dict[str, list[str]]:
    """For a weight one run alone records: the other weights of its run (``mine``, by shape) that
    start as it does, and the other run's (``theirs``) that do, when its run holds more of them
    ({"twins", "shared"}), else {}. That run holds a copy per use of a layer the other shares (two
    towers against one applied twice), the copies initialised alike. A helper's port in that
    direction (TF1 built a tower per input, the port shared one) got "recorded by the baseline only"
    for every tower variable, with no word of the copies (``_copies_of`` covers the other direction)."""
    if s.kind != "weight":
        return {}
    shape = tuple(s.shape)
    twins = [t for t in mine.get(shape, ()) if t is not s and _starts_alike(s, t)]
    shared = [t for t in theirs.get(shape, ()) if _starts_alike(s, t)]
    if not twins or not shared or len(twins) + 1 <= len(shared):
        return {}
    return {"twins": [f"{t.kind}/{t.name}" for t in twins], "shared": [f"{t.kind}/{t.name}" for t in shared]}


def _transposed_copy_of(c: Any, base: Any) -> str:
    """The tag of the one baseline weight of 2-D shape ``c``'s reversed that starts with ``c``'s
    statistics, else "": a tied weight (TF1's output projection ``matmul(h, embedding,
    transpose_b=True)``) ported as a layer of its own whose kernel was copied from the transpose.
    A new user's untied language-model port got "recorded by the candidate only" and no word of
    the embedding it had copied."""
    if len(c.shape) != 2 or c.shape[0] == c.shape[1]:
        return ""
    found = [
        f"{b.kind}/{b.name}"
        for b in base.tensors.values()
        if b.kind == "weight" and tuple(b.shape) == tuple(reversed(c.shape)) and _starts_alike(c, b)
    ]
    return found[0] if len(found) == 1 else ""


def _created_twice(run: Any, unmatched: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
    """Unmatched variables that repeat a matched one of the same run: same leaf, shape and layer type.

    ``dense_3/kernel`` beside ``dense/kernel`` with the same shape is the TF1 ``variable_scope``
    reuse bug ported wrongly: the layer was built twice instead of shared. Slots and moving
    averages compare as their variable's layer and ``<variable leaf>/<role>``
    (``align.variable_of``): Keras's ``average/dense/kernel`` is no second ``m/dense/kernel``,
    and the Adam slot of one attention's ``query/bias`` no repeat of another layer's ``bias`` (16
    false notes on a new user's faithful port). Of several repeated tensors, the one that starts
    with the same statistics is named (the layer built twice copies its twin's initial values).
    """
    free = set(unmatched)
    found = []
    for key in unmatched:
        s = run.tensors[key]
        if s.kind not in VARIABLE_KINDS:
            continue
        scope, leaf = _layer_and_leaf(s.kind, s.name)
        path = _unnumbered(scope)
        like = []
        for other_key, o in run.tensors.items():
            if other_key in free or o.kind != s.kind or tuple(o.shape) != tuple(s.shape):
                continue
            o_scope, o_leaf = _layer_and_leaf(o.kind, o.name)
            if o_leaf == leaf and o_scope != scope and _unnumbered(o_scope) == path:
                like.append(o)
        if like:
            same = [o for o in like if len(o.stats) and len(s.stats) and np.array_equal(o.stats[0], s.stats[0])]
            o = (same or like)[0]
            found.append({"tag": f"{s.kind}/{s.name}", "like": f"{o.kind}/{o.name}"})
    return found


def _unnumbered(scope: str) -> str:
    """A scope with every part's ``_N`` suffix dropped: a layer built twice differs from its twin
    by such suffixes only (``block_1/dense`` beside ``block/dense``, ``dense_3`` beside ``dense``);
    BERT's ``attention/output/dense`` and ``output/dense`` are two layers (a new user's faithful
    port was asked whether one was created twice)."""
    return "/".join(_SUFFIX.sub("", part) for part in scope.split("/"))


def _layer_and_leaf(kind: str, name: str) -> tuple[str, str]:
    """(the layer's scope, the name under it) of a variable, slot or moving average: a slot or an
    average is placed under its variable's layer, ``<variable leaf>/<role>``."""
    found = align.variable_of(kind, name) if kind in ("slot", "state") else None
    if found is None or not found[1]:
        scope, _, leaf = align.role_canonical(kind, name).rpartition("/")
        return scope, leaf
    var, role = found
    scope, _, var_leaf = var.rpartition("/")
    return scope, f"{var_leaf}/{role}"


def describe_entry(run: str, entry: dict[str, Any], side: str) -> str:
    """One line for a tensor recorded by one run only."""
    text = f"recorded by the {side} {run!r} only ({entry['kind']}, shape {entry['shape']}, {entry['size']} elements)"
    if entry.get("candidates"):
        text += f"; same kind and shape in the other run, ambiguous: {', '.join(entry['candidates'])}"
    return "; ".join([text, *entry_hints(entry, side)])


def entry_hints(entry: dict[str, Any], side: str) -> list[str]:
    """What a tensor recorded by one run only looks like it is, from how it starts (a shared weight's
    copies, a tied weight ported as a layer of its own): worded once for the notes and for the
    structure's JSON (``hints``), which the tab's structure panel shows under the entry."""
    other = "baseline" if side == "candidate" else "candidate"
    hints = []
    if entry.get("transpose_of"):
        hints.append(
            f"starts as the transpose of the {other}'s {entry['transpose_of']}: a tied weight (an output "
            "projection that reuses an embedding, matmul(h, embedding, transpose_b=True)) ported as a layer of "
            "its own? It then trains apart from the embedding, which loses this use's gradient"
        )
    if entry.get("twins"):
        twins, shared = entry["twins"]["twins"], entry["twins"]["shared"]
        hints.append(
            f"it and this run's {', '.join(twins)} start alike, as the {other}'s {', '.join(shared)} "
            f"{'does' if len(shared) == 1 else 'do'}: a layer the {other} shares (a variable_scope reused, one "
            "layer called on several inputs) held as a copy per use here? Each copy then takes only its own "
            "use's gradient, where the shared weight takes their sum"
        )
    if entry.get("copies"):
        hints.append(
            f"{len(entry['copies'])} of them start as this one does ({', '.join(entry['copies'])}): a layer "
            f"the {side} shares (a variable_scope reused, one layer called on several inputs, a tied weight) "
            "built once per use in the other run? Each copy then takes only its own use's gradient, where the "
            "shared weight takes their sum: share the layer, or pair one copy with --map to compare the rest"
        )
    if entry.get("gradient_none"):
        hints.append(
            f"the {other} records this weight too ({entry['gradient_none']}, paired) and gradients of other "
            "weights, but none of this one: its gradient there is None, no gradient reaching the weight from the "
            "loss (tape.gradient and tf.gradients return None through a non-differentiable op: tf.round, "
            "tf.floor, tf.sign, tf.argmax, a cast to an integer; a straight-through estimator or custom "
            "gradient left out, a stop_gradient, or the weight unused by the loss; Keras's fit warns "
            "'Gradients do not exist for variables' and leaves the weight where it was), or the weight is not "
            "trained there (trainable=False, or left out of the optimizer's var_list)"
        )
    return hints


def _weights_without_gradient(base: Any, cand: Any, alignment: align.Alignment) -> dict[tuple[bool, str], str]:
    """(is baseline, gradient name) of each gradient recorded by one run only whose weight is paired
    with one of the other run's, that run recording gradients but none for it -> the other run's
    weight: its gradient there was None (a straight-through estimator left out: the port's tf.round
    gave none, and a trial's port was told only "recorded by the baseline only")."""
    found: dict[tuple[bool, str], str] = {}
    unmatched = {True: set(alignment.unmatched_base), False: set(alignment.unmatched_cand)}
    grads = {side: {_variable(n) for k, n in r.tensors if k == "grad"} for side, r in ((True, base), (False, cand))}
    for m in alignment.matches:
        if m.base[0] != "weight" or m.cand[0] != "weight":
            continue
        for side, mine, theirs in ((True, m.base, m.cand), (False, m.cand, m.base)):
            key = ("grad", mine[1])
            if key in unmatched[side] and grads[not side] and _variable(theirs[1]) not in grads[not side]:
                found[(side, mine[1])] = f"weight/{theirs[1]}"
    return found


def _variable(name: str) -> str:
    """The variable a weight or gradient is named after (its name without an output index)."""
    found = align.variable_of("weight", name)
    return found[0] if found is not None else name


#: How each kind is recorded, for a run that recorded none of it (README: "Log both sides").
_HOW_RECORDED = {
    "slot": "TF2 `with rec.step(step, variables=model, optimizer=opt)` or `instrument`, TF1 "
    "`rec.variables(optimizer=opt)`",
    "state": "TF2 `with rec.step(step, variables=model)` or `instrument`, TF1 `rec.variables()`",
    "weight": "`rec.weights`, `rec.apply_gradients` / `rec.minimize`, or `rec.variables`",
    "grad": "`rec.grads`, `rec.apply_gradients` / `rec.minimize`",
    "activation": "`rec.activation`, or `instrument(model, rec, layers=[...])`",
}


def _kind_unrecorded(kind: str, other: str, moments: int = 0) -> str:
    """Why a whole kind may be missing from ``other``: how it is recorded, and how to leave it out. A new
    user's TF1 run recorded Adam's slots (``rec.variables(optimizer=opt)``) and the TF2 run, written
    from the README's shortest example, none: ten structure lines and no word of either. ``moments``:
    how many of this run's tensors of the kind are optimizer moments the glob would leave uncompared
    (:func:`_moments_of_two_kinds`), which it then says."""
    how = _HOW_RECORDED.get(kind)
    has_none = {
        "slot": "its optimizer keeps none (plain SGD where the other keeps a momentum, say)",
        "state": "its model keeps none (no batch normalization, say)",
    }.get(kind, "it computes none")
    glob = f"--allow-unmatched '{kind}/*'"
    if moments:
        glob += f" (which would also leave the {moments} optimizer moment(s) of this kind uncompared: name the others)"
    return (
        f"'{other}' recorded no {kind} at all: either it was not asked to (record them there too"
        + (f": {how}" if how else "")
        + f") or {has_none}; to compare without them: {glob}"
    )


def _loss_of_one_run(other: str, tags: list[str]) -> str:
    """Why a loss may be recorded by one run only while the other records a loss too: per-head losses
    (or a loss recorded twice, before and after a term) beside the total, which Keras ``fit``'s
    ``instrument`` records alone (README "model.fit")."""
    losses = " ".join(f"--allow-unmatched '{t}'" for t in tags if t.startswith("loss/"))
    return (
        f"'{other}' records a loss too, under another name only: a multi-output model's per-head losses have no "
        "counterpart in a Keras fit port, whose instrument records the one loss fit minimises (every head's loss "
        "weighted and summed, regularization included; no per-head losses), so compare the totals under one name "
        f"(TF1: rec.loss(tf.compat.v1.losses.get_total_loss())) and declare the others: {losses}"
    )


#: How to record a moment as a slot in a TF1 run (README "State, optimizer slots").
_AS_SLOT = (
    "record it as a slot (the TF1 `rec.variables` does so for BERT's `<variable>/adam_m`, `/adam_v` and "
    "LAMB's `lamb_m`, `lamb_v`; any other: `rec.tensor('slot', '<variable>/m', var)`)"
)


def _moment_note(entry: dict[str, Any], other: str, first: bool) -> str:
    """For a tensor :func:`_moments_of_two_kinds` marked: one optimizer moment under two kinds, or a
    moment recorded as ``state`` where the other run recorded no slot of its variable; how to record
    it is said on the ``first`` of its run and kind only. Never the bare ``--allow-unmatched`` a
    missing kind gets: that silences the moments, and a port with a wrong beta passes."""
    theirs = ", ".join(entry.get("recorded_as", []))
    if entry["kind"] == "slot":
        note = (
            f"'{other}' records this moment as {theirs}: the same quantity under another kind, so neither is compared"
        )
        return note + (
            " (a non-trainable variable named like the optimizer's moment, as BERT's AdamWeightDecayOptimizer keeps "
            f"them outside its slots); in '{other}', {_AS_SLOT}"
            if first
            else ""
        )
    if theirs:
        note = (
            f"named like an optimizer moment of {entry['moment_of']}, and '{other}' records it as {theirs}: "
            "the same quantity under another kind, so neither is compared"
        )
        return note + (f"; {_AS_SLOT}" if first else "")
    note = f"named like an optimizer moment of {entry['moment_of']}, and '{other}' records no slot of that variable"
    return note + (
        f": if it is one, {_AS_SLOT}, and record the optimizer's slots in '{other}' ({_HOW_RECORDED['slot']}); "
        "--allow-unmatched would leave it uncompared"
        if first
        else ""
    )


#: Slots that one optimizer's rule keeps and the other's lacks, and what that says of the two rules:
#: a port with Keras's ``Adam(amsgrad=True)`` of TF1's ``AdamOptimizer`` (which has no AMSGrad), or an
#: RMSProp centered on one side only, got a structure line with no word of either.
_RULE_SLOTS = {
    "vhat": (
        "AMSGrad's running maximum of the second moment (Keras Adam(amsgrad=True), which divides by its "
        "square root): the other run keeps none, so amsgrad differs (TF1's AdamOptimizer has no AMSGrad); "
        "the runs part from the first step where v falls below its maximum"
    ),
    "mg": (
        "centered RMSProp's moving average of the gradient (centered=True: TF1's RMSProp_1 beside an "
        "RMSProp_2, tf_keras average_gradient, legacy mg): the other run keeps none, so centered differs (the "
        "denominator is mean square - mg² in one run, mean square in the other)"
    ),
    # a trial's wide-and-deep port trained its wide part with the deep part's Adagrad where TF1 had Ftrl:
    # Adagrad's accumulator paired with Ftrl's, and Ftrl's linear term was a bare structure line
    "linear": (
        "Ftrl's linear term (TF1 Ftrl_1, tf_keras linear): the other run keeps none, so it trains this variable "
        "with another optimizer than Ftrl (an accumulator kept alone is Adagrad's: a wide part trained by the "
        "deep part's optimizer); the weights part at the first "
        "update, Ftrl setting each weight from its accumulator and linear term (with its l1 and l2) where the "
        "other steps by its own rule"
    ),
}


def _tf1_rmsprop_momentum(name: str, centered: frozenset[str]) -> str:
    """``RMSProp_1`` (``RMSProp_2`` when centered) when the slot ``name`` is TF1's RMSProp momentum
    (``centered``: its run's :func:`align.centered_rmsprop`), else "". TF1 makes it even with momentum=0,
    and a faithful port without momentum keeps none: a new user's hand-written port was a structure
    DIVERGE with no word of the ``--allow-unmatched`` the README gives for it."""
    var, _, leaf = name.removesuffix(":0").rpartition("/")
    if leaf == "RMSProp_2" or (leaf == "RMSProp_1" and var not in centered):
        return leaf
    return ""


def first_of(structure: Structure, damaged: Collection[str] = ()) -> list[dict[str, Any]]:
    """Structure divergences as Divergence keyword arguments, baseline's first (in recorded order).

    ``damaged``: runs with unaccepted read problems. A tensor missing from such a run may be
    in the records it lost, so its absence proves nothing about the port: it is not a
    divergence (the verdict is then ``incomplete``, naming the problems), only listed.
    """
    notes = {t["tag"]: t["like"] for entries in structure.created_twice.values() for t in entries}
    out = []
    told: set[tuple[str, ...]] = set()  # (run, kind) whose absence from the other run was explained, and
    # ("moment", run, kind) whose moments under two kinds were
    moments: dict[tuple[str, str], int] = {}  # (run, kind) -> its optimizer moments under two kinds
    for run, entry in structure.unexpected:
        if "moment_of" in entry or entry.get("recorded_as"):
            moments[(run, entry["kind"])] = moments.get((run, entry["kind"]), 0) + 1
    for run, entry in structure.unexpected:
        other = structure.candidate if run == structure.baseline else structure.baseline
        if other in damaged:
            continue
        side = "baseline" if run == structure.baseline else "candidate"
        note = describe_entry(run, entry, side)
        if entry["tag"] in notes:
            note += f"; looks created twice: repeats {notes[entry['tag']]}"
        kind, _, name = entry["tag"].partition("/")
        unused = entry.get("tf1_rmsprop_momentum", "")
        if unused and ("rmsprop", run, unused) not in told:
            told.add(("rmsprop", run, unused))
            note += (
                f"; TF1's RMSPropOptimizer makes this momentum slot even with momentum=0 (it then holds each "
                f"step's update, lr x g / sqrt(mean square + epsilon)): against a port without momentum, declare "
                f"it: --allow-unmatched '*{unused}*'"
            )
        rule = entry.get("rule_slot", "")
        if rule and ("rule", run, rule) not in told and kind in structure.kinds.get(other, [kind]):
            told.add(("rule", run, rule))
            note += "; " + _RULE_SLOTS[rule]
        if "moment_of" in entry or entry.get("recorded_as"):
            note += "; " + _moment_note(entry, other, ("moment", run, kind) not in told)
            told.add(("moment", run, kind))
        elif structure.kinds and kind not in structure.kinds.get(other, [kind]) and (run, kind) not in told:
            told.add((run, kind))
            note += "; " + _kind_unrecorded(kind, other, moments.get((run, kind), 0))
        elif kind == "loss" and ("loss", run) not in told:
            # a new user's TF1 original of a two-head model recorded each head's loss beside the total, and
            # its faithful fit port got two bare "recorded by the baseline only" lines
            told.add(("loss", run))
            note += "; " + _loss_of_one_run(other, [e["tag"] for r, e in structure.unexpected if r == run])
        out.append(
            {
                "tensor": name if side == "baseline" else "",
                "candidate_tensor": name if side == "candidate" else "",
                "kind": kind,
                "reason": "structure",
                "evidence": "layout",
                "note": note,
            }
        )
    return out
