"""A layout's pairs settled together (engine/batch.py) against the per-pair path and numpy.

Every case writes real event files (``BlockWriter``) and reads them with ``LogdirReader``, so the
series carry the reader's layout blocks (``TensorSeries.block``) exactly as the dashboard sees
them. Each case checks two things:

* the batched engine (``batch.ENABLED``) gives the very report, matrix cells and error ratios
  of the per-pair path, also after ``Comparison.update`` (compared with a fresh per-pair
  comparison of the new snapshots, which reuses nothing);
* an expectation derived from the arrays written, without the engine: which step and tensor
  were perturbed and how (see :func:`expected`), and each run's first NaN/Inf.

The hypothesis test draws whole logdirs: statistics-only tensors beside tensors with full
values, columns in another order in the candidate, renamed tensors with a mapping, a tensor in
one run only, steps and tensors one run did not log, NaN/Inf, dtype and runtime-shape changes,
steps rewritten in other files (last write wins, by file name), a run still being written
(appended to the same file), a rewrite or a deleted file before a refresh, and a candidate run
written anew in another layout. It draws the same 40 logdirs on every run; to explore, set
``TB_PARITY_BATCH_EXAMPLES=3000`` (random draws, a few minutes). ``PINNED`` holds each case by
name, and the tests at the end the defects the draws found.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
from typing import Any, Iterator, Optional
from unittest import mock

import engine_helpers
import numpy as np
import pytest
from engine_helpers import write_run
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tb_parity_plugin.engine import Comparison, TolerancePolicy, align, batch, comparison, stat_bounds
from tb_parity_plugin.engine.comparison_cache import ComparisonCache
from tb_parity_plugin.engine.matrix import ABSENT, DTYPE, MISSING, NONFINITE, OK, SHAPE, VALUE
from tb_parity_plugin.engine.tolerance import ToleranceOverride
from tb_parity_plugin.logdir.reader import LogdirReader
from tb_parity_plugin.records import health, metadata
from tb_parity_plugin.records.writer import BlockWriter, build_layout, resolve_layout

# -- the two engines ------------------------------------------------------------------------


@contextlib.contextmanager
def per_pair() -> Iterator[None]:
    """The engine before batching: every pair settled on its own (groups are made in update())."""
    was = batch.ENABLED
    batch.ENABLED = False
    try:
        yield
    finally:
        batch.ENABLED = was


def unbatched(base: Any, cand: Any, policy: TolerancePolicy, mapping: tuple[str, ...] = ()) -> Comparison:
    with per_pair():
        cmp = Comparison(base, cand, policy, mapping)
    assert not cmp._groups
    return cmp


def assert_same(batched: Comparison, plain: Comparison) -> None:
    """Report, matrix cells, error ratios and first divergence of the two engines are equal."""
    assert batched.report().to_dict() == plain.report().to_dict()
    mb, mp = batched.matrix(), plain.matrix()
    assert mb.tensors == mp.tensors
    np.testing.assert_array_equal(mb.reason, mp.reason)
    np.testing.assert_array_equal(mb.error_ratio, mp.error_ratio)  # NaN where NaN
    assert mb.first_divergence == mp.first_divergence
    bb, bp = batched.matrix(max_steps=3), plain.matrix(max_steps=3)
    np.testing.assert_array_equal(bb.reason, bp.reason)
    np.testing.assert_array_equal(bb.error_ratio, bp.error_ratio)


# -- writing runs ---------------------------------------------------------------------------

Entry = tuple[str, str, np.ndarray, Optional[tuple]]  # kind, name, array, static shape (None: the array's)


def write_entries(writer: BlockWriter, step: int, entries: list[Entry], limit: int, resolve: bool) -> None:
    """One step as the shims write it: a tensor with a static shape of unknown dims is written
    with that shape (runtime shape from the size statistic) or, ``resolve``, with its runtime
    shape in a layout of its own (the TF1 shim's partial last batch)."""
    layout = build_layout([(k, n, a.dtype.name, a.shape if s is None else s) for k, n, a, s in entries], limit)
    runtime = {i: a.shape for i, (_, _, a, s) in enumerate(entries) if s is not None}
    if resolve and runtime:
        layout = resolve_layout(layout, runtime, limit, valued=set(runtime))
    stats = np.stack([health.health_numpy(a) for _, _, a, _ in entries])
    blocks: dict[str, list[np.ndarray]] = {}
    for spec, (_, _, a, _) in zip(layout.tensors, entries):
        if spec.values is not None:
            blocks.setdefault(spec.values[0], []).append(a.reshape(-1))
    writer.write_step(step, layout, stats, {d: np.concatenate(p) for d, p in blocks.items()})


def file_named(run_dir: str, name: str, steps: list[tuple[int, list[Entry]]], limit: int, resolve: bool) -> str:
    """A closed event file ``name`` in ``run_dir`` (written aside, then moved: names set file order)."""
    with tempfile.TemporaryDirectory() as aside:
        writer = BlockWriter(aside)
        for step, entries in steps:
            write_entries(writer, step, entries, limit, resolve)
        writer.close()
        os.makedirs(run_dir, exist_ok=True)
        path = os.path.join(run_dir, name)
        shutil.move(writer.path, path)
    return path


FIRST, LAST = "!", "~"  # after the main file's time: a name that sorts before / after its hostname


def rewrite_name(run_dir: str, order: str, tail: str) -> str:
    """A rewrite file's name: the main file's creation time (one second: a rewrite, not a restart
    of the run, which ``run_state.Timeline`` would make it), ``order`` placing it before or after."""
    (main,) = {
        n.split(".")[3] for n in os.listdir(run_dir) if n.startswith("events.out.tfevents.") and "rewrite" not in n
    }
    return f"events.out.tfevents.{main}.{order}{tail}"


# -- the drawn logdir and what numpy says about it ------------------------------------------

EVENTS = (
    "same",
    "small",
    "mid",
    "big",
    "nan_both",
    "nan_cand",
    "inf_both",
    "inf_cand",
    "nan_big",
    "dtype_step",
    "permute",
)
DYNAMIC_EVENTS = ("same", "big", "nan_both", "shape")
REWRITES = ("same", "big", "permute", "nan")


@dataclasses.dataclass
class Model:
    """A drawn pair of runs. Tensor ``i`` is ``t<i>`` in the baseline (``u<i>`` in the candidate
    when ``mapping``), its baseline values ``±[1, 2)`` from a seed; ``events[(step, i)]`` says how
    the candidate's differs there (``huge`` tensors: float64 near 1e200 in both runs, whose sum of
    squares overflows: std and L2 are recorded as inf)."""

    n_steps: int
    kinds: list[str]
    sizes: list[int]
    dynamic: int  # index of the tensor of static shape (None, 2), runtime (2 or 3, 2); -1: none
    resolve: dict[str, bool]
    limits: dict[str, int]
    perm: list[int]  # the candidate's column order
    mapping: bool
    extra: frozenset[str]  # runs that log "weight/extra" (compared if both do)
    dtype64: frozenset[int]  # the candidate logs these as float64 at every step
    huge: frozenset[int]  # float64 near 1e200 in both runs (std and L2 overflow)
    drop_steps: dict[str, frozenset[int]]
    #: (run, step) -> tensors that run did not log there (never all: the step would not be logged)
    drop_tensor: dict[tuple[str, int], frozenset[int]]
    events: dict[tuple[int, int], str]
    #: (run, step, tensor, kind, wins, active): a file rewriting one step; kind ``big`` maps that
    #: tensor x -> 3x + 10, ``permute`` reverses its elements (the same statistics), ``nan`` puts a
    #: NaN in its first element, ``same`` changes nothing; ``wins``: its name sorts after the main
    #: file (last write wins)
    rewrites: list[tuple[str, int, int, str, bool, bool]]
    equal_nan: bool
    warmup: int
    grad_warmup: int  # override for grad/*: rtol 0.2 after this many compared steps
    #: the candidate logs the dynamic tensor transposed: static (2, None), runtime (2, 2 or 3)
    transposed: bool = False
    upto: int = 10**9  # only steps below this are written yet
    #: the candidate also logs a replica copy ``<name>@replica0`` (the same array) of each tensor in
    #: its layout: "end" after all of them (the others keep their columns), "inter" after each one
    copies: str = ""

    def name(self, run: str, i: int) -> str:
        return f"u{i}" if run == "c" and self.mapping else f"t{i}"

    def logs(self, run: str, step: int) -> bool:
        return step < min(self.n_steps, self.upto) and step not in self.drop_steps[run]

    def present(self, run: str, step: int, i: int) -> bool:
        return self.logs(run, step) and i not in self.drop_tensor.get((run, step), ())

    def shape(self, run: str, step: int, i: int) -> tuple[int, ...]:
        if i != self.dynamic:
            return (self.sizes[i],)
        rows = 2 + step % 2 + int(run == "c" and self.events.get((step, i)) == "shape")
        return (2, rows) if run == "c" and self.transposed else (rows, 2)  # transposed: the same elements, in order

    def array(self, run: str, step: int, i: int, written: Optional[str] = None) -> np.ndarray:
        """Tensor ``i`` at ``step`` in ``run``: the winning write, or with ``written`` ("same" or
        "big") what a file holds (see :meth:`entries`)."""
        rng = np.random.default_rng([step, i])
        shape = self.shape(run, step, i)
        b = ((1 + rng.random(shape)) * rng.choice([-1.0, 1.0], shape)).astype(np.float32)
        if i in self.huge:
            b = b.astype(np.float64) * 1e200
        ev = self.events.get((step, i), "same")
        flat = b.reshape(-1)
        if run == "b":
            if ev in ("nan_both", "nan_big"):
                flat[0] = np.nan
            if ev == "inf_both":
                flat[1] = np.inf
            return _rewrite(b, self._rewritten(run, step, i, written))
        changed = {"small": b + np.float32(1e-6), "mid": b * np.float32(1.01), "big": b * 3 + 10, "nan_big": b * 3 + 10}
        c = changed.get(ev, b)
        c = c.reshape(-1)[::-1].reshape(c.shape) if ev == "permute" else c.copy()  # the same statistics
        if ev in ("nan_both", "nan_cand", "nan_big"):
            c.reshape(-1)[0] = np.nan
        if ev == "inf_both":
            c.reshape(-1)[1] = np.inf
        if ev == "inf_cand":
            c.reshape(-1)[1] = -np.inf
        c = _rewrite(c, self._rewritten(run, step, i, written))
        if i in self.dtype64 or ev == "dtype_step":
            c = c.astype(np.float64)
        return c

    def _rewritten(self, run: str, step: int, i: int, written: Optional[str]) -> str:
        """How the winning rewrite of ``step`` (the last by file name) changed tensor ``i`` ("same":
        not at all); ``written``: what one file holds instead (see :meth:`entries`)."""
        if written is not None:
            return written
        won = [(t, kind) for r, s, t, kind, wins, active in self.rewrites if (r, s) == (run, step) and wins and active]
        return won[-1][1] if won and won[-1][0] == i else "same"

    def entries(self, run: str, step: int, rewrite: Optional[tuple[int, str]] = None) -> list[Entry]:
        """What one file holds at ``step``: the main file's content, or a rewrite's (``rewrite``:
        the tensor it changes and how)."""
        out: list[Entry] = []
        for i in self.perm if run == "c" else range(len(self.sizes)):
            if not self.present(run, step, i):
                continue
            a = self.array(run, step, i, rewrite[1] if rewrite is not None and rewrite[0] == i else "same")
            static = ((2, None) if run == "c" and self.transposed else (None, 2)) if i == self.dynamic else None
            out.append((self.kinds[i], self.name(run, i), a, static))
            if run == "c" and self.copies == "inter":
                out.append((self.kinds[i], self.name(run, i) + metadata.REPLICA_MARK + "0", a, static))
        if run == "c" and self.copies == "end":
            out += [(k, n + metadata.REPLICA_MARK + "0", a, static) for k, n, a, static in list(out)]
        if run in self.extra:
            out.append(("weight", "extra", np.ones(3, np.float32), None))
        return out

    def steps(self, run: str) -> list[int]:
        return [s for s in range(self.n_steps) if self.logs(run, s)]

    def known(self, run: str, i: int) -> bool:
        """The run logged tensor ``i`` at some step (else it is not in that run at all)."""
        return any(self.present(run, s, i) for s in self.steps(run))

    def compared(self) -> list[int]:
        return [i for i in range(len(self.sizes)) if self.known("b", i) and self.known("c", i)]

    def values_compared(self, i: int) -> bool:
        """Both runs keep tensor ``i``'s full values at every step, in one dtype: compared element-wise."""
        return (
            i != self.dynamic
            and self.sizes[i] <= min(self.limits.values())
            and i not in self.dtype64
            and not any(self.events.get((s, i)) == "dtype_step" and self.present("c", s, i) for s in self.steps("c"))
        )

    def policy(self) -> TolerancePolicy:
        return TolerancePolicy(
            warmup_steps=self.warmup,
            equal_nan=self.equal_nan,
            overrides=(ToleranceOverride("grad/*", rtol=0.2, warmup_steps=self.grad_warmup),),
        )

    def mapping_items(self) -> tuple[str, ...]:
        return tuple(f"t{i}=u{i}" for i in range(len(self.sizes))) if self.mapping else ()


def _rewrite(a: np.ndarray, kind: str) -> np.ndarray:
    """What a rewrite of ``kind`` (see :attr:`Model.rewrites`) writes instead of ``a``."""
    if kind == "big":
        return a * 3 + 10
    if kind == "permute":
        return a.reshape(-1)[::-1].reshape(a.shape).copy()
    if kind == "nan":
        out = a.copy()
        out.reshape(-1)[0] = np.nan
        return out
    return a


def expected(model: Model) -> tuple[np.ndarray, np.ndarray]:
    """(compared steps, reason ``[steps, tensors both runs logged]`` in baseline tensor index order)."""
    steps = np.intersect1d(model.steps("b"), model.steps("c"))
    out = np.zeros((len(steps), len(model.compared())), dtype=np.uint8)
    for k, s in enumerate(steps):
        for j, i in enumerate(model.compared()):
            out[k, j] = _cell(model, int(s), int(s - steps[0]), i)  # the warm-up counts training steps
    return steps, out


def _cell(model: Model, s: int, since: int, i: int) -> int:
    pb, pc = model.present("b", s, i), model.present("c", s, i)
    if not (pb or pc):
        return ABSENT
    if pb != pc:
        return MISSING
    ev = model.events.get((s, i), "same")
    if i in model.dtype64 or ev == "dtype_step":
        return DTYPE
    if ev == "shape":
        return SHAPE
    b, c = model.array("b", s, i), model.array("c", s, i)
    if b.shape != c.shape:  # the dynamic tensor transposed: the same size, another shape
        return SHAPE
    if ev == "same":  # only rewrites can set them apart (they are drawn where no event is)
        return _rewritten_cell(model, since, i, b, c)
    if np.array_equal(b, c, equal_nan=True) and ev not in ("nan_both", "nan_big"):
        return OK  # identical, or identical but for a rewrite of both sides
    if ev == "same":
        return VALUE  # a "big" rewrite won in one run only
    tol = model.policy().for_tag(f"{model.kinds[i]}/t{i}")
    rtol = tol.rtol_at(since)  # 1e-7 in warm-up, 1e-4 for slots
    if ev == "permute":  # the statistics cannot tell: only full values can
        return VALUE if model.values_compared(i) and not np.allclose(c, b, rtol, _atol(tol, b)) else OK
    return {
        "small": OK,
        "mid": VALUE if rtol < 0.005 else OK,  # 1 % apart
        "big": VALUE,
        "nan_both": OK if model.equal_nan else NONFINITE,
        "nan_cand": NONFINITE,
        "inf_cand": NONFINITE,
        "nan_big": VALUE if model.equal_nan else NONFINITE,
    }[ev]


def _atol(tol: Any, b: np.ndarray) -> float:
    """The documented atol at a step: a slot's adds ``atol_of_max`` of the baseline's largest finite |element|."""
    finite = np.abs(b[np.isfinite(b)].astype(np.float64))
    return float(tol.atol + tol.atol_of_max * (finite.max() if finite.size else 0.0))


def _rewritten_cell(model: Model, since: int, i: int, b: np.ndarray, c: np.ndarray) -> int:
    """The cell of two arrays that only rewrites (:func:`_rewrite`) may have set apart, from numpy."""
    counts = [(np.isnan(a).sum(), (a == np.inf).sum(), (a == -np.inf).sum()) for a in (b, c)]
    if counts[0] != counts[1] or (counts[0][0] and not model.equal_nan):
        return NONFINITE
    if model.values_compared(i):
        tol = model.policy().for_tag(f"{model.kinds[i]}/t{i}")
        ok = np.isclose(c, b, rtol=tol.rtol_at(since), atol=_atol(tol, b), equal_nan=model.equal_nan)
        return OK if ok.all() else VALUE
    # statistics only: the same elements in another order prove nothing; x -> 3x + 10 is proven
    return OK if np.array_equal(np.sort(b, axis=None), np.sort(c, axis=None), equal_nan=True) else VALUE


def expected_nonfinite(model: Model, run: str, series: dict) -> Optional[dict[str, Any]]:
    """The run's first (step, tensor in execution order) holding NaN/Inf, from the arrays."""
    for s in model.steps(run):
        hits = [i for i in range(len(model.sizes)) if model.present(run, s, i)]
        hits = [i for i in hits if not np.isfinite(model.array(run, s, i)).all()]
        if hits:
            first = min((series[(model.kinds[i], model.name(run, i))] for i in hits), key=align.execution_key)
            return {"step": s, "tensor": first.name, "kind": first.kind}
    return None


def fallback_pairs(model: Model) -> int:
    """Tensors that one run alone logged, paired across the runs by the alignment's fallback
    (engine/align.py: per kind and static shape, the k-th with the k-th when both sides have as
    many); two runs that each drop a whole tensor of one kind and shape leave two such tensors.
    The reference here does not model that pairing (engine/align.py's own tests do): such draws
    are skipped."""
    groups: dict[tuple[str, tuple[int, ...]], list[int]] = {}
    for side, (run, other) in enumerate(("bc", "cb")):
        for i in range(len(model.sizes)):
            if i != model.dynamic and model.known(run, i) and not model.known(other, i):
                first = next(s for s in model.steps(run) if model.present(run, s, i))
                groups.setdefault((model.kinds[i], tuple(model.shape(run, first, i))), [0, 0])[side] += 1
        if run in model.extra and model.steps(run) and not (other in model.extra and model.steps(other)):
            groups.setdefault(("weight", (3,)), [0, 0])[side] += 1
    return sum(b for b, c in groups.values() if b == c)


def check_reference(model: Model, cmp: Comparison, base: Any, cand: Any) -> None:
    """The engine against :func:`expected`: cells, error ratios, first divergence, first NaN/Inf."""
    steps, want = expected(model)
    m = cmp.matrix()
    np.testing.assert_array_equal(m.step_start, steps)
    both = model.compared()
    assert len(m.tensors) == len(both) + (all(r in model.extra and model.steps(r) for r in "bc"))
    cols = [m.tensors.index(f"{model.kinds[i]}/t{i}") for i in both]
    got = m.reason[:, cols]
    np.testing.assert_array_equal(got, want)
    ratio = m.error_ratio[:, cols]
    assert np.isnan(ratio[(want == MISSING) | (want == ABSENT)]).all()
    assert not (ratio[want == OK] > 1).any()  # above 1 proves an element out of tolerance: not OK
    assert (ratio[want == VALUE] > 1).all()
    for k, s in enumerate(steps):  # byte-identical tensors: nothing differs, ratio 0
        for j, i in enumerate(both):
            if want[k, j] == OK and model.present("b", int(s), i):
                b, c = model.array("b", int(s), i), model.array("c", int(s), i)
                if np.array_equal(b, c) and np.isfinite(b).all():
                    assert ratio[k, j] == 0.0, (s, i)
    report = cmp.report()
    bad = [k for k in range(len(steps)) if ((want[k] != OK) & (want[k] != ABSENT)).any()]
    first = report.first_step_divergence
    if not bad:
        assert first is None
    else:
        k = bad[0]
        at = [i for j, i in enumerate(both) if want[k, j] not in (OK, ABSENT)]
        tensor = min((base.tensors[(model.kinds[i], f"t{i}")] for i in at), key=align.execution_key)
        assert (first.step, first.tensor) == (int(steps[k]), tensor.name)
        assert m.first_divergence == (k, m.tensors.index(tensor.tag))
    extra = {r for r in model.extra if model.steps(r)}
    alone = {r: ["weight/extra"] if extra == {r} else [] for r in "bc"}
    for i in range(len(model.sizes)):
        for r, other in ("bc", "cb"):
            if model.known(r, i) and not model.known(other, i):
                alone[r].append(f"{model.kinds[i]}/{model.name(r, i)}")
    assert {r: sorted(v) for r, v in report.unmatched.items()} == {r: sorted(v) for r, v in alone.items()}
    assert report.first_nonfinite == {
        "b": expected_nonfinite(model, "b", base.tensors),
        "c": expected_nonfinite(model, "c", cand.tensors),
    }


@st.composite
def models(draw: st.DrawFn) -> Model:
    n_steps = draw(st.integers(3, 14))
    n = draw(st.integers(2, 5))
    sizes = [draw(st.sampled_from([4, 12])) for _ in range(n)]
    dynamic = draw(st.sampled_from([-1, -1, n - 1]))
    if dynamic >= 0:
        sizes[dynamic] = 0
    step_ix = st.integers(0, n_steps - 1)
    tensor_ix = st.integers(0, n - 1)
    huge = frozenset(draw(st.sets(st.sampled_from([i for i in range(n) if i != dynamic]), max_size=2)))
    dtype64 = frozenset(draw(st.sets(st.sampled_from([i for i in range(n) if i != dynamic]), max_size=1))) - huge
    events: dict[tuple[int, int], str] = {}
    for s, i in draw(st.lists(st.tuples(step_ix, tensor_ix), max_size=6)):
        events[(s, i)] = draw(st.sampled_from(DYNAMIC_EVENTS if i == dynamic else EVENTS))
        if i in huge and events[(s, i)] == "dtype_step":  # float64 already
            events[(s, i)] = "same"
    drop_steps = {r: frozenset(draw(st.sets(step_ix, max_size=2))) for r in "bc"}
    # a step logging some tensors only: those it lacks keep one layout (a group of the batch, with
    # MISSING cells), the others get two (no block)
    drop_tensor = {
        (r, s): frozenset(draw(st.sets(tensor_ix, min_size=1, max_size=n - 1)))
        for r, s in draw(st.lists(st.tuples(st.sampled_from("bc"), step_ix), max_size=2))
    }
    rewrites = []
    for r, s, i in draw(st.lists(st.tuples(st.sampled_from("bc"), step_ix, tensor_ix), max_size=2)):
        if events.get((s, i), "same") == "same" and i not in dtype64 and s not in drop_steps[r]:
            rewrites.append((r, s, i, draw(st.sampled_from(REWRITES)), draw(st.booleans()), True))
    return Model(
        n_steps=n_steps,
        kinds=[draw(st.sampled_from(["weight", "grad", "activation", "slot"])) for _ in range(n)],
        sizes=sizes,
        dynamic=dynamic,
        resolve={r: draw(st.booleans()) for r in "bc"},
        limits={r: draw(st.sampled_from([0, 8, 64])) for r in "bc"},
        perm=draw(st.permutations(range(n))),
        mapping=draw(st.booleans()),
        extra=frozenset(draw(st.sampled_from(["", "", "b", "c", "bc"]))),
        dtype64=dtype64,
        huge=huge,
        transposed=dynamic >= 0 and draw(st.booleans()),
        drop_steps=drop_steps,
        drop_tensor=drop_tensor,
        events=events,
        rewrites=rewrites,
        equal_nan=draw(st.booleans()),
        warmup=draw(st.sampled_from([0, 2, 10])),
        grad_warmup=draw(st.sampled_from([0, 3])),
    )


def write_rewrite(logdir: str, model: Model, index: int) -> str:
    r, s, i, kind, wins, _ = model.rewrites[index]
    name = rewrite_name(os.path.join(logdir, r), LAST if wins else FIRST, f"rewrite{index:03d}")  # order written
    entries = model.entries(r, s, rewrite=(i, kind))
    return file_named(os.path.join(logdir, r), name, [(s, entries)], model.limits[r], model.resolve[r])


@dataclasses.dataclass
class Plan:
    """What happens to a drawn logdir: the first ``split`` steps are written and compared, the
    rest appended to the same files, then ``mutation``, a reload and ``Comparison.update``."""

    split: int
    touch: str  # what the first comparison computes: "report", "matrix", "detail" (one pair to the end)
    mutation: str  # "none" | "late_rewrite" | "delete_rewrite" | "rerun_cand"
    chunk: int  # steps per scan chunk
    late: tuple[str, int, int, str] = ("b", 0, 0, "same")  # late_rewrite: run, step, tensor, kind
    delete: int = 0  # delete_rewrite: which of the files written (modulo their number)
    perm: tuple[int, ...] = ()  # rerun_cand: the new column order
    extra: bool = False  # rerun_cand: the candidate logs "weight/extra" now


@st.composite
def plans(draw: st.DrawFn, model: Model) -> Plan:
    n = len(model.sizes)
    return Plan(
        split=draw(st.integers(1, model.n_steps)),
        touch=draw(st.sampled_from(["report", "matrix", "detail"])),
        mutation=draw(st.sampled_from(["none", "late_rewrite", "delete_rewrite", "rerun_cand"])),
        chunk=draw(st.sampled_from([4, 16])),
        late=(
            draw(st.sampled_from("bc")),
            draw(st.integers(0, model.n_steps - 1)),
            draw(st.integers(0, n - 1)),
            draw(st.sampled_from(REWRITES)),
        ),
        delete=draw(st.integers(0, 3)),
        perm=tuple(draw(st.permutations(range(n)))),
        extra=draw(st.booleans()),
    )


def run_scenario(model: Model, plan: Plan) -> None:
    """Write, compare, check; go on writing, mutate, refresh, check again (see :class:`Plan`)."""
    with (
        tempfile.TemporaryDirectory() as logdir,
        mock.patch.object(comparison, "_CHUNK_BYTES", 1),
        mock.patch.object(comparison, "_MIN_CHUNK_STEPS", plan.chunk),
    ):
        writers = {r: BlockWriter(os.path.join(logdir, r)) for r in "bc"}
        phase1 = dataclasses.replace(model, upto=plan.split)
        for r, w in writers.items():
            for s in phase1.steps(r):
                write_entries(w, s, phase1.entries(r, s), model.limits[r], model.resolve[r])
            w.flush()
        files = {}
        for index, rewrite in enumerate(model.rewrites):
            if rewrite[1] < plan.split:
                files[index] = write_rewrite(logdir, phase1, index)
        phase1.rewrites = [rw[:5] + (index in files,) for index, rw in enumerate(model.rewrites)]
        reader = LogdirReader(logdir)
        reader.reload()
        b, c = reader.run("b"), reader.run("c")
        policy, mapping = model.policy(), model.mapping_items()
        batched = Comparison(b, c, policy, mapping)
        if plan.touch == "detail" and batched._pairs:  # one pair settled to the end, the others not
            batched.detail(batched._pairs[-1].base.tag)
        batched.report()
        if plan.touch == "matrix":
            batched.matrix()
        assert_same(batched, unbatched(b, c, policy, mapping))
        check_reference(phase1, batched, b, c)

        # the runs go on in the same files (a live run), then something else happens
        final = dataclasses.replace(model, rewrites=list(phase1.rewrites))
        for r, w in writers.items():
            for s in final.steps(r):
                if s >= plan.split:
                    write_entries(w, s, final.entries(r, s), model.limits[r], model.resolve[r])
            w.close()
        r, s, i, kind = plan.late
        if plan.mutation == "late_rewrite" and s < plan.split and final.logs(r, s):
            if final.events.get((s, i), "same") == "same" and i not in model.dtype64:
                final.rewrites.append((r, s, i, kind, True, True))
                write_rewrite(logdir, final, len(final.rewrites) - 1)
        elif plan.mutation == "delete_rewrite" and files:
            index = sorted(files)[plan.delete % len(files)]
            os.remove(files[index])
            final.rewrites[index] = final.rewrites[index][:5] + (False,)
        elif plan.mutation == "rerun_cand":  # written anew: other column order, maybe the extra tensor gained or lost
            shutil.rmtree(os.path.join(logdir, "c"))
            final.perm = list(plan.perm)
            final.extra = (model.extra - {"c"}) | (frozenset("c") if plan.extra else frozenset())
            final.rewrites = [rw[:5] + (rw[5] and rw[0] == "b",) for rw in final.rewrites]
            writer = BlockWriter(os.path.join(logdir, "c"))
            for s in final.steps("c"):
                write_entries(writer, s, final.entries("c", s), model.limits["c"], model.resolve["c"])
            writer.close()
        reader.reload()
        b2, c2 = reader.run("b"), reader.run("c")
        batched.update(b2, c2)  # first: the incremental NaN/Inf scan runs here, not from the snapshot's cache
        check_reference(final, batched, b2, c2)
        assert_same(batched, unbatched(b2, c2, policy, mapping))
        reader.close()


@settings(
    max_examples=int(os.environ.get("TB_PARITY_BATCH_EXAMPLES", "40")),
    deadline=None,
    derandomize="TB_PARITY_BATCH_EXAMPLES" not in os.environ,  # the same logdirs in CI; set it to explore
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_batched_matches_per_pair_and_numpy_on_drawn_logdirs(data: st.DataObject) -> None:
    model = data.draw(models(), label="model")
    assume(not fallback_pairs(model))
    with np.errstate(over="ignore", invalid="ignore"):  # huge tensors: the sums of squares overflow
        run_scenario(model, data.draw(plans(model), label="plan"))


# -- several refreshes, several comparisons of the same snapshots ------------------------------


@dataclasses.dataclass
class Phase:
    """One refresh of :func:`run_refreshes`: the runs are written up to ``upto`` (appended to the
    same files), ``mutation`` happens (as in :class:`Plan`; ``rerun_cand`` with ``perm``, ``extra``
    and replica ``copies``), then each comparison in ``turns`` is updated and asked ``touch``."""

    upto: int
    mutation: str
    late: tuple[str, int, int, str]
    perm: tuple[int, ...]
    extra: bool
    copies: str
    turns: tuple[int, ...]  # the comparisons refreshed, in this order (a comparison may sit one out)
    touch: tuple[str, ...]  # per comparison: "report" | "matrix" | "detail" | "nothing"
    check: str  # "report": each refreshed comparison's report against a fresh one; "full": everything


def _fresh(run: Any) -> Any:
    """The snapshot without what a comparison cached in it: a fresh comparison derives it anew."""
    return dataclasses.replace(run, derived={})


def _second_policy(model: Model) -> TolerancePolicy:
    return TolerancePolicy(warmup_steps=0, rtol=0.2, equal_nan=not model.equal_nan)


def run_refreshes(model: Model, phases: list[Phase]) -> None:
    """Two comparisons of one pair of runs under two policies, refreshed in turns as the runs grow
    and change; after each refresh each is what a fresh comparison of the same snapshots says (its
    NaN/Inf scan fresh too), and numpy's cells after the last. Matrices and details taken along the
    way must not change afterwards."""
    with (
        tempfile.TemporaryDirectory() as logdir,
        mock.patch.object(comparison, "_CHUNK_BYTES", 1),
        mock.patch.object(comparison, "_MIN_CHUNK_STEPS", 4),
    ):
        writers = {r: BlockWriter(os.path.join(logdir, r)) for r in "bc"}
        state = dataclasses.replace(model, upto=0, rewrites=[])
        policies = (model.policy(), _second_policy(model))
        mapping = model.mapping_items()
        reader = LogdirReader(logdir)
        cmps: list[Optional[Comparison]] = [None, None]
        held: list[tuple[Any, np.ndarray, np.ndarray]] = []
        files: list[str] = []
        for phase in phases:
            before = state.upto
            state.upto = max(phase.upto, before)
            for r, w in writers.items():
                for s in state.steps(r):
                    if s >= before:
                        write_entries(w, s, state.entries(r, s), model.limits[r], model.resolve[r])
                w.flush()
            r, s, i, kind = phase.late
            if phase.mutation == "late_rewrite" and state.logs(r, s) and state.present(r, s, i):
                if state.events.get((s, i), "same") == "same" and i not in model.dtype64:
                    state.rewrites.append((r, s, i, kind, True, True))
                    files.append(write_rewrite(logdir, state, len(state.rewrites) - 1))
            elif phase.mutation == "delete_rewrite" and any(os.path.exists(f) for f in files):
                index = [j for j, f in enumerate(files) if os.path.exists(f)][0]
                os.remove(files[index])
                state.rewrites[index] = state.rewrites[index][:5] + (False,)
            elif phase.mutation == "rerun_cand":
                writers["c"].close()
                shutil.rmtree(os.path.join(logdir, "c"))
                state.perm = list(phase.perm)
                state.copies = phase.copies
                state.extra = (state.extra - {"c"}) | (frozenset("c") if phase.extra else frozenset())
                state.rewrites = [rw[:5] + (rw[5] and rw[0] == "b",) for rw in state.rewrites]
                writers["c"] = BlockWriter(os.path.join(logdir, "c"))
                for s in state.steps("c"):
                    write_entries(writers["c"], s, state.entries("c", s), model.limits["c"], model.resolve["c"])
                writers["c"].flush()
            reader.reload()
            if not (state.steps("b") and state.steps("c")):
                continue
            b, c = reader.run("b"), reader.run("c")
            for j in phase.turns:
                cmp = cmps[j]
                if cmp is None:
                    cmp = cmps[j] = Comparison(b, c, policies[j], mapping)
                else:
                    cmp.update(b, c)
                touch = phase.touch[j]
                if touch == "report":
                    cmp.report()
                elif touch == "matrix":
                    m = cmp.matrix()
                    held.append((m, m.reason.copy(), m.error_ratio.copy()))
                elif touch == "detail" and cmp._pairs:
                    d = cmp.detail(cmp._pairs[-1].base.tag)
                    held.append((d, d.reason.copy(), d.error_ratio.copy()))
            for j in phase.turns:
                cmp = cmps[j]
                assert cmp is not None
                fresh = Comparison(_fresh(b), _fresh(c), policies[j], mapping)
                assert cmp.report().to_dict() == fresh.report().to_dict()
                if phase.check == "full":
                    assert_same(cmp, fresh)
                    assert_same(cmp, unbatched(_fresh(b), _fresh(c), policies[j], mapping))
        for obj, reason, ratio in held:  # what was handed out stays as it was
            got = (obj.reason, obj.error_ratio)
            np.testing.assert_array_equal(got[0], reason)
            np.testing.assert_array_equal(got[1], ratio)
        if cmps[0] is not None and state.steps("b") and state.steps("c"):
            b, c = reader.run("b"), reader.run("c")
            cmps[0].update(b, c)
            check_reference(state, cmps[0], b, c)
        for w in writers.values():
            w.close()
        reader.close()


@st.composite
def phase_lists(draw: st.DrawFn, model: Model) -> list[Phase]:
    n = len(model.sizes)
    ends = sorted(draw(st.lists(st.integers(1, model.n_steps), min_size=2, max_size=4)))
    return [
        Phase(
            upto=upto,
            mutation=draw(st.sampled_from(["none", "none", "late_rewrite", "delete_rewrite", "rerun_cand"])),
            late=(
                draw(st.sampled_from("bc")),
                draw(st.integers(0, max(upto - 1, 0))),
                draw(st.integers(0, n - 1)),
                draw(st.sampled_from(REWRITES)),
            ),
            perm=tuple(draw(st.permutations(range(n)))),
            extra=draw(st.booleans()),
            copies=draw(st.sampled_from(["", "end", "inter"])),
            turns=tuple(draw(st.permutations([0, 1]))[: draw(st.integers(1, 2))]),
            touch=(
                draw(st.sampled_from(["report", "matrix", "detail", "nothing"])),
                draw(st.sampled_from(["report", "matrix", "detail", "nothing"])),
            ),
            check=draw(st.sampled_from(["report", "full"])),
        )
        for upto in ends
    ]


@settings(
    max_examples=int(os.environ.get("TB_PARITY_BATCH_EXAMPLES", "25")),
    deadline=None,
    derandomize="TB_PARITY_BATCH_EXAMPLES" not in os.environ,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_refreshes_in_turns_match_fresh_comparisons_on_drawn_logdirs(data: st.DataObject) -> None:
    """Runs written in up to four refreshes (long runs too, outgrowing the verdict table's slack),
    each possibly rewriting a step, deleting a rewrite or writing the candidate anew (other
    columns, replica copies joining its layout), two comparisons refreshed in turns."""
    model = data.draw(models(), label="model")
    if data.draw(st.booleans(), label="long"):
        model = dataclasses.replace(model, n_steps=data.draw(st.integers(20, 48), label="steps"))
    assume(not fallback_pairs(model))
    with np.errstate(over="ignore", invalid="ignore"):
        run_refreshes(model, data.draw(phase_lists(model), label="phases"))


def pinned(**changes: Any) -> Model:
    """Four statistics-only weights over 8 steps, identical in both runs, but for ``changes``."""
    base = Model(
        n_steps=8,
        kinds=["weight"] * 4,
        sizes=[4] * 4,
        dynamic=-1,
        resolve={"b": False, "c": False},
        limits={"b": 0, "c": 0},
        perm=[0, 1, 2, 3],
        mapping=False,
        extra=frozenset(),
        dtype64=frozenset(),
        huge=frozenset(),
        drop_steps={"b": frozenset(), "c": frozenset()},
        drop_tensor={},
        events={},
        rewrites=[],
        equal_nan=False,
        warmup=2,
        grad_warmup=0,
    )
    return dataclasses.replace(base, **changes)


PINNED = {  # the cases above by name, each run however the draw goes
    "NaN and Inf in both runs, settled together": (
        pinned(events={(1, 0): "nan_both", (2, 1): "inf_both", (5, 2): "nan_both"}),
        Plan(split=3, touch="report", mutation="none", chunk=4),
    ),
    "the same with equal_nan": (
        pinned(events={(1, 0): "nan_both", (2, 1): "inf_both", (5, 2): "nan_big"}, equal_nan=True),
        Plan(split=3, touch="matrix", mutation="none", chunk=4),
    ),
    "tensors a step lacks: one layout, MISSING cells settled together": (
        pinned(
            drop_tensor={("c", 2): frozenset({0, 1}), ("b", 6): frozenset({3})},
            drop_steps={"b": frozenset({4}), "c": frozenset()},
        ),
        Plan(split=5, touch="report", mutation="none", chunk=4),
    ),
    "full values beside statistics only, warm-up and an override": (
        pinned(
            sizes=[4, 12, 4, 12],
            kinds=["weight", "grad", "grad", "slot"],
            limits={"b": 8, "c": 8},
            events={(0, 0): "mid", (1, 1): "mid", (3, 2): "mid", (4, 3): "small", (6, 0): "mid"},
            grad_warmup=3,
        ),
        Plan(split=4, touch="report", mutation="none", chunk=16),
    ),
    "values kept by one run only": (
        pinned(sizes=[4, 4, 12, 12], limits={"b": 64, "c": 0}, events={(3, 2): "big", (5, 0): "small"}),
        Plan(split=8, touch="matrix", mutation="none", chunk=4),
    ),
    "candidate columns in another order, renamed by a mapping": (
        pinned(perm=[3, 1, 0, 2], mapping=True, events={(4, 2): "big", (4, 1): "nan_cand"}),
        Plan(split=2, touch="report", mutation="none", chunk=4),
    ),
    "a runtime-shaped tensor, its layouts resolved per shape": (
        pinned(dynamic=3, sizes=[4, 4, 4, 0], resolve={"b": True, "c": False}, events={(5, 3): "shape"}),
        Plan(split=4, touch="report", mutation="none", chunk=4),
    ),
    "identical statistics, other elements: full values see it, statistics cannot": (
        pinned(
            sizes=[4, 4, 12, 12],
            limits={"b": 8, "c": 8},
            events={(2, 0): "permute", (2, 2): "permute", (5, 1): "permute"},
        ),
        Plan(split=4, touch="report", mutation="none", chunk=4),
    ),
    "a runtime shape transposed (same size, same statistics), one layout per run": (
        pinned(dynamic=0, sizes=[0, 4, 4, 4], transposed=True),
        Plan(split=8, touch="matrix", mutation="none", chunk=4),
    ),
    "a runtime shape transposed, layouts resolved per shape": (
        pinned(
            dynamic=0, sizes=[0, 4, 4, 4], transposed=True, resolve={"b": True, "c": True}, limits={"b": 64, "c": 64}
        ),
        Plan(split=3, touch="report", mutation="none", chunk=4),
    ),
    "a dtype change at one step, a dtype change at every step": (
        pinned(events={(2, 1): "dtype_step"}, dtype64=frozenset({3})),
        Plan(split=4, touch="report", mutation="none", chunk=4),
    ),
    "a rewrite wins, then its file is deleted": (
        pinned(rewrites=[("c", 1, 0, "big", True, True), ("b", 2, 1, "big", False, True)]),
        Plan(split=4, touch="matrix", mutation="delete_rewrite", chunk=4),
    ),
    "a live run appended to, then an old step rewritten": (
        pinned(events={(6, 2): "big"}),
        Plan(split=4, touch="report", mutation="late_rewrite", chunk=4, late=("b", 1, 3, "big")),
    ),
    "the candidate run again in a wider layout, columns reordered": (
        pinned(extra=frozenset({"b"})),
        Plan(split=8, touch="matrix", mutation="rerun_cand", chunk=4, perm=(1, 0, 3, 2), extra=True),
    ),
    "overflowed moments (std and L2 inf)": (
        pinned(huge=frozenset({0, 1, 2}), events={(0, 0): "mid", (3, 1): "small", (5, 2): "mid"}),
        Plan(split=4, touch="matrix", mutation="none", chunk=4),
    ),
    "one pair settled to the end first (detail), the others not": (
        pinned(n_steps=12, events={(9, 1): "big"}),
        Plan(split=12, touch="detail", mutation="late_rewrite", chunk=4, late=("c", 2, 0, "same")),
    ),
}


@pytest.mark.parametrize("case", list(PINNED))
def test_batched_matches_per_pair_and_numpy_on_pinned_logdirs(case: str) -> None:
    with np.errstate(over="ignore", invalid="ignore"):
        run_scenario(*PINNED[case])


# -- cases found by the above, and the reuse check on their own ------------------------------


def _xy(names: tuple[str, ...], values: tuple[float, ...]) -> Any:
    return lambda s: [("weight", n, np.full(8, v + s, np.float32)) for n, v in zip(names, values)]


@pytest.mark.parametrize("rerun", ["columns swapped", "one more tensor"])
def test_a_run_written_anew_in_another_layout_is_compared_again(tmp_path, rerun: str) -> None:
    """The candidate is run again into a fresh directory (its old file is gone, the reader reads it
    anew) and logs its tensors in another layout. The refresh may keep an old verdict only if that
    tensor's own statistics are unchanged: comparing the layout blocks whole compared other tensors'
    columns (``x`` now sits where ``y`` was, and holds what ``y`` held: the blocks are byte-identical,
    so AGREE was kept for a candidate whose ``x`` now differs from the baseline's from step 0), or
    raised ValueError when the new layout is wider. Through the dashboard's cache too."""
    logdir = str(tmp_path)
    write_run(logdir, "b", range(6), _xy(("x", "y"), (1.0, 5.0)), limit=0)
    write_run(logdir, "c", range(6), _xy(("x", "y"), (1.0, 5.0)), limit=0)
    reader = LogdirReader(logdir)
    reader.reload()
    policy = TolerancePolicy()
    cache = ComparisonCache()
    b, c = reader.run("b"), reader.run("c")
    cmp = Comparison(b, c, policy)
    assert cmp.report().first_divergence is None
    assert cache.use("pair", b, c, policy, (), lambda e: e.report).first_divergence is None
    shutil.rmtree(os.path.join(logdir, "c"))
    if rerun == "columns swapped":  # x now holds what y held, and y what x held
        write_run(logdir, "c", range(6), _xy(("y", "x"), (1.0, 5.0)), limit=0)
    else:  # x holds the baseline's y; a third tensor joins the layout
        write_run(logdir, "c", range(6), _xy(("x", "y", "z"), (5.0, 5.0, 0.0)), limit=0)
    reader.reload()
    b2, c2 = reader.run("b"), reader.run("c")
    assert c2.tensors[("weight", "x")].block is not None
    cmp.update(b2, c2)
    first = cmp.report().first_step_divergence
    assert (first.step, first.tensor, first.reason) == (0, "x", "value")  # 1 + s vs 5 + s: numpy says so
    assert_same(cmp, unbatched(b2, c2, policy))
    report = cache.use("pair", b2, c2, policy, (), lambda e: e.report)
    assert cache.updated == 1 and report.first_step_divergence.tensor == "x"
    reader.close()


def test_a_refresh_follows_a_changed_execution_order(tmp_path) -> None:
    """From step 3 on the runs log ``b`` before ``a`` (a new layout), and both diverge at step 3:
    the first divergence is ``b``, first in execution order there, as a fresh comparison says.
    The refresh re-aligned only when the set of tensor names changed, so it kept the order of
    the steps it had seen and named ``a``."""
    logdir = str(tmp_path)

    def at(bad: bool) -> Any:
        def tensors(s: int) -> list:
            a, b = np.full(4, 1.0 + s, np.float32), np.full(4, 2.0 + s, np.float32)
            if bad and s >= 3:
                a, b = a + 10, b + 10
            out = [("weight", "a", a), ("weight", "b", b)]
            return out if s < 3 else out[::-1]

        return tensors

    writers = {name: BlockWriter(os.path.join(logdir, name)) for name in "bc"}
    for name, bad in (("b", False), ("c", True)):
        for s in range(3):
            writers[name].write_arrays(s, at(bad)(s), full_values_limit=0)
        writers[name].flush()
    reader = LogdirReader(logdir)
    reader.reload()
    policy = TolerancePolicy()
    cmp = Comparison(reader.run("b"), reader.run("c"), policy)
    assert cmp.report().first_divergence is None
    for name, bad in (("b", False), ("c", True)):
        for s in range(3, 6):
            writers[name].write_arrays(s, at(bad)(s), full_values_limit=0)
        writers[name].close()
    reader.reload()
    b2, c2 = reader.run("b"), reader.run("c")
    cmp.update(b2, c2)
    first = cmp.report().first_step_divergence
    assert (first.step, first.tensor) == (3, "b")
    assert_same(cmp, unbatched(b2, c2, policy))
    reader.close()


def _huge(step: int, i: int) -> np.ndarray:
    """float64 elements near 1e200: the sum of squares overflows, so std and L2 are recorded as inf."""
    rng = np.random.default_rng([step, i])
    return (1 + rng.random(7)) * rng.choice([-1.0, 1.0], 7) * 1e200


def test_an_overflowed_moment_neither_colours_nor_proves(tmp_path) -> None:
    """std and L2 recorded as inf in both runs (the sum of squares overflowed) are equal
    statistics: they prove nothing and colour nothing. inf - inf is NaN, which the bounds read as
    "on one side only" and so as a proven divergence: identical tensors got error ratio inf (the
    heat map's colour of a proven divergence, on an OK cell) from the per-pair path and 0 when
    their layout was settled together, and a candidate within rtol of the baseline got VALUE."""
    logdir = str(tmp_path)
    with np.errstate(over="ignore"):
        write_run(logdir, "b", range(4), lambda s: [("weight", f"w{i}", _huge(s, i)) for i in range(3)], limit=0)
        write_run(
            logdir,
            "c",
            range(4),
            lambda s: [("weight", f"w{i}", _huge(s, i) * (1 + 1e-9 * (i == 2))) for i in range(3)],
            limit=0,
        )
    policy = TolerancePolicy(warmup_steps=0)  # rtol 5% from the first step
    for s in range(4):  # numpy: every element of w2 is within tolerance, w0 and w1 are identical
        np.testing.assert_allclose(_huge(s, 2) * (1 + 1e-9), _huge(s, 2), rtol=policy.rtol, atol=policy.atol)
    reader = LogdirReader(logdir)
    reader.reload()
    b, c = reader.run("b"), reader.run("c")
    assert np.isinf(b.tensors[("weight", "w0")].stats[:, metadata.STAT_INDEX["l2"]]).all()
    with np.errstate(over="ignore", invalid="ignore"):
        batched = Comparison(b, c, policy)
        assert batched._groups  # w0 and w1: identical statistics, settled together
        assert_same(batched, unbatched(b, c, policy))
        m = batched.matrix()
    assert (m.reason == OK).all()
    assert (m.error_ratio[:, [m.tensors.index("weight/w0"), m.tensors.index("weight/w1")]] == 0).all()
    assert not (m.error_ratio > 1).any()
    assert batched.report().first_divergence is None
    reader.close()


def test_an_overflowed_moment_during_warmup_proves_nothing(tmp_path) -> None:
    """The same elements in both runs, summed in another order (the candidate's mean is off by
    an ulp, as two frameworks' reductions may be), std and L2 overflowed to inf, during warm-up
    (rtol 0): the bounds multiplied rtol 0 by an infinite RMS (NaN) and called the mean's ulp a
    proven divergence. Nothing is proven there: the mean's rounding is unbounded."""
    mean = metadata.STAT_INDEX["mean"]
    for seed in range(100):  # the first tensor whose reversed sum rounds differently
        a = _huge(seed, 0)
        if a[::-1].sum() / a.size != a.sum() / a.size:
            break
    with np.errstate(over="ignore"):
        base_stats = health.health_numpy(a)
    cand_stats = base_stats.copy()
    cand_stats[mean] = a[::-1].sum() / a.size
    assert cand_stats[mean] != base_stats[mean] and np.isinf(base_stats[metadata.STAT_INDEX["l2"]])
    layout = build_layout([("weight", "w", "float64", a.shape), ("weight", "v", "float64", (3,))], 0)
    for run, stats in (("b", base_stats), ("c", cand_stats)):
        writer = BlockWriter(str(tmp_path / run))
        for s in range(3):
            writer.write_step(s, layout, np.stack([stats, health.health_numpy(np.arange(3.0))]))
        writer.close()
    reader = LogdirReader(str(tmp_path))
    reader.reload()
    b, c = reader.run("b"), reader.run("c")
    policy = TolerancePolicy()  # warm-up: rtol 1e-7 for the first 10 compared steps
    with np.errstate(over="ignore", invalid="ignore"):
        batched = Comparison(b, c, policy)
        assert_same(batched, unbatched(b, c, policy))
        m = batched.matrix()
    assert (m.reason == OK).all()  # numpy: the elements are the very same
    assert not (m.error_ratio > 1).any()
    assert not stat_bounds.proven(base_stats[None], cand_stats[None], policy.atol, np.zeros(1)).any()
    reader.close()


def test_replica_copies_in_the_layout_of_the_one_device_tensors(tmp_path) -> None:
    """A candidate under a distribution strategy logs each variable and its replicas' copies in
    one layout: the one-device tensors are settled together over a block that also holds the
    copies. A copy that differs (NaN at step 2 in replica 1) is the copies' own finding (replicas
    out of sync); it is neither a cell of the compared tensors nor the candidate's first NaN/Inf
    (which covers the one-device tensors only, before and after batching)."""
    logdir = str(tmp_path)

    def tensors(s: int, replicas: bool) -> list:
        w, v = np.full(6, 1.0 + s, np.float32), np.full(3, -2.0 - s, np.float32)
        out = [("weight", "w", w), ("weight", "v", v)]
        if replicas:
            bad = w.copy()
            if s == 2:
                bad[0] = np.nan
            out += [("weight", "w@replica0", w), ("weight", "w@replica1", bad), ("weight", "v@replica0", v)]
        return out

    write_run(logdir, "b", range(5), lambda s: tensors(s, False), limit=0)
    write_run(logdir, "c", range(5), lambda s: tensors(s, True), limit=0)
    reader = LogdirReader(logdir)
    reader.reload()
    b, c = reader.run("b"), reader.run("c")
    policy = TolerancePolicy()
    batched = Comparison(b, c, policy)
    assert [len(g) for g in batched._groups] == [2]
    assert_same(batched, unbatched(b, c, policy))
    report = batched.report()
    assert (batched.matrix().reason == OK).all()
    first = report.first_step_divergence  # the replicas out of sync, found from the copies
    assert (first.step, first.tensor, first.candidate_tensor, first.reason) == (2, "w", "w@replica1", "replica")
    assert report.first_nonfinite == {"b": None, "c": None}
    found = report.replicas["c"]["disagreements"]
    assert [(d["step"], d["tensor"]) for d in found] == [(2, "w")]
    reader.close()


def _rewrite_step(logdir: str, run: str, step: int, tensors: list) -> None:
    """A later file (its name sorts last) that logs ``step`` of ``run`` again: last write wins."""
    file_named(
        os.path.join(logdir, run),
        rewrite_name(os.path.join(logdir, run), LAST, "rewrite"),
        [(step, [(k, n, a, None) for k, n, a in tensors])],
        64,
        False,
    )


@pytest.mark.parametrize("case", ["elements reversed: a false AGREE", "elements restored: a false divergence"])
def test_a_rewrite_that_keeps_the_statistics_is_compared_again(tmp_path, case: str) -> None:
    """A step rewritten by a later file with the same elements in another order has the very same
    statistics, and the refresh checked only the statistics of the rows it had compared: it kept
    the old verdict of a pair compared by full values. Reversed, the candidate diverges at step 2
    (numpy: not allclose) and the refresh kept AGREE; restored, the runs are identical and the
    refresh kept the divergence."""
    logdir = str(tmp_path)

    def tensors(s: int, reverse: bool = False) -> list:
        a = np.array([1, 2, 4, 8], np.float32) + s
        return [("weight", "a", a[::-1].copy() if reverse else a), ("weight", "w", np.full(4, 3.0 + s, np.float32))]

    reversed_first = case.startswith("elements restored")
    write_run(logdir, "b", range(6), tensors)
    write_run(logdir, "c", range(6), lambda s: tensors(s, reverse=reversed_first and s == 2))
    reader = LogdirReader(logdir)
    reader.reload()
    policy = TolerancePolicy()
    cmp = Comparison(reader.run("b"), reader.run("c"), policy)
    cmp.report()
    _rewrite_step(logdir, "c", 2, tensors(2, reverse=not reversed_first))
    reader.reload()
    b2, c2 = reader.run("b"), reader.run("c")
    rows = [a for k, n, a in tensors(2, reverse=not reversed_first)]
    np.testing.assert_array_equal(c2.tensors[("weight", "a")].values[2], rows[0])  # the rewrite won
    a_b, a_c = b2.tensors[("weight", "a")].values[2], c2.tensors[("weight", "a")].values[2]
    diverges = not np.allclose(a_c, a_b, rtol=1e-7, atol=policy.atol)  # numpy, the guide's warm-up check
    assert diverges == (not reversed_first)
    cmp.update(b2, c2)
    first = cmp.report().first_step_divergence
    if diverges:
        assert first is not None and (first.step, first.tensor, first.reason) == (2, "a", "value")
    else:
        assert first is None
    assert_same(cmp, Comparison(_fresh(b2), _fresh(c2), policy))
    reader.close()


def test_a_rewrite_that_keeps_the_statistics_but_not_the_runtime_shape_is_compared_again() -> None:
    """The candidate's step 1 is logged again with its runtime shape transposed ((3, 2) -> (2, 3), the
    same elements in order: the same statistics). Its dimensions now differ from the baseline's, a
    shape divergence, which the refresh missed: it compared the statistics of the rows only."""
    arrays = [np.arange(6, dtype=np.float32) + s for s in range(4)]
    dims = np.array([[3, 2]] * 4, dtype=np.int64)

    def snapshot(name: str, dims: np.ndarray, generation: int) -> Any:
        s = dataclasses.replace(
            engine_helpers.series("weight", "x", arrays, keep_values=False), shape=(None, None), dims=dims
        )
        return dataclasses.replace(engine_helpers.run(name, [s]), generation=generation)

    base = snapshot("b", dims, 1)
    cmp = Comparison(base, snapshot("c", dims, 1), TolerancePolicy())
    assert cmp.report().first_divergence is None
    transposed = dims.copy()
    transposed[1] = [2, 3]
    cand = snapshot("c", transposed, 2)
    cmp.update(base, cand)
    fresh = Comparison(base, dataclasses.replace(cand, derived={}), TolerancePolicy())
    first = fresh.report().first_step_divergence
    assert (first.step, first.reason) == (1, "shape")
    assert cmp.report().to_dict() == fresh.report().to_dict()
    assert_same(cmp, fresh)


@pytest.mark.parametrize("special", [np.inf, -np.inf])
def test_replica_copies_holding_the_same_inf_are_in_sync(tmp_path, special: float) -> None:
    """A variable and its replica copy hold the very same elements, one of them inf: the copies
    are in sync (numpy: equal, ``assert_allclose`` passes). inf - inf is NaN, which the replica
    check read as an infinite error ratio: "replica 0's copy differs from the variable's single
    copy", a divergence of a faithful port."""
    logdir = str(tmp_path)

    def tensors(s: int, copies: bool) -> list:
        w = np.full(4, 1.0 + s, np.float32)
        if s == 1:
            w[2] = special
        return [("weight", "w", w)] + ([("weight", "w" + metadata.REPLICA_MARK + "0", w.copy())] if copies else [])

    write_run(logdir, "b", range(3), lambda s: tensors(s, False))
    write_run(logdir, "c", range(3), lambda s: tensors(s, True))
    reader = LogdirReader(logdir)
    reader.reload()
    c = reader.run("c")
    single, copy = (c.tensors[("weight", n)] for n in ("w", "w" + metadata.REPLICA_MARK + "0"))
    assert copy.values is not None
    np.testing.assert_allclose(copy.values, single.values)  # numpy: the copies agree
    policy = TolerancePolicy()
    report = Comparison(reader.run("b"), c, policy).report()
    assert report.replicas["c"]["disagreements"] == []
    assert report.first_divergence is None
    reader.close()


def _shifted(step: int, i: int) -> np.ndarray:
    """float64 elements of tensor ``w{i}``; the candidate adds a constant (see the test)."""
    return np.random.default_rng([step, i]).standard_normal(50)


@pytest.mark.parametrize("refresh", [False, True])
def test_the_matrix_settles_differing_statistics_with_their_ratios(tmp_path, refresh: bool) -> None:
    """The matrix settles the rows the scan for the first divergence left (a matrix asked first, or
    the rows a refresh added after a known divergence) with the bounds computed once for both the
    verdict and the error ratio. Statistics only, rtol 0 at every step: w1 shifted by 1.5 atol is a
    proven divergence with ratio 1.5 (its min and max move by 1.5 atol; numpy: every element is out
    of tolerance), w2 shifted by 0.6 atol agrees with ratio 0.6, w0 is identical. A ratio between 1
    and 2 is the case: a verdict read from the ratios with any other threshold fails here."""
    logdir, policy = str(tmp_path), TolerancePolicy(rtol=0.0, warmup_steps=0)  # atol 1e-5 alone
    shift = {0: 0.0, 1: 1.5 * policy.atol, 2: 0.6 * policy.atol}
    for s in range(8):  # numpy, on the elements written
        np.testing.assert_allclose(_shifted(s, 2) + shift[2], _shifted(s, 2), rtol=0, atol=policy.atol)
        assert np.all(np.abs(_shifted(s, 1) + shift[1] - _shifted(s, 1)) > policy.atol)

    def write(steps: range) -> None:
        write_run(logdir, "b", steps, lambda s: [("weight", f"w{i}", _shifted(s, i)) for i in range(3)], limit=0)
        write_run(
            logdir, "c", steps, lambda s: [("weight", f"w{i}", _shifted(s, i) + shift[i]) for i in range(3)], limit=0
        )

    reader = LogdirReader(logdir)
    write(range(4) if refresh else range(8))
    reader.reload()
    batched = Comparison(reader.run("b"), reader.run("c"), policy)
    assert batched._groups  # the three tensors of one layout, settled together
    if refresh:  # the first divergence (step 0) is known: the scan stops there, the matrix settles the rest
        assert batched.report().first_divergence.tensor == "w1"
        batched.matrix()
        write(range(4, 8))
        reader.reload()
        batched.update(reader.run("b"), reader.run("c"))
        batched.report()
    m = batched.matrix()  # before any report when not refreshing
    b, c = reader.run("b"), reader.run("c")
    cols = [m.tensors.index(f"weight/w{i}") for i in range(3)]
    assert m.reason.shape[0] == 8
    assert (m.reason[:, cols[0]] == OK).all() and (m.error_ratio[:, cols[0]] == 0).all()
    assert (m.reason[:, cols[1]] == VALUE).all()
    np.testing.assert_allclose(m.error_ratio[:, cols[1]], 1.5, rtol=1e-3)
    assert (m.reason[:, cols[2]] == OK).all()
    np.testing.assert_allclose(m.error_ratio[:, cols[2]], 0.6, rtol=1e-3)
    plain = unbatched(b, c, policy)
    np.testing.assert_array_equal(m.reason, plain.matrix().reason)
    np.testing.assert_array_equal(m.error_ratio, plain.matrix().error_ratio)
    assert_same(batched, plain)
    reader.close()
