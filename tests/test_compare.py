"""Engine tests: alignment, tolerance policy, divergence reasons and ordering, matrix, refresh."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from typing import Any, Callable

import numpy as np
import pytest
from engine_helpers import run, series, write_run

from tb_parity_plugin.engine import Comparison, align, batch, compare_runs
from tb_parity_plugin.engine.matrix import MISSING, NONFINITE, OK, VALUE, ParityMatrix
from tb_parity_plugin.engine.tolerance import ToleranceOverride, TolerancePolicy
from tb_parity_plugin.logdir.reader import LogdirReader

RNG = np.random.default_rng(0)


def steady(n: int, shape: tuple = (3,), scale: float = 1.0, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(shape) * scale + 2.0).astype(np.float32) for _ in range(n)]


def names(alignment: align.Alignment) -> list:
    return [(m.base[1], m.cand[1], m.how) for m in alignment.matches]


# -- alignment -------------------------------------------------------------------
def test_align_keras_suffix_drift_and_scope_prefix() -> None:
    base = [
        series("weight", n, steady(1), order=i)
        for i, n in enumerate(["dense/kernel:0", "dense_1/kernel:0", "dense_2/kernel:0"])
    ]
    cand = [
        series("weight", n, steady(1), order=i)
        for i, n in enumerate(
            ["simple_model/dense_3/kernel:0", "simple_model/dense_4/kernel:0", "simple_model/dense_5/kernel:0"]
        )
    ]
    result = align.align(base, cand)
    assert names(result) == [
        ("dense/kernel:0", "simple_model/dense_3/kernel:0", "canonical"),
        ("dense_1/kernel:0", "simple_model/dense_4/kernel:0", "canonical"),
        ("dense_2/kernel:0", "simple_model/dense_5/kernel:0", "canonical"),
    ]
    assert result.unmatched_base == [] and result.unmatched_cand == []


def test_align_strips_output_index_and_prefers_exact() -> None:
    base = [series("grad", "dense/bias:0", steady(1)), series("grad", "loss_scale", steady(1), order=1)]
    cand = [series("grad", "dense/bias", steady(1)), series("grad", "loss_scale", steady(1), order=1)]
    assert names(align.align(base, cand)) == [
        ("dense/bias:0", "dense/bias", "canonical"),
        ("loss_scale", "loss_scale", "exact"),
    ]


def test_align_user_mappings_exact_tag_and_regex() -> None:
    base = [
        series("weight", "a", steady(1)),
        series("weight", "enc/w", steady(1), order=1),
        series("loss", "xent", steady(1, ()), order=2),
    ]
    cand = [
        series("weight", "z", steady(1)),
        series("weight", "encoder/w", steady(1), order=1),
        series("loss", "ce", steady(1, ()), order=2),
    ]
    result = align.align(base, cand, ["a=z", r"re:^enc/(.*)$=encoder/\1", "loss/xent=loss/ce", "nothing=here"])
    assert names(result) == [("a", "z", "map"), ("enc/w", "encoder/w", "map"), ("xent", "ce", "map")]
    assert result.warnings == ["mapping 'nothing=here' paired no tensors"]
    with pytest.raises(ValueError):
        align.align(base, cand, ["no-equals-sign"])


def test_one_name_mapped_to_two_tensors_is_an_error_and_a_repeated_mapping_is_not() -> None:
    """``--map a=z --map a=y``: the first won and the second "paired no tensors", so the tensor compared
    depended on the flags' order; the same mapping twice was told it paired nothing."""
    base = [series("weight", "a", steady(1)), series("weight", "b", steady(2), order=1)]
    cand = [series("weight", "z", steady(2)), series("weight", "y", steady(1), order=1)]
    with pytest.raises(ValueError, match="'a=z' and 'a=y' pair a with two tensors"):
        align.align(base, cand, ["a=z", "a=y"])
    with pytest.raises(ValueError, match="two tensors"):  # one name with and without its output index
        align.align(base, cand, ["a=z", "a:0=y"])
    result = align.align(base, cand, ["a=y", "a=y", "b=z"])
    assert names(result) == [("a", "y", "map"), ("b", "z", "map")]
    assert result.warnings == []


def test_two_names_mapped_to_one_tensor_is_an_error() -> None:
    """``--map a=z --map b=z``: a tensor pairs once, so the first won and the second "paired no
    tensors", and which of a and b the verdict compared depended on the flags' order (trial h102, on a
    real CNN pair: one order was DIVERGE in structure with 8 unpaired tensors, the other DIVERGE at
    step 1 on the conv kernel)."""
    base = [series("weight", "a", steady(1)), series("weight", "b", steady(2), order=1)]
    cand = [series("weight", "z", steady(2)), series("weight", "y", steady(1), order=1)]
    for items in (["a=z", "b=z"], ["b=z", "a=z"], ["a=z:0", "b:0=z"]):
        with pytest.raises(ValueError, match="pair two tensors with z"):
            align.align(base, cand, items)
    result = align.align(base, cand, ["a=y", "a:0=y", "b=z"])  # one name with and without :0 is one name
    assert names(result) == [("a", "y", "map"), ("b", "z", "map")]
    # tags of two kinds name two tensors: a weight and a gradient may both map to one name
    base += [series("grad", "c", steady(3), order=2)]
    cand += [series("grad", "z", steady(3), order=2)]
    result = align.align(base, cand, ["weight/b=z", "grad/c=z", "a=y"])
    assert sorted(names(result)) == [("a", "y", "map"), ("b", "z", "map"), ("c", "z", "map")]
    with pytest.raises(ValueError, match="pair two tensors with z"):  # a name alone maps every kind of it
        align.align(base, cand, ["weight/b=z", "c=z"])


def test_a_mapping_may_abbreviate_names_as_a_user_writes_them() -> None:
    """A new user's ``--map dense/kernel=dense_3/kernel`` paired nothing: the names were
    ``dense/kernel:0`` and ``sequential/dense_3/kernel:0``. A name without ``:0`` or its outer scopes
    now pairs when it fits one tensor of the kind; one that fits several says which."""
    base = [
        series("weight", "dense/kernel:0", steady(1)),
        series("weight", "dense_1/kernel:0", steady(1), order=1),
        series("grad", "dense/kernel:0", steady(1), order=2),
    ]
    cand = [
        series("weight", "sequential/dense_3/kernel:0", steady(1)),
        series("weight", "sequential/dense_2/kernel:0", steady(1), order=1),
        series("grad", "sequential/dense_3/kernel:0", steady(1), order=2),
    ]
    result = align.align(base, cand, ["dense/kernel=dense_3/kernel", "weight/dense_1/kernel=weight/dense_2/kernel:0"])
    assert sorted(names(result)) == [
        ("dense/kernel:0", "sequential/dense_3/kernel:0", "map"),
        ("dense/kernel:0", "sequential/dense_3/kernel:0", "map"),
        ("dense_1/kernel:0", "sequential/dense_2/kernel:0", "map"),
    ]
    assert not result.warnings
    # a name that only drops ":0" is meant as is, even where it also ends another name; a kind where
    # the short name fits several still gets its warning when another kind paired (a review)
    scoped = [*base, series("weight", "enc/dense/kernel:0", steady(1), order=3)]
    both = align.align(scoped, cand, ["dense/kernel=dense_3/kernel"])
    assert ("dense/kernel:0", "sequential/dense_3/kernel:0", "map") in names(both)
    kernels = [*base, series("weight", "x/kernel:0", steady(1), order=3)]
    partly = align.align(kernels, cand, ["kernel=dense_3/kernel"])
    assert any(
        w.startswith("mapping 'kernel=dense_3/kernel' paired no tensor where 'kernel' fits 3 weight")
        for w in partly.warnings
    )
    vague = align.align(base, cand, ["weight/kernel=weight/dense_3/kernel"])
    assert vague.warnings[0] == (
        "mapping 'weight/kernel=weight/dense_3/kernel' paired no tensors: 'kernel' fits 2 weight tensors "
        "(dense/kernel:0, dense_1/kernel:0); give the full name"
    )


def test_a_mapping_across_kinds_says_why_it_paired_nothing() -> None:
    """A tensor is compared with one of its own kind: a mapping onto another kind's name says so."""
    base = [series("state", "w/avg", steady(1)), series("slot", "w/m", steady(1), order=1)]
    cand = [series("slot", "avg/w", steady(1)), series("slot", "m/w", steady(1), order=1)]
    result = align.align(base, cand, ["w/avg=avg/w"])
    assert ("state", "w/avg") in result.unmatched_base
    assert result.warnings == [
        "mapping 'w/avg=avg/w' paired no tensors: a mapping pairs tensors of one kind, and the candidate "
        "records its target under another (state/w/avg -> slot/avg/w)"
    ]


def test_align_fallback_by_order_and_shape_reports_unmatched() -> None:
    base = [
        series("lr", "lr", steady(1, ())),
        series("activation", "h1", steady(1, (4,)), order=1),
        series("activation", "h2", steady(1, (2,)), order=2),
    ]
    cand = [
        series("lr", "learning_rate", steady(1, ())),
        series("activation", "x", steady(1, (4,)), order=1),
        series("activation", "y", steady(1, (7,)), order=2),
        series("metric", "acc", steady(1, ()), order=3),
    ]
    result = align.align(base, cand)
    assert names(result) == [("lr", "learning_rate", "fallback"), ("h1", "x", "fallback")]
    assert result.unmatched_base == [("activation", "h2")]
    assert result.unmatched_cand == [("activation", "y"), ("metric", "acc")]


def test_align_never_crosses_kinds() -> None:
    result = align.align([series("weight", "w", steady(1))], [series("grad", "w", steady(1))])
    assert result.matches == [] and result.unmatched_base == [("weight", "w")]


# -- tolerance -----------------------------------------------------------------------
def test_default_policy_is_the_migration_guides() -> None:
    """A 1% relative difference fails during the 10 warm-up steps (atol 1e-5), passes after (rtol 5%)."""
    b = [np.full(3, 10.0, np.float32)] * 14
    c = [np.full(3, 10.1, np.float32)] * 14
    m = Comparison(run("b", [series("loss", "l", b)]), run("c", [series("loss", "l", c)])).matrix()
    assert m.reason[:, 0].tolist() == [VALUE] * 10 + [OK] * 4
    late = [np.full(3, 10.0, np.float32)] * 10
    report = compare_runs(run("b", [series("loss", "l", late + b[:4])]), run("c", [series("loss", "l", late + c[:4])]))
    assert report.agree


def test_overrides_by_kind_and_pattern() -> None:
    base = run(
        "b",
        [
            series("grad", "g", [np.ones(2, np.float32)] * 3),
            series("weight", "w", [np.ones(2, np.float32)] * 3, order=1),
        ],
    )
    cand = run(
        "c",
        [
            series("grad", "g", [np.full(2, 1.01, np.float32)] * 3),
            series("weight", "w", [np.full(2, 1.01, np.float32)] * 3, order=1),
        ],
    )
    policy = TolerancePolicy(overrides=(ToleranceOverride("grad/*", atol=0.1),))
    report = compare_runs(base, cand, policy)
    assert report.first_divergence.kind == "weight"
    both = TolerancePolicy.build(overrides=["grad/*:atol=0.1", "re:^weight/w$:warmup_steps=0,rtol=0.05"])
    assert compare_runs(base, cand, both).agree
    assert both.for_tag("weight/w").warmup_steps == 0 and both.for_tag("weight/v").warmup_steps == 10
    assert not [w for w in compare_runs(base, cand, both).warnings if "override" in w]


def test_a_pattern_that_matches_nothing_is_a_warning_not_silence() -> None:
    """A new user's ``--override 'weight/*kye/bias*:atol=1e-3'`` changed nothing and said nothing;
    an override in the candidate's names does not apply either (tolerances are the baseline's), and
    an ``allow_unmatched`` typo declares nothing."""
    base = run("b", [series("weight", "mha/key/bias:0", [np.ones(2, np.float32)] * 3)])
    cand = run("c", [series("weight", "key/bias", [np.full(2, 1.01, np.float32)] * 3)], side="tf2")
    policy = TolerancePolicy.build(
        overrides=["weight/*kye/bias*:atol=1e-3", "weight/key/*:atol=0.1", "weight/*key/bias*:atol=0.1"],
        allow_unmatched=["*lstm_cel*"],
    )
    report = compare_runs(base, cand, policy)
    assert report.agree  # the third override applies
    warned = [w for w in report.warnings if "matches no tensor" in w]
    assert len(warned) == 3, report.warnings
    assert "'weight/*kye/bias*'" in warned[0] and "changes nothing" in warned[0]
    assert "the candidate's weight/key/bias" in warned[1] and "baseline's tensors" in warned[1]
    assert "'*lstm_cel*'" in warned[2] and "declares nothing" in warned[2]


def test_a_kind_one_run_recorded_none_of_says_how_to_record_or_leave_it_out() -> None:
    """A new user's TF1 run recorded Adam's slots (``rec.variables(optimizer=opt)``) and the TF2 run,
    written from the README's shortest example, none: ten structure lines and no word of either
    remedy. The first line of the kind says it once, without calling it harmless (plain SGD where
    the other keeps a momentum is a real difference); one slot missing among others is not told so."""
    w = [np.ones(2, np.float32)] * 3
    slots = [series("slot", f"dense/kernel/Adam{s}:0", w, order=1 + i) for i, s in enumerate(("", "_1"))]
    base = run("tf1", [series("weight", "dense/kernel:0", w), *slots])
    cand = run("tf2", [series("weight", "dense/kernel:0", w)], side="tf2")
    report = compare_runs(base, cand)
    assert not report.agree and report.first_divergence.reason == "structure"
    told = [d.note for d in report.divergences_at_first_step if "recorded no slot at all" in (d.note or "")]
    assert len(told) == 1, [d.note for d in report.divergences_at_first_step]
    assert "rec.variables(optimizer=opt)" in told[0] and "plain SGD" in told[0] and "'slot/*'" in told[0]
    assert compare_runs(base, cand, TolerancePolicy.build(allow_unmatched=["slot/*"])).agree
    one_slot = run("tf2", [series("weight", "dense/kernel:0", w), series("slot", "m/dense/kernel", w, order=1)])
    notes = [d.note or "" for d in compare_runs(base, one_slot).divergences_at_first_step]
    assert notes and not any("at all" in n for n in notes), notes


def test_override_parse_errors() -> None:
    with pytest.raises(ValueError):
        ToleranceOverride.parse("grad/*:speed=3")
    with pytest.raises(ValueError, match="sets atol twice"):  # the last silently won
        ToleranceOverride.parse("grad/*:atol=1e-3,atol=1e-9")
    with pytest.raises(ValueError):
        TolerancePolicy(atol=-1.0)


# -- reasons ---------------------------------------------------------------------
def _reason_at(base_arrays: list, cand_arrays: list, **kw) -> list:
    m = Comparison(
        run("b", [series("weight", "w", base_arrays, **kw)]), run("c", [series("weight", "w", cand_arrays, **kw)])
    ).matrix()
    return m.reason[:, 0].tolist()


def test_reason_value_and_nonfinite() -> None:
    b = [np.array([1.0, 2.0, 3.0], np.float32)] * 3
    c = [b[0], np.array([1.0, 2.5, 3.0], np.float32), np.array([1.0, np.nan, 3.0], np.float32)]
    assert _reason_at(b, c) == [OK, VALUE, NONFINITE]
    # Same Inf at the same place passes; NaN fails with equal_nan=False even at the same place.
    inf = [np.array([np.inf, 1.0], np.float32)]
    assert _reason_at(inf, inf) == [OK]
    nan = [np.array([np.nan, 1.0], np.float32)]
    assert _reason_at(nan, nan) == [NONFINITE]
    cmp = Comparison(
        run("b", [series("w", "w", nan)]), run("c", [series("w", "w", nan)]), TolerancePolicy(equal_nan=True)
    )
    assert cmp.report().agree
    # Same counts, different positions: caught by the values.
    assert _reason_at([np.array([np.inf, 1.0], np.float32)], [np.array([1.0, np.inf], np.float32)]) == [NONFINITE]


def test_reason_shape_dtype_missing() -> None:
    shape = compare_runs(
        run("b", [series("w", "w", [np.ones((2, 3), np.float32)])]),
        run("c", [series("w", "w", [np.ones((3, 2), np.float32)])]),
    )
    assert shape.first_divergence.reason == "shape"
    dtype = compare_runs(
        run("b", [series("w", "w", [np.ones(3, np.float32)])]), run("c", [series("w", "w", [np.ones(3, np.float64)])])
    )
    assert dtype.first_divergence.reason == "dtype"
    # equal values (numpy: 0 apart): the note says the figures are not the reason (an error ratio of 0
    # beside "dtype" read as a contradiction to a new user)
    assert dtype.first_divergence.error_ratio == 0
    assert "dtype float32 in baseline vs float64 in candidate; the values agree within tolerance element-wise" in (
        dtype.first_divergence.note
    )
    # a new user's float16 activation, 288x past atol, was told its values agreed: its figures came
    # from statistics; they are the elements' when both runs kept them (numpy: 2.94e-3 apart)
    b32 = np.linspace(-1, 1, 16, dtype=np.float32)
    c16 = b32.astype(np.float16)
    c16[5] += np.float16(2.94e-3)
    half = compare_runs(run("b", [series("a", "h", [b32])]), run("c", [series("a", "h", [c16])])).first_divergence
    gap = float(np.abs(c16.astype(np.float64) - b32).max())
    assert half.reason == "dtype" and half.max_abs_diff == pytest.approx(gap) and half.error_ratio > 1
    assert "agree" not in half.note, half.note
    big = np.linspace(-1, 1, 5000, dtype=np.float32)  # statistics only: no claim about the elements
    stats = compare_runs(
        run("b", [series("a", "h", [big], keep_values=False)]),
        run("c", [series("a", "h", [big.astype(np.float16)], keep_values=False)]),
    ).first_divergence
    assert stats.reason == "dtype" and "proves nothing of its elements" in stats.note, stats.note
    # both runs logged step 1 (via another tensor), only the baseline logged w there
    base = run("b", [series("w", "w", [np.ones(2)] * 3), series("loss", "l", [np.ones(())] * 3, order=1)])
    cand = run("c", [series("w", "w", [np.ones(2)] * 2, steps=[0, 2]), series("loss", "l", [np.ones(())] * 3, order=1)])
    report = compare_runs(base, cand)
    assert (report.first_divergence.step, report.first_divergence.reason) == (1, "missing")
    assert report.first_divergence.max_abs_diff is None
    assert report.matrix().reason[:, 0].tolist() == [OK, MISSING, OK]


def test_steps_only_one_run_logged_are_not_compared() -> None:
    base = run("b", [series("w", "w", steady(5))])
    cand = run("c", [series("w", "w", steady(5)[2:] + steady(3, seed=9), steps=[2, 3, 4, 5, 6, 7])])
    report = compare_runs(base, cand)
    assert report.steps_compared == 3 and report.steps_only == {"b": 2, "c": 3}
    # b ends at step 4 and c logged 3 steps after it: not an agreement unless accepted
    assert report.verdict == "incomplete" and report.ended_early == {"b": {"last": 4, "other_last": 7, "steps": 3}}
    assert "'b' ends at step 4 and 'c' logged 3 step(s) after it" in report.verdict_text
    assert compare_runs(base, cand, TolerancePolicy(accept_fewer_steps=True)).agree


# -- ordering --------------------------------------------------------------------
def test_first_divergence_smallest_step_then_baseline_order() -> None:
    ok, bad = steady(6), steady(6)
    bad = bad[:3] + [a + 1 for a in bad[3:]]
    base = run(
        "b",
        [
            series("activation", "late", ok, order=0),
            series("weight", "w", ok, order=1),
            series("grad", "g", ok, order=2),
        ],
    )
    # candidate executes in another order; the baseline's order decides
    cand = run(
        "c",
        [
            series("activation", "late", ok, order=2),
            series("weight", "w", bad, order=1),
            series("grad", "g", bad, order=0),
        ],
    )
    report = compare_runs(base, cand)
    assert (report.first_divergence.step, report.first_divergence.tensor) == (3, "w")
    assert [d.tensor for d in report.divergences_at_first_step] == ["w", "g"]
    earlier = run(
        "c",
        [
            series("activation", "late", ok[:1] + [ok[1] + 5] + ok[2:], order=0),
            series("weight", "w", bad, order=1),
            series("grad", "g", bad, order=2),
        ],
    )
    report = compare_runs(base, earlier)
    assert (report.first_divergence.step, report.first_divergence.tensor) == (1, "late")


def test_first_nonfinite_per_run() -> None:
    clean = steady(5)
    dirty = [a.copy() for a in clean]
    dirty[3][1] = -np.inf
    also = [a.copy() for a in clean]
    also[3][0] = np.nan
    base = run("b", [series("weight", "w", clean)])
    cand = run(
        "c",
        [
            series("weight", "w", also, order=1),
            series("activation", "a", dirty, order=0),
            series("loss", "l", clean, order=2),
        ],
    )
    report = compare_runs(base, cand)
    assert report.first_nonfinite == {"b": None, "c": {"step": 3, "tensor": "a", "kind": "activation"}}


# -- statistics-only path ------------------------------------------------------------
def test_statistics_only_compares_moments() -> None:
    b = steady(12)
    c = [a.copy() for a in b]
    c[11] = c[11] * 1.5
    base = run("b", [series("weight", "w", b, keep_values=False)])
    cand = run("c", [series("weight", "w", c, keep_values=False)])
    report = compare_runs(base, cand)
    d = report.first_divergence
    assert (d.step, d.reason, d.cosine) == (11, "value", None)
    # issue 9: "mismatch" exists only where full values were compared; the statistics prove it instead
    assert d.mismatch_fraction is None and d.evidence == "statistics" and d.error_ratio > 1 and "proves" in d.note
    # the same data with values gives the same step, now with a cosine
    full = compare_runs(run("b", [series("weight", "w", b)]), run("c", [series("weight", "w", c)]))
    assert full.first_divergence.step == 11 and full.first_divergence.cosine == pytest.approx(1.0)
    # one side without values: falls back to the moments
    mixed = compare_runs(run("b", [series("weight", "w", b)]), cand)
    assert mixed.first_divergence.step == 11 and mixed.first_divergence.cosine is None


def test_report_json_has_only_finite_numbers() -> None:
    b = [np.array([0.0, 1.0], np.float32)] * 2
    c = [np.array([1.0, 1.0], np.float32), np.array([np.inf, np.nan], np.float32)]
    report = compare_runs(
        run("b", [series("w", "w", b)]), run("c", [series("w", "w", c)]), TolerancePolicy(atol=0.0, rtol=0.0)
    )
    text = json.dumps(report.to_dict(), allow_nan=False)
    d = json.loads(text)["first_divergence"]
    assert d["step"] == 0 and d["max_rel_diff"] is None and d["error_ratio"] is None and d["max_abs_diff"] == 1.0
    json.dumps(report.detail("w/w", 1).to_dict(), allow_nan=False)
    json.dumps(report.matrix().to_dict(), allow_nan=False)


# -- matrix ------------------------------------------------------------------------
def test_matrix_columns_and_bucketing_keep_first_divergence() -> None:
    n = 100
    ok = steady(n)
    bad = [a + (3.0 if k == 37 else 0.0) for k, a in enumerate(ok)]
    worse = [a + (9.0 if k >= 80 else 0.0) for k, a in enumerate(ok)]
    base = run("b", [series("weight", "w", ok, order=0), series("grad", "g", ok, order=1)])
    cand = run("c", [series("weight", "w", worse, order=0), series("grad", "g", bad, order=1)])
    cmp = Comparison(base, cand)
    m = cmp.matrix()
    assert m.tensors == ["weight/w", "grad/g"] and m.reason.shape == (n, 2) and m.error_ratio.dtype == np.float32
    assert m.first_divergence == (37, 1)
    assert m.error_ratio[37, 1] > 1 and m.error_ratio[36, 1] == 0
    for rows in (1, 3, 7, 10, 64):
        bm = m.bucketed(rows)
        assert len(bm.step_start) <= rows
        row, col = bm.first_divergence
        assert bm.step_start[row] <= 37 <= bm.step_end[row] and col == 1
        assert bm.reason[row, 1] == VALUE and bm.error_ratio[row, 1] >= m.error_ratio[37, 1]
    one = m.bucketed(1)
    assert one.reason[0].tolist() == [VALUE, VALUE] and one.error_ratio[0, 0] == np.nanmax(m.error_ratio[:, 0])
    assert isinstance(cmp.matrix(max_steps=10), ParityMatrix)


def test_detail_series_and_values() -> None:
    b = steady(4, (2, 2))
    c = [a.copy() for a in b]
    c[2][1, 0] += 1
    detail = Comparison(run("b", [series("weight", "w", b)]), run("c", [series("weight", "w", c)])).detail(
        "weight/w", 2
    )
    assert detail.reason.tolist() == [OK, OK, VALUE, OK]
    assert detail.diff.shape == (2, 2) and detail.diff[1, 0] == pytest.approx(1.0)
    assert detail.base_stats.shape == (4, 14) and detail.figures["max_abs_diff"] == pytest.approx(1.0)


# -- incremental refresh (real reader) ---------------------------------------------------
def _tensors(step: int, bad_from: int = 10**9) -> list:
    rng = np.random.default_rng(step)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    return [("lr", "lr", np.float32(0.1)), ("weight", "dense/kernel:0", w), ("loss", "loss", np.float32(step))]


def test_incremental_refresh_equals_cold_compare(tmp_path, monkeypatch) -> None:
    logdir = str(tmp_path)

    def cand_at(step: int) -> list:
        t = _tensors(step)
        if step >= 70:
            t[1] = ("weight", "simple_model/dense/kernel:0", t[1][2] * 1.2)
        else:
            t[1] = ("weight", "simple_model/dense/kernel:0", t[1][2])
        return t

    write_run(logdir, "tf1", range(50), _tensors, side="tf1")
    write_run(logdir, "tf2", range(50), cand_at, side="tf2")
    reader = LogdirReader(logdir)
    reader.reload()
    cmp = Comparison(reader.run("tf1"), reader.run("tf2"))
    assert cmp.report().agree
    cmp.matrix()
    # append 50 steps to each run (a second event file, as a restarted writer would)
    write_run(logdir, "tf1", range(50, 100), _tensors, side="tf1")
    write_run(logdir, "tf2", range(50, 100), cand_at, side="tf2")
    assert reader.reload()
    computed = []
    from tb_parity_plugin.engine import pair as pair_module

    original = pair_module.Pair.verdicts

    def spy(self, k0, k1, equal_nan):
        computed.append((k0, k1))
        return original(self, k0, k1, equal_nan)

    monkeypatch.setattr(pair_module.Pair, "verdicts", spy)
    cmp.update(reader.run("tf1"), reader.run("tf2"))
    warm = cmp.report()
    assert computed and all(k0 >= 50 for k0, _ in computed)  # only the new steps
    cold = compare_runs(reader.run("tf1"), reader.run("tf2"))
    assert warm.to_dict() == cold.to_dict()
    assert warm.first_divergence.step == 70
    warm_m, cold_m = cmp.matrix(), Comparison(reader.run("tf1"), reader.run("tf2")).matrix()
    np.testing.assert_array_equal(warm_m.reason, cold_m.reason)
    np.testing.assert_array_equal(warm_m.error_ratio, cold_m.error_ratio)
    reader.close()


def test_rewritten_step_invalidates_cache() -> None:
    b = steady(6)
    cmp = Comparison(run("b", [series("w", "w", b)]), run("c", [series("w", "w", b)]))
    assert cmp.report().agree
    changed = [a.copy() for a in b]
    changed[2] = changed[2] + 1
    cmp.update(run("b", [series("w", "w", b)]), run("c", [series("w", "w", changed)]))
    assert cmp.report().first_divergence.step == 2


def test_rewrite_keeping_the_l2_norm_invalidates_cache() -> None:
    """Flipped signs keep the L2 norm: the refresh must compare every statistic."""
    b = steady(6)
    cmp = Comparison(run("b", [series("w", "w", b)]), run("c", [series("w", "w", b)]))
    assert cmp.report().agree
    changed = [a.copy() for a in b]
    changed[3] = -changed[3]
    cmp.update(run("b", [series("w", "w", b)]), run("c", [series("w", "w", changed)]))
    assert cmp.report().first_divergence.step == 3
    assert (
        compare_runs(run("b", [series("w", "w", b)]), run("c", [series("w", "w", changed)])).first_divergence.step == 3
    )


def test_first_nonfinite_sees_a_rewritten_step() -> None:
    b = steady(6)
    cmp = Comparison(run("b", [series("w", "w", b)]), run("c", [series("w", "w", b)]))
    assert cmp.report().first_nonfinite == {"b": None, "c": None}
    changed = [a.copy() for a in b]
    changed[1][0] = np.nan
    cmp.update(run("b", [series("w", "w", b)]), run("c", [series("w", "w", changed)]))
    assert cmp.report().first_nonfinite["c"] == {"step": 1, "tensor": "w", "kind": "w"}


def test_detail_resolves_tags_before_names() -> None:
    """An activation *named* ``grad/w`` must not shadow the gradient whose tag is ``grad/w``."""
    grad, act = steady(4, seed=1), steady(4, scale=3.0, seed=2)
    tensors = [series("activation", "grad/w", act, order=0), series("grad", "w", grad, order=1)]
    cmp = Comparison(run("b", tensors), run("c", tensors))
    assert cmp.detail("grad/w").to_dict()["kind"] == "grad"
    assert cmp.detail("activation/grad/w").to_dict()["kind"] == "activation"


def test_cache_keeps_no_lock_for_failed_queries_and_keeps_the_comparison_on_a_failing_view() -> None:
    from tb_parity_plugin.engine.comparison_cache import ComparisonCache

    b = steady(4)
    base, cand = run("b", [series("w", "w", b)]), run("c", [series("w", "w", b)])
    cache = ComparisonCache()
    for i in range(20):  # malformed mappings: Comparison raises, nothing is stored
        with pytest.raises(ValueError):
            cache.use(("bad", i), base, cand, TolerancePolicy(), (f"re:({i}=x",), lambda e: e)
    assert cache._locks == {} and cache.computed == 0

    def missing_tensor(entry):
        raise KeyError("no such tensor")

    with pytest.raises(KeyError):
        cache.use("ok", base, cand, TolerancePolicy(), (), missing_tensor)
    assert cache.use("ok", base, cand, TolerancePolicy(), (), lambda e: e.report.agree)
    assert cache.computed == 1  # the 404 did not throw the comparison away


# -- alignment checks shapes (issue 9 section 4) ---------------------------------------
def _swapped_layers() -> tuple:
    """The guide's 3-2-2-3 dense model; the port creates its first two layers in the other order,
    so Keras names them the other way round (``dense`` is its second layer)."""
    rng = np.random.default_rng(0)
    shapes = [((3, 2), (2,)), ((2, 2), (2,)), ((2, 3), (3,))]
    weights = [
        (rng.standard_normal(k).astype(np.float32), rng.standard_normal(b).astype(np.float32)) for k, b in shapes
    ]
    tf1_names = ["dense", "dense_1", "dense_2"]
    port_names = {0: "dense_1", 1: "dense", 2: "dense_2"}
    base, order = [], 0
    for i, (k, b) in enumerate(weights):
        base += [
            series("weight", f"{tf1_names[i]}/kernel:0", [k], order=order),
            series("weight", f"{tf1_names[i]}/bias:0", [b], order=order + 1),
        ]
        order += 2
    cand, order = [], 0
    for i in (1, 0, 2):  # the port's creation order, in which its variables are listed
        k, b = weights[i]
        cand += [
            series("weight", f"simple_model/{port_names[i]}/kernel:0", [k], order=order),
            series("weight", f"simple_model/{port_names[i]}/bias:0", [b], order=order + 1),
        ]
        order += 2
    return base, cand, port_names


def test_layers_created_in_another_order_pair_by_shape_and_scope() -> None:
    base, cand, port_names = _swapped_layers()
    report = compare_runs(run("b", base), run("c", cand))
    assert report.agree, report.first_divergence  # a faithful port: no shape divergence, no value divergence
    pairs = {m["baseline"]: m["candidate"] for m in report.mapping}
    for i, tf1 in enumerate(["dense", "dense_1", "dense_2"]):
        for leaf in ("kernel:0", "bias:0"):  # the bias follows its kernel, though both biases are (2,)
            assert pairs[f"{tf1}/{leaf}"] == f"simple_model/{port_names[i]}/{leaf}"


def test_ambiguous_same_shape_tensors_stay_unmatched_with_their_candidates() -> None:
    base = [series("activation", f"a{i}", [np.full(4, i, np.float32)], order=i) for i in range(2)]
    cand = [series("activation", f"x{i}", [np.full(4, i, np.float32)], order=i) for i in range(3)]
    result = align.align(base, cand)
    assert result.matches == []  # 2 against 3 of the same kind and shape: never paired blindly
    assert result.candidates == {
        ("activation", "a0"): [("activation", f"x{i}") for i in range(3)],
        ("activation", "a1"): [("activation", f"x{i}") for i in range(3)],
    }


def test_the_candidates_listed_for_an_unmatched_tensor_are_those_still_free() -> None:
    """TF1's RMSProp with momentum keeps two slots a variable (``RMSProp``, ``RMSProp_1``), Keras'
    RMSprop without momentum one (``velocity``). Same kind and shape, 2 against 1: the shape stage
    lists ``velocity`` as a possible partner of both; a later stage pairs it with ``RMSProp``
    (its variable's). The report then named a compared slot as an "ambiguous" partner of the
    unmatched ``RMSProp_1``, which misled a new user: a paired tensor is no one's candidate."""
    base, cand, order = [], [], 0
    for tf1, tf2, shape in (("fc1", "dense", (3, 4)), ("fc2", "dense_1", (4, 2))):
        k = np.ones(shape, np.float32)
        base += [
            series("weight", f"{tf1}/kernel:0", [k], order=order),
            series("slot", f"{tf1}/kernel/RMSProp:0", [k * 0.1], order=order + 1),
            series("slot", f"{tf1}/kernel/RMSProp_1:0", [k * 0.2], order=order + 2),
        ]
        cand += [
            series("weight", f"{tf2}/kernel:0", [k], order=order),
            series("slot", f"velocity/{tf2}/kernel", [k * 0.1], order=order + 1),
        ]
        order += 3
    result = align.align(base, cand)
    paired = {m.base[1]: m.cand[1] for m in result.matches}
    assert paired["fc1/kernel/RMSProp:0"] == "velocity/dense/kernel"
    assert paired["fc2/kernel/RMSProp:0"] == "velocity/dense_1/kernel"
    assert result.unmatched_base == [("slot", "fc1/kernel/RMSProp_1:0"), ("slot", "fc2/kernel/RMSProp_1:0")]
    assert result.candidates == {}


def test_no_automatic_stage_pairs_different_shapes() -> None:
    base = [series("weight", "dense/kernel:0", [np.ones((3, 2), np.float32)])]
    cand = [series("weight", "model/dense/kernel:0", [np.ones((2, 2), np.float32)])]
    result = align.align(base, cand)
    assert result.matches == [] and result.unmatched_base == [("weight", "dense/kernel:0")]
    mapped = align.align(base, cand, ["dense/kernel:0=model/dense/kernel:0"])
    assert [m.how for m in mapped.matches] == ["map"] and "different shapes" in mapped.warnings[0]


# -- structure parity (issue 9 section 5) -------------------------------------------
def _bn_model(scale: bool, twice: bool = False) -> list:
    """Weights of a dense + batch-norm layer, TF1 names; ``scale=False`` drops gamma."""
    ones = [np.ones(2, np.float32)]
    out = [
        series("weight", "dense/kernel:0", [np.ones((3, 2), np.float32)]),
        series("weight", "dense/bias:0", ones, order=1),
    ]
    if scale:
        out.append(series("weight", "batch_normalization/gamma:0", ones, order=2))
    out.append(series("weight", "batch_normalization/beta:0", ones, order=3))
    if twice:  # the layer function called again without reuse: a second set of variables
        out.append(series("weight", "dense_3/kernel:0", [np.ones((3, 2), np.float32)], order=4))
    out.append(series("loss", "loss", [np.ones((), np.float32)], order=5))
    return out


def test_a_variable_missing_on_one_side_is_a_structure_divergence_reported_first() -> None:
    report = compare_runs(run("b", _bn_model(scale=True)), run("c", _bn_model(scale=False)))
    first = report.first_divergence
    assert not report.agree and first.reason == "structure" and first.tensor == "batch_normalization/gamma:0"
    assert "baseline 'b' only" in first.note and first.evidence == "layout"
    st = report.to_dict()["structure"]
    assert [e["tag"] for e in st["only_in"]["b"]] == ["weight/batch_normalization/gamma:0"] and st["only_in"]["c"] == []
    assert st["variables"] == {"b": {"count": 4, "size": 12}, "c": {"count": 3, "size": 10}}
    assert report.first_step_divergence is None  # every compared step agrees
    # declared expected: no longer a divergence, still listed
    allowed = compare_runs(
        run("b", _bn_model(scale=True)),
        run("c", _bn_model(scale=False)),
        TolerancePolicy(allow_unmatched=("*/gamma*",)),
    )
    assert allowed.agree and allowed.to_dict()["structure"]["only_in"]["b"][0]["expected"] is True
    # the agreement says what it left out (two new users read "every tensor compared" as all of them)
    assert allowed.verdict_text.endswith(
        "; not compared: 1 tensor(s) recorded by one run only and declared expected (allow_unmatched), "
        "first weight/batch_normalization/gamma:0: compare what they compute another way"
    ), allowed.verdict_text


def test_a_variable_created_twice_is_named() -> None:
    report = compare_runs(run("b", _bn_model(scale=True)), run("c", _bn_model(scale=True, twice=True)))
    assert (
        report.first_divergence.reason == "structure" and report.first_divergence.candidate_tensor == "dense_3/kernel:0"
    )
    assert "created twice" in report.first_divergence.note
    assert report.structure["created_twice"]["c"] == [
        {"tag": "weight/dense_3/kernel:0", "like": "weight/dense/kernel:0"}
    ]


def test_a_slot_of_another_layers_same_shaped_bias_is_not_created_twice() -> None:
    """A slot is placed under its variable's layer: the Adam slot of an attention's ``query/bias``
    (recorded by one run only) repeats no ``input_proj/bias`` slot of the same shape (a new user's
    faithful attention port got 16 such notes). The same layer built twice is still named."""
    v = [np.ones(4, np.float32)]

    def tensors(extra: bool) -> list:
        out = [
            series("weight", "input_proj/bias:0", v),
            series("slot", "input_proj/bias/Adam:0", v, order=1),
            series("weight", "attention/query/bias:0", v, order=2),
        ]
        if extra:  # recorded by the candidate only
            out.append(series("slot", "attention/query/bias/Adam:0", v, order=3))
            out.append(series("slot", "input_proj_1/bias/Adam:0", v, order=4))  # the layer built again
        return out

    report = compare_runs(run("b", tensors(False)), run("c", tensors(True)))
    assert report.structure["created_twice"]["c"] == [
        {"tag": "slot/input_proj_1/bias/Adam:0", "like": "slot/input_proj/bias/Adam:0"}
    ]


def test_layers_of_one_type_under_other_scopes_are_not_created_twice() -> None:
    """BERT's ``attention/output/dense`` and ``output/dense`` are two layers: a new user's faithful
    port, before its --map, was asked whether the first repeated the second. A layer built twice
    differs from its twin by ``_N`` suffixes only (``block_1/dense`` beside ``block/dense``)."""
    v = [np.ones(4, np.float32)]
    base = [series("weight", "output/dense/bias:0", v)]
    only = [
        series("weight", "attention/output/dense/bias:0", v, order=1),
        series("weight", "block_1/output/dense/bias:0", v, order=2),
    ]
    report = compare_runs(run("b", base), run("c", [*base, *only]))
    assert report.structure["created_twice"]["c"] == []
    twice = [series("weight", "block/dense/bias:0", v), series("weight", "block_1/dense/bias:0", v, order=1)]
    report = compare_runs(run("b", twice[:1]), run("c", twice))
    assert report.structure["created_twice"]["c"] == [
        {"tag": "weight/block_1/dense/bias:0", "like": "weight/block/dense/bias:0"}
    ]


# -- pairs of one layout settled together (engine/batch.py) ------------------------------
def _layout_run(step: int, nan_at: int = -1, bad: tuple[str, int] = ("", -1)) -> list:
    """Statistics-only tensors of one layout; ``bad`` = (name, step) scaled from that step on."""
    rng = np.random.default_rng(step)
    out = []
    for i in range(6):
        a = rng.standard_normal(40).astype(np.float32)
        if f"t{i}" == bad[0] and step >= bad[1]:
            a = a * np.float32(1.5)
        if i == 2 and step == nan_at:
            a[3] = np.nan
        out.append(("weight", f"t{i}", a))
    return out


class _PerPair:
    """The engine before layouts were settled together (``batch.ENABLED`` off): each call's
    result, computed with the switch off, so a difference from the default path shows."""

    def __init__(self, base, cand, policy: TolerancePolicy = TolerancePolicy()) -> None:
        with _batching(False):
            self._cmp = Comparison(base, cand, policy)

    def report(self):
        with _batching(False):
            return self._cmp.report()

    def matrix(self):
        with _batching(False):
            return self._cmp.matrix()


@contextlib.contextmanager
def _batching(on: bool):
    before, batch.ENABLED = batch.ENABLED, on
    try:
        yield
    finally:
        batch.ENABLED = before


def _drifting_run(step: int, scale: dict[str, float]) -> list:
    """Statistics-only weights and grads of one layout, each multiplied by its ``scale`` (1 if absent)."""
    rng = np.random.default_rng(step)
    out = []
    for i in range(8):
        kind, name = ("weight" if i < 4 else "grad"), f"t{i}"
        a = rng.standard_normal(60).astype(np.float32)
        out.append((kind, name, (a * np.float32(scale.get(name, 1.0))).astype(np.float32)))
    return out


def test_a_layout_whose_statistics_all_differ_is_bounded_together_as_the_per_pair_path_bounds_it(tmp_path) -> None:
    """After a divergence nearly every tensor differs: such pairs of one layout are bounded as one
    array (engine/batch.py), each with its own tolerance (grads by an override, warm-up included),
    and get every verdict and ratio of the per-pair path, refreshed too. Checked against numpy:
    a cell whose elements all pass ``isclose`` is OK (no divergence is made up), and t5 scaled by
    1.5 from step 12 is a VALUE divergence from there (its max moved by half its size)."""
    logdir = str(tmp_path)
    # Every candidate tensor off by a little (t1 beyond the warm-up's rtol 1e-7, within rtol after),
    # t5 (a grad) off by half from step 12 on, t6 off by 8% (within the grads' override, 0.1).
    drift = {"t0": 1 + 1e-6, "t1": 1 + 2e-3, "t2": 1 - 1e-5, "t3": 1 + 3e-7, "t4": 1 + 1e-3, "t6": 1.08, "t7": 1 - 2e-3}

    def cand_at(s: int) -> list:
        return _drifting_run(s, {**drift, **({"t5": 1.5} if s >= 12 else {})})

    write_run(logdir, "b", range(16), lambda s: _drifting_run(s, {}), limit=0)
    write_run(logdir, "c", range(16), cand_at, limit=0)
    policy = TolerancePolicy(warmup_steps=3, overrides=(ToleranceOverride("grad/*", rtol=0.1, warmup_steps=0),))
    reader = LogdirReader(logdir)
    reader.reload()
    b, c = reader.run("b"), reader.run("c")
    batched, plain = Comparison(b, c, policy), _PerPair(b, c, policy)
    assert [len(g) for g in batched._groups] == [8]
    assert batched.report().to_dict() == plain.report().to_dict()
    mb, mp = batched.matrix(), plain.matrix()
    np.testing.assert_array_equal(mb.reason, mp.reason)
    np.testing.assert_array_equal(mb.error_ratio, mp.error_ratio)
    for k, step in enumerate(mb.steps.tolist()):
        base, cand = _drifting_run(step, {}), cand_at(step)
        for (kind, name, bv), (_, _, cv) in zip(base, cand):
            tol = policy.for_tag(f"{kind}/{name}")
            col = mb.tensors.index(f"{kind}/{name}")
            if np.isclose(cv, bv, rtol=tol.rtol_at(step - int(mb.steps[0])), atol=tol.atol).all():
                assert mb.reason[k, col] == OK, (step, name)
    col5 = mb.tensors.index("grad/t5")
    assert (mb.reason[12:, col5] == VALUE).all() and (mb.reason[:12, col5] == OK).all()
    assert (mb.reason[:3, mb.tensors.index("weight/t1")] == VALUE).all()  # 2e-3 with rtol 1e-7: proven
    assert (mb.error_ratio[:, mb.tensors.index("weight/t1")] > 0).all()  # bounded, not identical
    assert batched.report().first_divergence.step == 0  # the warm-up's rtol 1e-7 proves t1 off
    # a refresh: 4 more steps, both ways
    write_run(logdir, "b", range(16, 20), lambda s: _drifting_run(s, {}), limit=0)
    write_run(logdir, "c", range(16, 20), cand_at, limit=0)
    _refresh_matches_fresh(batched, reader, lambda b, c: _PerPair(b, c, policy))


@pytest.mark.parametrize("equal_nan", [False, True])
def test_a_layout_settled_together_matches_the_per_pair_path(tmp_path, equal_nan: bool) -> None:
    """Steps one side lacks, a NaN in both runs, a tensor diverging at step 30, a step rewritten
    (last write wins: the block is then a gathered copy) and a refresh: every verdict, ratio and
    the first divergence are those of the per-pair path, and the cells of the tensors written
    identically are what was written (OK; NONFINITE at the NaN unless equal_nan)."""
    logdir = str(tmp_path)
    base_steps, cand_steps = list(range(40)), [s for s in range(40) if s not in (7, 8)]
    write_run(logdir, "b", base_steps, lambda s: _layout_run(s, nan_at=12), limit=0)
    write_run(logdir, "c", cand_steps, lambda s: _layout_run(s, nan_at=12, bad=("t4", 30)), limit=0)
    rewrite = write_run(logdir, "c", [5], lambda s: _layout_run(s, bad=("t1", 0)), limit=0)  # t1 differs at 5
    os.rename(rewrite, _rewrite_path(os.path.join(logdir, "c"), "rewrite"))  # sorts last: wins
    policy = TolerancePolicy(equal_nan=equal_nan)
    reader = LogdirReader(logdir)
    reader.reload()
    b, c = reader.run("b"), reader.run("c")
    assert b.tensors[("weight", "t0")].block is not None
    batched, plain = Comparison(b, c, policy), _PerPair(b, c, policy)
    assert batched._groups and len(batched._groups[0]) == 6
    assert batched.report().to_dict() == plain.report().to_dict()
    mb, mp = batched.matrix(), plain.matrix()
    np.testing.assert_array_equal(mb.reason, mp.reason)
    np.testing.assert_array_equal(mb.error_ratio, mp.error_ratio)
    steps = np.asarray(batched.steps)
    np.testing.assert_array_equal(steps, np.intersect1d(base_steps, cand_steps))  # 7 and 8: one run only
    assert (mb.reason[:, mb.tensors.index("weight/t0")] == OK).all()
    expected = np.full(len(steps), OK)
    if not equal_nan:  # assert_allclose(equal_nan=False): NaN is a divergence even against NaN
        expected[steps == 12] = NONFINITE
    np.testing.assert_array_equal(mb.reason[:, mb.tensors.index("weight/t2")], expected)
    first = batched.report().first_divergence
    assert (first.step, first.tensor) == (5, "t1")  # the rewritten step, before the missing 7 and 8
    # a refresh appending steps settles the new rows alike
    write_run(logdir, "b", range(40, 60), _layout_run, limit=0)
    write_run(logdir, "c", range(40, 60), lambda s: _layout_run(s, bad=("t4", 30)), limit=0)
    _refresh_matches_fresh(batched, reader, lambda b, c: _PerPair(b, c, policy))
    reader.close()


def _rewrite_path(run_dir: str, tail: str) -> str:
    """A name for a file that rewrites steps of ``run_dir``: the time of its first file (the same
    second: a rewrite, last write wins, not a restart that supersedes the later steps), sorting
    after it."""
    first = min(n.split(".")[3] for n in os.listdir(run_dir) if n.startswith("events.out.tfevents."))
    return os.path.join(run_dir, f"events.out.tfevents.{first}.~{tail}")


def _refresh_matches_fresh(cmp: Comparison, reader: LogdirReader, fresh_of: Callable[..., Any] = Comparison) -> None:
    """Reload runs b and c and refresh ``cmp``: its report, verdicts and ratios are those of
    ``fresh_of(b, c)`` (a fresh comparison, or the per-pair path) on the new snapshots."""
    reader.reload()
    b, c = reader.run("b"), reader.run("c")
    cmp.update(b, c)
    fresh = fresh_of(b, c)
    assert cmp.report().to_dict() == fresh.report().to_dict()
    np.testing.assert_array_equal(cmp.matrix().reason, fresh.matrix().reason)
    np.testing.assert_array_equal(cmp.matrix().error_ratio, fresh.matrix().error_ratio)


def _agreeing_pair(
    logdir: str,
    steps: range = range(20),
    base: Callable[[int], list] = _layout_run,
    cand: Callable[[int], list] = _layout_run,
) -> tuple[LogdirReader, Comparison]:
    """Runs b and c (statistics only, one layout), read and compared: they agree over ``steps``."""
    write_run(logdir, "b", steps, base, limit=0)
    write_run(logdir, "c", steps, cand, limit=0)
    reader = LogdirReader(logdir)
    reader.reload()
    cmp = Comparison(reader.run("b"), reader.run("c"))
    assert cmp.report().agree
    return reader, cmp


def test_a_refresh_keeps_pairs_only_while_their_inputs_are_unchanged(tmp_path) -> None:
    """Pairs grown in place on a refresh (engine/comparison.py) give what a fresh comparison
    gives after: plain appends, an old step rewritten by a later file (last write wins), a
    tensor whose shape changes mid-run (a second layout), and full values appearing."""
    logdir = str(tmp_path)
    reader, cmp = _agreeing_pair(logdir)
    cmp.matrix()
    write_run(logdir, "b", range(20, 30), _layout_run, limit=0)
    write_run(logdir, "c", range(20, 30), _layout_run, limit=0)
    _refresh_matches_fresh(cmp, reader)
    assert cmp.report().agree and cmp.report().steps_compared == 30
    rewrite = write_run(logdir, "c", [3], lambda s: _layout_run(s, bad=("t5", 0)), limit=0)
    os.rename(rewrite, _rewrite_path(os.path.join(logdir, "c"), "rewrite"))
    _refresh_matches_fresh(cmp, reader)
    first = cmp.report().first_divergence
    assert (first.step, first.tensor) == (3, "t5")

    def wider(step: int) -> list:
        return [(k, n, np.resize(a, 48) if n == "t0" else a) for k, n, a in _layout_run(step)]

    write_run(logdir, "b", range(30, 35), wider, limit=0)
    write_run(logdir, "c", range(30, 35), wider, limit=0)
    _refresh_matches_fresh(cmp, reader)
    write_run(logdir, "b", range(35, 40), _layout_run, limit=4096)  # full values from step 35 on
    write_run(logdir, "c", range(35, 40), _layout_run, limit=4096)
    _refresh_matches_fresh(cmp, reader)
    assert cmp.report().first_divergence.step == 3
    reader.close()


def test_refreshes_that_outgrow_the_verdict_table_keep_every_verdict_and_every_matrix(tmp_path) -> None:
    """Refreshes growing a run from 10 to 120 steps (past the verdict table's slack, twice): the
    divergence planted at step 50 and the NaN planted at step 70 are found when they arrive, by the
    comparison refreshed in place and by one that started from another comparison's cached NaN/Inf
    scan; the matrices handed out before a refresh are read-only and unchanged by it."""
    logdir = str(tmp_path)

    def base_at(step: int) -> list:
        return _layout_run(step, nan_at=70)

    def cand_at(step: int) -> list:
        return _layout_run(step, nan_at=70, bad=("t4", 50))

    reader, cmp = _agreeing_pair(logdir, range(10), base_at, cand_at)
    other = Comparison(reader.run("b"), reader.run("c"))  # reads the NaN/Inf answer cmp cached in the snapshots
    assert other.report().first_nonfinite == {"b": None, "c": None}
    kept = [cmp.matrix()]
    copies = [(kept[0].reason.copy(), kept[0].error_ratio.copy())]
    nan = {"step": 70, "tensor": "t2", "kind": "weight"}
    for lo, hi in ((10, 60), (60, 120)):
        write_run(logdir, "b", range(lo, hi), base_at, limit=0)
        write_run(logdir, "c", range(lo, hi), cand_at, limit=0)
        reader.reload()
        b, c = reader.run("b"), reader.run("c")
        for comparison in (cmp, other):
            comparison.update(b, c)
        report, fresh = cmp.report(), Comparison(b, c).report()
        assert report.to_dict() == fresh.to_dict() == other.report().to_dict()
        assert (report.first_divergence.step, report.first_divergence.tensor) == (50, "t4")
        assert report.first_nonfinite == ({"b": nan, "c": nan} if hi > 70 else {"b": None, "c": None})
        m = cmp.matrix()
        np.testing.assert_array_equal(m.reason, fresh.matrix().reason)
        np.testing.assert_array_equal(m.error_ratio, fresh.matrix().error_ratio)
        column = m.reason[:, m.tensors.index("weight/t4")]
        assert (column[:50] == OK).all() and (column[50:] == VALUE).all()
        for old, (reason, ratio) in zip(kept, copies):
            np.testing.assert_array_equal(old.reason, reason)
            np.testing.assert_array_equal(old.error_ratio, ratio)
            assert not old.reason.flags.writeable and not old.error_ratio.flags.writeable
        kept.append(m)
        copies.append((m.reason.copy(), m.error_ratio.copy()))
    reader.close()


def test_a_rerun_whose_layout_is_wider_by_a_replica_copy_is_compared_tensor_by_tensor(tmp_path) -> None:
    """The candidate is run again (its directory replaced) with a replica copy in its layout: the
    compared tensors keep their names and columns but the layout block is one wider, so blocks can
    not be compared whole. t1 now differs from step 3 on (x1.5: its min/max/L2 prove it); t0 does
    not. A refresh that answered for the layout from t0's own rows kept t1's old AGREE."""
    from tb_parity_plugin.records import metadata

    logdir = str(tmp_path)
    reader, cmp = _agreeing_pair(logdir)
    cmp.matrix()

    def rerun(step: int) -> list:
        tensors = _layout_run(step, bad=("t1", 3))
        return tensors + [("weight", f"t0{metadata.REPLICA_MARK}0", tensors[0][2])]

    write_run(logdir, "b", range(20, 30), _layout_run, limit=0)
    shutil.rmtree(os.path.join(logdir, "c"))
    write_run(logdir, "c", range(30), rerun, limit=0)
    reader.reload()
    b, c = reader.run("b"), reader.run("c")
    assert c.tensors[("weight", "t1")].block.shape[1] == 7 and c.tensors[("weight", "t1")].column == 1
    cmp.update(b, c)
    first = cmp.report().first_divergence
    assert (first.step, first.tensor, first.reason) == (3, "t1", "value")
    assert cmp.report().to_dict() == Comparison(b, c).report().to_dict()
    reader.close()


@pytest.mark.parametrize("limit", [4096, 0], ids=["values", "statistics"])
def test_a_slot_is_compared_at_its_own_scale(tmp_path, limit: int) -> None:
    """A momentum element that cancels carries the float32 rounding of the gradients it summed:
    a faithful Keras port of MomentumOptimizer differed by 3.5e-8 on an element of 2e-4 whose
    neighbours were 0.3, and was reported DIVERGE. Slots now allow 1e-4 of their largest element
    at the step besides their own 1e-4: that difference agrees, and a slot 1% off its scale (another
    momentum) still diverges at the step it starts. Expectations from numpy with the documented
    rule ``|c - b| <= atol*1e-3 + 1e-4*|b| + 1e-4*max|b|``."""
    base = np.array([0.3, 2e-4, -0.25, 0.01], np.float32)
    noisy = base.copy()
    noisy[1] += np.float32(3.5e-8)
    off = (base * np.float32(1.01)).astype(np.float32)

    def at(step: int, slot: np.ndarray) -> list:
        return [("weight", "w", base), ("slot", "w/Momentum", slot)]

    write_run(str(tmp_path), "b", range(4), lambda s: at(s, base), limit=limit)
    write_run(str(tmp_path), "c", range(4), lambda s: at(s, noisy if s < 2 else off), limit=limit)

    def passes(c: np.ndarray, b: np.ndarray) -> bool:
        allowed = 1e-5 * 1e-3 + 1e-4 * np.abs(b.astype(np.float64)) + 1e-4 * np.abs(b).max()
        return bool((np.abs(c.astype(np.float64) - b) <= allowed).all())

    assert passes(noisy, base) and not passes(off, base)
    assert np.abs(noisy[1] - base[1]) > 1e-5 * 1e-3 + 1e-4 * abs(base[1])  # the old rule failed it
    reader = LogdirReader(str(tmp_path))
    reader.reload()
    report = compare_runs(reader.run("b"), reader.run("c"))
    first = report.first_divergence
    if limit:
        assert (first.step, first.kind, first.tensor) == (2, "slot", "w/Momentum")
    else:  # statistics: 1% off moves the max by 3e-3, far beyond what the bound allows
        assert (first.step, first.kind) == (2, "slot"), first
    matrix = report.comparison.matrix()
    col = matrix.tensors.index("slot/w/Momentum")
    assert (matrix.reason[:2, col] == OK).all() and (matrix.reason[2:, col] == VALUE).all()


def test_layers_told_apart_by_initial_weights_are_paired_anew_when_the_first_step_arrives(tmp_path) -> None:
    """Two 4x4 layers whose Keras names the port swapped (created in another order): they are paired
    by their first-step weights only when both runs start at the same step. The port's step 0
    arrives late (its own file): the refresh aligns anew and equals a fresh comparison, AGREE
    (numpy: each role holds the same weights on both sides), where pairing by name diverged."""
    rng = np.random.default_rng(9)
    roles = [rng.standard_normal((4, 4)).astype(np.float32) for _ in range(2)]

    def base_at(step: int) -> list:
        return [("weight", "dense/kernel:0", roles[0] + step), ("weight", "dense_1/kernel:0", roles[1] + step)]

    def cand_at(step: int) -> list:  # the names swapped: `dense` is role 1
        return [("weight", "m/dense/kernel:0", roles[1] + step), ("weight", "m/dense_1/kernel:0", roles[0] + step)]

    write_run(str(tmp_path), "b", range(4), base_at)
    write_run(str(tmp_path), "c", range(1, 4), cand_at)
    reader = LogdirReader(str(tmp_path))
    reader.reload()
    cmp = Comparison(reader.run("b"), reader.run("c"))
    assert not cmp.report().agree  # no common first step: paired by name, the roles crossed
    late = write_run(str(tmp_path), "c", [0], cand_at)
    os.rename(late, _rewrite_path(os.path.join(tmp_path, "c"), "late"))
    reader.reload()
    b2, c2 = reader.run("b"), reader.run("c")
    cmp.update(b2, c2)
    report, fresh = cmp.report(), Comparison(b2, c2).report()
    assert report.agree, report.first_divergence
    assert report.to_dict() == fresh.to_dict()
    assert {m["baseline"]: m["candidate"] for m in report.mapping} == {
        "dense/kernel:0": "m/dense_1/kernel:0",
        "dense_1/kernel:0": "m/dense/kernel:0",
    }


@pytest.mark.parametrize("case", ["never_differ", "evidence_conflicts"])
def test_layers_that_start_identical_stay_paired_by_name_without_clear_evidence(tmp_path, case: str) -> None:
    """Two batch-norm-like layers start identical (gamma 1). ``never_differ``: they stay identical,
    so nothing can tell them apart: the names' pairing stays and nothing is re-paired. And
    ``evidence_conflicts``: at step 0 the gradients say the names crossed the layers, at step 1 the
    moving means say they did not: no pairing is clearly the right one, so the names' stays and the
    gradients diverge, as numpy says (each gradient differs from the one it is paired with). Both
    say so in a warning."""
    ones = np.ones(4, np.float32)
    grads = [np.full(4, 0.5, np.float32), np.full(4, -2.0, np.float32)]
    means = [np.full(4, 0.3, np.float32), np.full(4, 0.7, np.float32)]

    def at(step: int, roles: tuple[int, int], grad_roles: tuple[int, int]) -> list:
        out = []
        for name, role, g_role in zip(("bn", "bn_1"), roles, grad_roles):
            out.append(("weight", f"{name}/gamma:0", ones))
            if case == "evidence_conflicts":
                out.append(("state", f"{name}/moving_mean:0", means[role] * min(step, 1)))
                out.append(("grad", f"{name}/gamma:0", grads[g_role] if step == 0 else ones))
        return out

    write_run(str(tmp_path), "b", range(3), lambda s: at(s, (0, 1), (0, 1)))
    write_run(str(tmp_path), "c", range(3), lambda s: at(s, (0, 1), (1, 0)))
    reader = LogdirReader(str(tmp_path))
    reader.reload()
    report = compare_runs(reader.run("b"), reader.run("c"))
    assert {m["how"] for m in report.mapping} == {"exact"}
    assert report.warnings == [
        "layers bn, bn_1 cannot be told apart by how they start (identically), nor clearly where they first differ "
        "(their first 3 common steps): they are paired by name (or creation order); if the port created them in "
        "another order, pair them with --map"
    ]
    if case == "never_differ":
        assert report.agree
    else:
        first = report.first_divergence
        assert (first.step, first.kind, first.tensor) == (0, "grad", "bn/gamma:0")
        np.testing.assert_allclose(first.max_abs_diff, abs(grads[0] - grads[1]).max())


def test_layers_that_start_identical_and_one_that_starts_otherwise_are_all_paired(tmp_path) -> None:
    """Three layers of one shape: the port swapped the names of the first two (which start identical)
    and starts the third wrongly (at 1 where TF1 starts it at 2). Step 0's gradients tell the first
    two apart; the third pairs with the one left, and its weight diverges at step 0, as numpy says
    (|2 - 1|)."""
    grads = [np.full(4, g, np.float32) for g in (0.5, -2.0, 3.0)]

    def at(names: tuple[str, ...], start: tuple[float, ...]) -> Callable[[int], list]:
        def tensors(step: int) -> list:
            out = []
            for role, name in enumerate(names):
                out.append(("weight", f"{name}/gamma:0", np.full(4, start[role], np.float32)))
                out.append(("grad", f"{name}/gamma:0", grads[role]))
            return out

        return tensors

    write_run(str(tmp_path), "b", range(2), at(("bn", "bn_1", "bn_2"), (1, 1, 2)))
    write_run(str(tmp_path), "c", range(2), at(("bn_1", "bn", "bn_2"), (1, 1, 1)))
    reader = LogdirReader(str(tmp_path))
    reader.reload()
    report = compare_runs(reader.run("b"), reader.run("c"))
    paired = {(m["kind"], m["baseline"]): m["candidate"] for m in report.mapping}
    assert paired[("grad", "bn/gamma:0")] == "bn_1/gamma:0" and paired[("weight", "bn_1/gamma:0")] == "bn/gamma:0"
    assert paired[("weight", "bn_2/gamma:0")] == "bn_2/gamma:0"
    first = report.first_divergence
    assert (first.step, first.kind, first.tensor, first.max_abs_diff) == (0, "weight", "bn_2/gamma:0", 1.0)


@pytest.mark.parametrize("clear", [True, False], ids=["told_apart_by_gradients", "not_told_apart"])
def test_two_identical_layers_swapped_with_a_bug_in_one(tmp_path, clear: bool) -> None:
    """A reviewer's port created two identical layers (ones) in the other order and started one of
    them with a wrong bias: that layer starts like no baseline layer, the other like both. When the
    step-0 gradients tell the layers apart (``clear``: each close to its own, far from the other's)
    they are paired by role, and the divergence is the buggy layer's bias, |0.5 - 0| as numpy says;
    else the names' pairing stays and a warning says the layers could not be told apart (the reviewer
    got the blame on the other layer, silently)."""
    ones, zeros, half = np.ones(4, np.float32), np.zeros(4, np.float32), np.full(4, 0.5, np.float32)
    grads = [np.full(4, 0.3, np.float32), np.full(4, -2.0, np.float32)]
    port_grads = [grads[0] * np.float32(1.01), grads[1]] if clear else [grads[1], grads[0] * np.float32(-5)]

    def at(names: tuple[str, str], bias: tuple[np.ndarray, np.ndarray], g: list) -> Callable[[int], list]:
        def tensors(step: int) -> list:
            out = []
            for role, name in enumerate(names):
                out += [("weight", f"{name}/kernel:0", ones), ("weight", f"{name}/bias:0", bias[role])]
                out.append(("grad", f"{name}/kernel:0", g[role]))
            return out

        return tensors

    write_run(str(tmp_path), "b", range(2), at(("dense", "dense_1"), (zeros, zeros), grads))
    write_run(
        str(tmp_path), "c", range(2), at(("dense_1", "dense"), (half, zeros), port_grads)
    )  # role 0 is the port's dense_1
    reader = LogdirReader(str(tmp_path))
    reader.reload()
    report = compare_runs(reader.run("b"), reader.run("c"))
    paired = {(m["kind"], m["baseline"]): m["candidate"] for m in report.mapping}
    first = report.first_divergence
    if clear:
        assert (
            paired[("weight", "dense/bias:0")] == "dense_1/bias:0"
            and paired[("grad", "dense_1/kernel:0")] == "dense/kernel:0"
        )
        assert (first.step, first.kind, first.tensor, first.max_abs_diff) == (0, "weight", "dense/bias:0", 0.5)
    else:
        assert paired[("weight", "dense/bias:0")] == "dense/bias:0"
        assert any("cannot be told apart" in w for w in report.warnings)


def _layer(scope: str, shapes: dict[str, tuple], slots: bool = True, order: int = 0) -> list:
    """A layer's weights, gradients and (Adam) slots, under ``scope``."""
    out = []
    for i, (leaf, shape) in enumerate(shapes.items()):
        var = f"{scope}/{leaf}:0"
        out += [series("weight", var, steady(2, shape, seed=i), order=order), series("grad", var, steady(2, shape))]
        if slots:
            out += [
                series("slot", f"{scope}/{leaf}/Adam:0", steady(2, shape)),
                series("slot", f"{scope}/{leaf}/Adam_1:0", steady(2, shape)),
            ]
    return out


def test_align_leaves_unpaired_what_layers_parametrised_differently_share_by_shape() -> None:
    """A TF1 LSTMCell (kernel [7, 16], bias [16]) against Keras LSTM (kernel [3, 16], recurrent
    kernel [4, 16], bias [16]): the biases share a shape and nothing else. They, their gradients and
    their slots stay unpaired, with a warning; the dense layer beside them is paired as before."""
    base = _layer("rnn/lstm_cell", {"kernel": (7, 16), "bias": (16,)}) + _layer("dense", {"kernel": (4, 2)}, order=1)
    cand = _layer("lstm/lstm_cell", {"kernel": (3, 16), "recurrent_kernel": (4, 16), "bias": (16,)})
    cand += _layer("dense", {"kernel": (4, 2)}, order=1)
    result = align.align(base, cand)
    paired = {(m.base[0], m.base[1]) for m in result.matches}
    assert not any("lstm_cell" in name for _, name in paired), sorted(paired)
    assert {("weight", "dense/kernel:0"), ("grad", "dense/kernel:0"), ("slot", "dense/kernel/Adam:0")} <= paired
    assert ("weight", "rnn/lstm_cell/bias:0") in result.unmatched_base
    assert ("slot", "lstm/lstm_cell/bias/Adam_1:0") in result.unmatched_cand
    assert any("rnn/lstm_cell/* and lstm/lstm_cell/*" in w for w in result.warnings)
    # --map still pairs them when the user says they hold the same values
    mapped = align.align(base, cand, ["rnn/lstm_cell/bias:0=lstm/lstm_cell/bias:0"])
    assert ("weight", "rnn/lstm_cell/bias:0") in {m.base for m in mapped.matches}


def test_align_keeps_a_layer_whose_port_only_adds_a_variable() -> None:
    """An extra bias in the port (``use_bias=True`` against TF1's ``False``): the kernel stays
    paired by shape (only one side has an unmatched variable under the layer)."""
    base = _layer("proj", {"kernel": (4, 3)}, slots=False)
    cand = _layer("projection", {"kernel": (4, 3), "bias": (3,)}, slots=False)
    result = align.align(base, cand)
    assert [(m.base[1], m.cand[1], m.base[0]) for m in result.matches if m.base[0] == "weight"] == [
        ("proj/kernel:0", "projection/kernel:0", "weight")
    ]
    assert ("weight", "projection/bias:0") in result.unmatched_cand and not result.warnings


def test_a_divergence_names_the_earlier_tensors_only_statistics_compared_at_its_step(tmp_path) -> None:
    """A new user's port diverged on a dense kernel at step 1 while the embedding before it, compared
    by statistics and a sample, held 87 wrong elements the sample missed: the tool named the kernel
    and said nothing of the embedding. The report now lists the tensors before the first divergent
    one that only statistics compared at that step (not those with full values there, nor those not
    logged there), and the CLI and ``assert_parity`` say what that means."""
    rng = np.random.default_rng(0)
    emb = {s: rng.standard_normal((100, 64)).astype(np.float32) for s in range(3)}  # 6400 > 4096: statistics
    small = {s: rng.standard_normal((3,)).astype(np.float32) for s in range(3)}
    kernel = {s: rng.standard_normal((8, 4)).astype(np.float32) for s in range(3)}

    def cand_emb(s: int) -> np.ndarray:
        e = emb[s].copy()
        e[5, 5] += 1e-3 * (s >= 1)  # numpy: out of atol 1e-5, but no statistic can prove it
        return e

    def tensors(s: int, cand: bool) -> list:
        out = [("weight", "emb", cand_emb(s) if cand else emb[s]), ("weight", "small", small[s])]
        if s != 1:
            out.append(("weight", "absent_at_1", small[s]))
        return out + [("weight", "k", kernel[s] + np.float32(1e-2 * (cand and s >= 1)))]

    write_run(str(tmp_path), "tf1", range(3), lambda s: tensors(s, False), side="tf1")
    write_run(str(tmp_path), "tf2", range(3), lambda s: tensors(s, True), side="tf2")
    report = compare_runs(*_runs(str(tmp_path)))
    assert (report.first_divergence.step, report.first_divergence.tensor) == (1, "k")
    assert report.unproven_before_first == ["weight/emb"]
    assert report.to_dict()["unproven_before_first"] == ["weight/emb"]
    from tb_parity_plugin import api, cli

    assert "before weight/k in execution order, compared at step 1 by statistics only" in cli.format_report(report)
    assert report.to_dict()["unproven_text"] == report.unproven_text
    assert 'data-testid="unproven"' in report._repr_html_()  # the HTML report and notebook view
    with pytest.raises(AssertionError, match="divergence may start upstream"):
        api.assert_parity(str(tmp_path))


@pytest.mark.parametrize(
    "table_name, output_name, noted",
    [
        ("emb", "lookup", True),
        ("model/wte", "h0", True),  # a reviewer's GPT-style names
        ("token_embs", "h0", True),
        ("word_vectors", "h0", True),
        ("conv/kernel", "conv", False),
        ("stock/kernel", "out", False),
        ("dense/kernel", "word_logits", False),  # a review: a word's logits and a throughput metric
        ("dense/kernel", "tokens_per_sec", False),
        ("vit/cls_token", "out", False),  # the next review's: a ViT's learned token and patch embedding
        ("vit/patch_embed/kernel", "out", False),
    ],
)
def test_a_divergence_says_it_may_predate_its_step_when_earlier_steps_rested_on_statistics(
    tmp_path, table_name: str, output_name: str, noted: bool
) -> None:
    """A new user's embedding row was wrong from step 0 and first looked up at step 3: the tool named
    the lookup's output at step 3 and said the difference might start "upstream", not that it might
    be older than the step. The report now lists the tensors compared by statistics only at earlier
    steps, and says the divergence may predate the step it names; the embedding's hint only where a
    tensor is named as one (another new user's CNN got it on every verdict)."""
    rng = np.random.default_rng(4)
    table = rng.standard_normal((100, 64)).astype(np.float32)  # 6400 > 4096 elements: statistics only
    wrong = table.copy()
    wrong[7, :3] += 1e-3  # numpy: out of atol 1e-5 from step 0, but no statistic can prove it
    assert np.abs(wrong - table).max() > 1e-3 - 1e-6
    ids = {0: [1, 2], 1: [3, 4], 2: [1, 5], 3: [7, 2]}  # row 7 is looked up first at step 3

    def tensors(emb: np.ndarray, s: int) -> list:
        return [("weight", table_name, emb), ("activation", output_name, emb[ids[s]])]

    write_run(str(tmp_path), "tf1", range(4), lambda s: tensors(table, s), side="tf1")
    write_run(str(tmp_path), "tf2", range(4), lambda s: tensors(wrong, s), side="tf2")
    report = compare_runs(*_runs(str(tmp_path)))
    first = report.first_divergence
    assert (first.step, first.kind, first.tensor) == (3, "activation", output_name), first
    tag = f"weight/{table_name}"
    assert report.unproven_earlier == [tag] and report.to_dict()["unproven_earlier"] == [tag]
    assert "may predate step 3" in report.unproven_text
    assert ("a wrong embedding row shows first" in report.unproven_text) == noted
    from tb_parity_plugin import cli

    assert f"compared by statistics only at steps before 3: {tag}" in cli.format_report(report)


def test_a_divergence_at_the_first_step_has_nothing_earlier_to_doubt(tmp_path) -> None:
    table = np.random.default_rng(5).standard_normal((100, 64)).astype(np.float32)
    write_run(
        str(tmp_path), "tf1", range(2), lambda s: [("weight", "emb", table), ("loss", "l", np.float32(1))], side="tf1"
    )
    write_run(
        str(tmp_path), "tf2", range(2), lambda s: [("weight", "emb", table), ("loss", "l", np.float32(2))], side="tf2"
    )
    report = compare_runs(*_runs(str(tmp_path)))
    assert report.first_divergence.step == 0 and report.unproven_earlier == []


def _runs(logdir: str) -> tuple:
    reader = LogdirReader(logdir)
    reader.reload()
    return reader.run("tf1"), reader.run("tf2")


def test_align_leaves_outputs_of_unknown_batch_unpaired_when_only_their_order_would_pair_them() -> None:
    """A reviewer's faithful port: two parallel ``[None, 6]`` branches, named by the user in TF1
    (``branch_a``, ``branch_b``, built b first) and after Keras layers in the port (``dense``,
    ``dense_1``, built a first). Pairing them by execution order crossed the branches: a false
    DIVERGE at step 0. They stay unmatched, listed with their candidates, for a --map."""
    rows = [np.zeros((8, 6), np.float32)]
    unknown = dict(steps=[0])
    base = [
        series("activation", "branch_b", rows, order=1, **unknown),
        series("activation", "branch_a", rows, order=2, **unknown),
    ]
    cand = [series("activation", "dense", rows, order=1, **unknown), series("activation", "dense_1", rows, order=2)]
    for s in (*base, *cand):
        s.shape = (None, 6)
    result = align.align(base, cand)
    assert result.matches == []
    assert sorted(result.unmatched_base) == [("activation", "branch_a"), ("activation", "branch_b")]


def test_a_divergent_sample_does_not_call_its_own_tensor_upstream(tmp_path) -> None:
    """A reviewer's case: the port's embedding rows reversed (every statistic the same), found by its
    element sample; the sample's own tensor, compared there by statistics, was listed as a tensor
    before the divergence where it might start. It is the divergence: only other tensors are listed."""
    from tb_parity_plugin.records import metadata

    rng = np.random.default_rng(2)
    emb = rng.standard_normal((100, 64)).astype(np.float32)
    at = metadata.sample_positions(emb.size)

    def tensors(table: np.ndarray) -> list:
        return [("weight", "emb", table), ("weight", "emb" + metadata.SAMPLE_MARK, table.ravel()[at])]

    write_run(str(tmp_path), "tf1", [0], lambda s: tensors(emb), side="tf1")
    write_run(str(tmp_path), "tf2", [0], lambda s: tensors(emb[::-1].copy()), side="tf2")
    report = compare_runs(*_runs(str(tmp_path)))
    first = report.first_divergence
    assert first is not None and first.tensor == "emb" + metadata.SAMPLE_MARK and first.evidence == "sample"
    assert report.unproven_before_first == []


def test_rmsprop_mean_squares_pair_across_spellings(tmp_path) -> None:
    """TF1 ``dense/kernel/RMSProp`` and tf_keras RMSprop's ``velocity/dense/kernel`` are one slot (the
    moving mean of squared gradients): paired by name, they agree when equal (numpy) and diverge where
    they differ; TF1's momentum slot ``RMSProp_1`` (made even with momentum 0) is declared expected."""
    from tb_parity_plugin import compare

    ms = [np.full(3, 0.9 + 0.01 * s, np.float32) for s in range(3)]
    moved = [m * np.float32(1.5) if s == 2 else m for s, m in enumerate(ms)]
    assert not np.allclose(moved[2], ms[2], rtol=1e-4) and np.array_equal(moved[1], ms[1])  # numpy
    write_run(
        str(tmp_path / "same"),
        "tf1",
        range(3),
        lambda s: [
            ("slot", "dense/kernel/RMSProp", ms[s]),
            ("slot", "dense/kernel/RMSProp_1", np.zeros(3, np.float32)),
        ],
    )
    write_run(str(tmp_path / "same"), "tf2", range(3), lambda s: [("slot", "velocity/dense/kernel", ms[s])])
    write_run(str(tmp_path / "moved"), "tf1", range(3), lambda s: [("slot", "dense/kernel/RMSProp", ms[s])])
    write_run(str(tmp_path / "moved"), "tf2", range(3), lambda s: [("slot", "velocity/dense/kernel", moved[s])])
    same = compare(str(tmp_path / "same"), baseline="tf1", candidate="tf2", allow_unmatched=["*RMSProp_1*"])
    assert same.agree, same.first_divergence
    how = {m["baseline"]: m["how"] for m in same.to_dict()["mapping"]}
    assert how["dense/kernel/RMSProp"] == "canonical"  # by its name, not by a shape it happens to share
    first = compare(str(tmp_path / "moved"), baseline="tf1", candidate="tf2").first_divergence
    assert first is not None and (first.step, first.tensor, first.candidate_tensor) == (
        2,
        "dense/kernel/RMSProp",
        "velocity/dense/kernel",
    )


def test_the_unproven_tensors_are_worded_nearest_first() -> None:
    """A new user's culprit, the lookup right before the divergent tensor, was cut from the CLI's
    line as "and 3 more" behind weights and slots listed in execution order: the text lists the
    nearest first (the report's list keeps execution order)."""
    big = [np.linspace(-1, 1, 5000, dtype=np.float32)]
    k = [np.ones(3, np.float32)]
    tensors = [series("weight", f"w{i:02d}", big, order=i, keep_values=False) for i in range(12)]
    base = run("tf1", [*tensors, series("activation", "k", k, order=12)])
    cand = run("tf2", [*tensors, series("activation", "k", [k[0] + 1], order=12)])
    report = Comparison(base, cand).report()
    assert report.unproven_before_first == [f"weight/w{i:02d}" for i in range(12)]
    assert "nearest first: weight/w11, weight/w10, weight/w09," in report.unproven_text
    assert report.unproven_text.count("weight/w") == 10 and "and 2 more" in report.unproven_text


def test_an_unpaired_slot_lists_candidates_of_its_own_role() -> None:
    """A new user's TF1 ``Adam_1`` (the second moment) was listed as ambiguous with Keras's ``m/``
    slots beside the ``v/`` ones: a slot's possible partners hold its role when both are known."""
    v = [np.ones(4, np.float32)]
    base = run(
        "tf1",
        [
            series("slot", f"{n}/bias/{r}:0", v, order=i)
            for i, (n, r) in enumerate([("a", "Adam"), ("a", "Adam_1"), ("b", "Adam_1")])
        ],
    )
    port = [("m", "y"), ("v", "y"), ("v", "z"), ("m", "z")]
    cand = run("tf2", [series("slot", f"{r}/{n}/bias", v, order=i) for i, (r, n) in enumerate(port)])
    only = {e["tag"]: e["candidates"] for e in compare_runs(base, cand).structure["only_in"]["tf1"]}
    assert only["slot/a/bias/Adam:0"] == ["slot/m/y/bias", "slot/m/z/bias"]
    assert only["slot/a/bias/Adam_1:0"] == only["slot/b/bias/Adam_1:0"] == ["slot/v/y/bias", "slot/v/z/bias"]
    # tf_keras's own spelling, <variable>/<role>:0 (a review: already canonical, it was read as unknown)
    keras = run("tf2", [series("slot", f"{n}/bias/{r}:0", v, order=i) for i, (r, n) in enumerate(port)])
    only = {e["tag"]: e["candidates"] for e in compare_runs(base, keras).structure["only_in"]["tf1"]}
    assert only["slot/a/bias/Adam_1:0"] == ["slot/y/bias/v:0", "slot/z/bias/v:0"]


def test_assert_parity_on_a_structure_divergence_names_the_first_step_divergence_too(tmp_path) -> None:
    """A port with a state of its own diverges in structure, at no step, and its schedule parts from
    TF1's at step 2 (numpy). ``assert_parity`` said "diverges ... at step 0" and no more, where the CLI,
    the HTML report and the tab also name the first divergence among the steps: a VAE port keeping its
    KL weight as a variable got the same message whether its loss was right or summed the KL term."""
    import state_port  # TensorFlow: imported by this test only

    from tb_parity_plugin import api

    lrs = state_port.write(str(tmp_path / "port"))
    apart = int(np.flatnonzero(lrs[0] != lrs[1])[0])
    assert apart == 2
    with pytest.raises(AssertionError) as raised:
        api.assert_parity(str(tmp_path / "port"))
    lines = str(raised.value).splitlines()
    assert lines[0].startswith("'tf2' diverges from 'tf1' in structure: state/kl_beta: structure"), lines[0]
    assert f"first divergence among the steps: step {apart}, lr/lr (value)" in str(raised.value)
