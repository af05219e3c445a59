"""TF1 graph / ``tf.compat.v1.Session`` logging shim.

Build the graph and the train op, record tensors on a :class:`Recorder` (``minimize`` and
``apply_gradients`` also record gradients and weights), and fetch ``recorder.fetches`` in
the same ``sess.run`` as the train op::

    rec = summary_v1.Recorder("logs/tf1")
    rec.lr(lr)
    rec.activation("dense/out", h)
    rec.loss(loss)
    train_op = rec.minimize(optimizer, loss, global_step=global_step)
    with tf.compat.v1.Session() as sess:
        ...
        _, parity = sess.run([train_op, rec.fetches])
        rec.write(parity)          # step = global_step as read before the update

Why the values are "as read at the start of the step": a variable fetched beside the op
that updates it can come back before or after the update. The recorder reads each
recorded variable (weights, ``state`` such as batch-norm moving statistics, optimizer
``slot``s) into a buffer the update cannot overwrite (resource variables copy on write;
legacy ref variables are copied with ``DeepCopy``), and when ``fetches`` is first read it
makes every op of the graph that writes one of them (the train op, ``UPDATE_OPS``, your own
``assign``s, wherever they were built; not initializers or checkpoint restores)
control-depend on that read, when the variable is recorded and again when ``fetches`` is
first read (for writes built later). (Only the reads: the statistics still run in parallel
with the update.) Record, or read ``fetches``, before a session first runs the graph:
TensorFlow ignores control edges added to ops a session has already run, so a write that would
need one then raises rather than logging values that may come after the update.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Iterable, Iterator, Mapping, Optional

import numpy as np
import tensorflow as tf

from tb_parity_plugin.records import writer
from tb_parity_plugin.shim import ordering
from tb_parity_plugin.shim.recorder import (
    DEFAULT_FULL_VALUES_LIMIT,
    BaseRecorder,
    Blocks,
    StepLayouts,
    VariableRead,
    build_blocks,
)
from tb_parity_plugin.shim.variables import is_variable

ordering.watch_session_runs()  # before any session of the user's runs: see ordering.ran

_SET_KINDS = ("lr/", "hparam/")  # tags of a variable that is set from outside the training, not trained


def _read_copy(value: Any) -> tf.Tensor:
    """The current value of a variable (or tensor), never aliasing a later update.

    A resource variable's read is copy-on-write protected: an update that finds its
    buffer still referenced writes a new one. A legacy ref variable's read aliases the
    buffer that the update overwrites in place, so it is copied (``DeepCopy``).
    """
    if isinstance(value, tf.Variable):
        if hasattr(value, "handle"):
            return value.value()
        value = value.value()
    return tf.raw_ops.DeepCopy(x=tf.convert_to_tensor(value))


@contextlib.contextmanager
def _free_of_user_scopes() -> Iterator[None]:
    """Build the recorder's own ops outside the user's ``control_dependencies`` (a v1 cond's or while
    loop's control-flow context kept; a ``colocate_with`` is kept too: it adds no edge).

    Why: ``rec.minimize`` is built where the user builds the update, often under
    ``control_dependencies(UPDATE_OPS)``. Its reads then waited for the batch-norm updates, and
    ``ExponentialMovingAverage.apply`` under ``control_dependencies([train_op])`` fed such a read to
    the shadow variables' initializer: ``global_variables_initializer()`` ran the updates before the
    moving statistics existed (``FailedPreconditionError``), and a read could not run without the
    step's feeds. The values are the same: each read is still ordered before every write of its
    variable (:meth:`Recorder._order_writers`).
    """
    graph = tf.compat.v1.get_default_graph()
    flow = graph._get_control_flow_context()
    with graph.control_dependencies(None):  # which clears the control-flow context too
        graph._set_control_flow_context(flow)
        yield


def _read_after(tag: str, op: tf.Operation) -> ValueError:
    """The error for a recorded variable read after ``op`` writes it: its value would not be the step's start."""
    return ValueError(
        f"tb_parity: {tag} is read after {op.name!r} writes it (recorded under the update's control "
        "dependencies?): record it before building its update"
    )


class Recorder(BaseRecorder):
    """Collects one training step's tensors in a TF1 graph and writes them per step.

    Args:
      logdir: the run directory (one per run, e.g. ``logs/tf1``).
      full_values_limit: tensors with at most this many elements keep full values;
        larger ones keep statistics only.
    """

    def __init__(self, logdir: str, full_values_limit: int = DEFAULT_FULL_VALUES_LIMIT) -> None:
        super().__init__(full_values_limit)
        self.logdir = logdir
        self._writer = writer.BlockWriter(logdir, side="tf1", mode="graph", tensorflow=tf.__version__)
        self._blocks: Optional[Blocks] = None
        self._updates: frozenset = frozenset()  # ops writing a recorded variable (update_ops)
        self._training: frozenset = frozenset()  # those whose run trains (training_ops)
        self._before_deps: dict[frozenset, set] = {}  # user control dependencies -> their ancestors
        self._step_var: Any = None
        self._layouts = StepLayouts(self.full_values_limit)  # runtime shapes -> this step's layout
        #: global_step as read before the update (set by apply_gradients/minimize/before_update).
        self.step: Optional[tf.Tensor] = None

    # -- BaseRecorder hooks -------------------------------------------------------
    def _check_open(self) -> None:
        if tf.executing_eagerly():
            raise RuntimeError(
                "summary_v1.Recorder builds TF1 graphs; use summary_v2.Recorder in eager/tf.function code"
            )
        if self._blocks is not None:
            raise RuntimeError(
                "the recorder already built its step blocks (fetches or layout was read); "
                "record every tensor before that"
            )

    def _snapshot(self, var: Any, tag: str) -> tf.Tensor:
        return self._read_at_start(var, tag)

    def _own_ops(self) -> contextlib.AbstractContextManager[None]:
        return _free_of_user_scopes()

    def _read_at_start(self, var: Any, tag: str) -> tf.Tensor:
        """``var`` read for the step's start, without the user's control dependencies (see
        :func:`_free_of_user_scopes`); raises if those run a write of it (the user asked for the
        value after that write: ``weight``/``state`` mean the value before the step's writes)."""
        deps = tf.compat.v1.get_default_graph()._current_control_dependencies()
        if deps:
            key = frozenset(deps)
            if key not in self._before_deps:
                self._before_deps[key] = ordering.ancestors(deps)
            before = self._before_deps[key]
            for op in ordering.writers(var):
                if op in before:
                    raise _read_after(tag, op)
        with _free_of_user_scopes():
            return _read_copy(var)

    def _moment_candidates(self) -> list[Any]:
        """The graph's global variables: BERT's ``AdamWeightDecayOptimizer`` keeps its moments there,
        not as slots, so ``rec.slots(opt, tvars)`` and ``rec.variables(tvars, optimizer=opt)`` find them."""
        return list(tf.compat.v1.global_variables())

    # -- building -----------------------------------------------------------------
    def _build(self) -> Blocks:
        if self._blocks is None:
            reads = list(self._reads.values())
            entries = self._take_entries()
            if not entries:
                raise ValueError("nothing recorded: record tensors before reading fetches")
            with _free_of_user_scopes():
                self._blocks = build_blocks(entries, self.full_values_limit, dynamic_values=True)
            self._order_writes(reads)
            self._order_alias_readers([e.tensor for e in entries])
            self._updates = frozenset(op for r in reads for op in ordering.writers(r.var))
            # a variable recorded as the lr (or a hyper-parameter) is set, not trained: a run of its assign
            # alone (a plateau rule's sess.run(lr_assign) between epochs) is no step; counted as one, the hook
            # added the fetches to it, and a feed_dict model's run failed for want of its placeholders
            self._training = frozenset(
                op
                for r in reads
                if not r.tag.startswith(_SET_KINDS)
                for op in ordering.writers(r.var, conditional=bool(getattr(r.var, "trainable", True)))
            )
            self._before_deps = {}
        return self._blocks

    @property
    def update_ops(self) -> frozenset:
        """The ops that write a recorded variable (the train op's updates, ``UPDATE_OPS``, an
        accumulator's ``assign_add``), as of when ``fetches`` was first read: a ``sess.run`` that
        runs none of them trains nothing (:class:`ParityHook` skips it)."""
        self._build()
        return self._updates

    @property
    def training_ops(self) -> frozenset:
        """The :attr:`update_ops` whose run makes a ``sess.run`` a training step: all but a function
        call (``If``, ``Case``, ``While``) that writes recorded non-trainable variables only on some
        of its paths, such as a batch norm's ``tf.cond(is_training, update, ...)``, which an
        evaluation runs with its other branch. A call that may write a trainable variable (a train
        op under ``tf.cond``) counts."""
        self._build()
        return self._training

    def _after_read(self, read: VariableRead) -> None:
        self._order_writers(read)

    def _order_writers(self, read: VariableRead) -> int:
        """Make every op that writes ``read.var`` wait for ``read`` (the train op, ``UPDATE_OPS``,
        any user ``assign``, wherever built); returns how many writers are ordered after it.

        Called when the variable is recorded and again when ``fetches`` is first read (for
        writers built later). A write the read itself depends on (a variable recorded under
        the update's control dependencies) cannot be reordered, and raises naming the tensor.
        """
        before: Optional[set] = None
        ordered = 0
        for op in ordering.writers(read.var):
            if read.read.op in op.control_inputs:
                ordered += 1
                continue
            if before is None:
                before = ordering.ancestors([read.read.op])
            if op in before:
                raise _read_after(read.tag, op)
            if ordering.restores(op):
                continue
            if ordering.ran(op):  # an edge would be ignored now: fine only if it is ordered already
                if read.read.op in ordering.ancestors([op]):
                    ordered += 1
                    continue
                raise ValueError(
                    f"tb_parity: {op.name!r} writes {read.tag} and a session has already run the graph: "
                    "TensorFlow would ignore the edge that orders it after the recorder's read, and the "
                    f"values logged could be read after the update. Create the recorder and record before the "
                    "session first runs anything, read `rec.fetches` once after building the train op "
                    "(`fetches = rec.fetches`) and fetch that; or build the update with "
                    "rec.minimize/rec.apply_gradients/rec.before_update"
                )
            op._add_control_inputs([read.read.op])
            ordered += 1
        return ordered

    def _order_writes(self, reads: list[VariableRead]) -> None:
        """Orders the writers built since each variable was recorded (see :meth:`_order_writers`)."""
        if self.step is not None and self._step_var is not None:
            reads = [*reads, VariableRead(self._step_var, self.step, self.step, "global_step")]
        ordered = sum(self._order_writers(r) for r in reads)
        if reads and not ordered:
            warnings.warn(
                "tb_parity: no op writes the recorded variables yet: build the train op (and "
                "UPDATE_OPS) before reading fetches, or the values logged may be read after the update",
                stacklevel=3,
            )

    def _order_alias_readers(self, recorded: list) -> None:
        """Make each in-place write of a legacy ref variable wait for the ops that read its buffer
        through an aliasing ``read`` and feed a recorded tensor without being ordered by the graph
        (see :func:`ordering.unordered_alias_readers`): a gradient recorded from its own
        ``tf.gradients`` call, apart from the train op's, was computed after the update of the
        next layer's kernel in about one step in six, a false divergence."""
        for write, readers in ordering.unordered_alias_readers(recorded).items():
            missing = [r for r in readers if r not in write.control_inputs]
            if not missing:
                continue
            if ordering.ran(write):
                raise ValueError(
                    f"tb_parity: {write.name!r} updates a variable in place that {missing[0].name!r} reads for a "
                    "recorded tensor, and a session has already run the graph, so it cannot be ordered after "
                    "that read: read `rec.fetches` once before the session first runs anything"
                )
            write._add_control_inputs(missing)

    def set_step(self, global_step: Any) -> tf.Tensor:
        """Read ``global_step`` at the step's start (its increment is ordered after the read):
        :meth:`write` then numbers steps by it."""
        if self.step is None:
            self._check_open()
            self._step_var = global_step if is_variable(global_step) else None
            self.step = self._read_at_start(global_step, "global_step")
            if self._step_var is not None:
                self._order_writers(VariableRead(global_step, self.step, self.step, "global_step"))
        return self.step

    @contextlib.contextmanager
    def before_update(self, global_step: Optional[Any] = None) -> Iterator[Recorder]:
        """Context for building your own update op (kept for older code: every op writing a
        recorded variable is now ordered after its read wherever it is built). Reads
        ``global_step`` first, so :meth:`write` numbers steps by it.

        Example::

            rec.grads_and_vars(grads_and_vars)
            with rec.before_update(global_step):
                train_op = optimizer.apply_gradients(grads_and_vars, global_step)
        """
        if global_step is not None:
            self.set_step(global_step)
        deps = [r.read for r in self._reads.values()] + ([self.step] if self.step is not None else [])
        with tf.control_dependencies(deps):
            yield self

    def apply_gradients(
        self,
        optimizer: Any,
        grads_and_vars: Iterable[tuple],
        global_step: Optional[Any] = None,
        name: Optional[str] = None,
    ) -> tf.Operation:
        """Records each gradient and weight, then ``optimizer.apply_gradients`` after them."""
        pairs = self.grads_and_vars(grads_and_vars)
        with self.before_update(global_step):
            return optimizer.apply_gradients(pairs, global_step=global_step, name=name)

    def minimize(
        self,
        optimizer: Any,
        loss: tf.Tensor,
        global_step: Optional[Any] = None,
        var_list: Optional[list] = None,
        name: Optional[str] = None,
    ) -> tf.Operation:
        """``optimizer.compute_gradients`` then :meth:`apply_gradients`."""
        pairs = optimizer.compute_gradients(loss, var_list=var_list)
        return self.apply_gradients(optimizer, pairs, global_step=global_step, name=name)

    def variables(self, variables: Any = None, optimizer: Any = None) -> list:
        """Like :meth:`BaseRecorder.variables`; by default every global variable but the global
        step (the optimizer's own variables become slots, or are left out)."""
        if variables is None:
            # nor a variable already recorded as the lr or a hyper-parameter (``rec.lr(lr_var)``, assigned by a
            # plateau rule): a Keras port's lr is no state either, and recording it as state raised
            gs = tf.compat.v1.train.get_global_step()
            set_ids = {id(r.var) for r in self._reads.values() if r.tag.startswith(_SET_KINDS)}
            variables = [v for v in tf.compat.v1.global_variables() if v is not gs and id(v) not in set_ids]
        for opt in optimizer if isinstance(optimizer, (list, tuple)) else [optimizer]:
            if _slots_not_built(opt):
                # TF1 builds an optimizer's slots in minimize/apply_gradients: asked before, none was recorded,
                # silently, and the comparison told a new user who had passed optimizer=opt to pass it
                raise ValueError(
                    f"tb_parity: {type(opt).__name__} has no slots yet (TF1 builds them in minimize or "
                    "apply_gradients): call rec.variables(optimizer=opt) after rec.minimize(...) (or your own "
                    "opt.minimize / apply_gradients), before reading rec.fetches"
                )
        return super().variables(variables, optimizer)

    @property
    def fetches(self) -> dict:
        """What to fetch in the train op's ``sess.run``; pass the result to :meth:`write`.

        Reading it ends recording: the blocks are built and every op writing a recorded
        variable is ordered after the recorder's read of it.
        """
        blocks = self._build()
        out: dict = {
            "stats": blocks.stats,
            "values": dict(blocks.values),
            "scalars": dict(blocks.scalars),
            "shapes": dict(blocks.shapes),
        }
        if self.step is not None:
            out["step"] = self.step
        return out

    @property
    def layout(self):
        return self._build().layout

    # -- writing ------------------------------------------------------------------
    def write(self, fetched: Mapping[str, Any], step: Optional[int] = None) -> None:
        """Write one step from the fetched ``fetches``; ``step`` defaults to its global step."""
        if step is None:
            if "step" not in fetched:
                raise ValueError("no step: pass step= or give global_step to apply_gradients/minimize")
            step = int(np.asarray(fetched["step"]))
        self._writer.write_step(
            int(step),
            self._layouts.of(self._build(), fetched.get("shapes", {})),
            fetched["stats"],
            fetched.get("values", {}),
            {k: float(v) for k, v in fetched.get("scalars", {}).items()},
        )

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class ParityHook(tf.compat.v1.train.SessionRunHook):
    """Writes the recorder's blocks on every ``MonitoredTrainingSession`` run that trains.

    A run trains when it runs an op that writes a recorded variable (``Recorder.training_ops``;
    without recorded variables, one that writes a trainable variable): an evaluation's
    ``sess.run(loss)`` is not a step, not even through a batch norm's ``training=is_training`` cond
    (TF2 control flow builds an ``If`` that takes the variables' handles; each was once counted as
    a write, and a faithful pair got INCOMPLETE). Until session 18 every run was written: a new user's
    validation run every 10 steps, without a global step, shifted every later step number by one
    (a false divergence blamed on "another batch"), and with one, its batch overwrote the step's.

    The step is the global step as read before the update when the recorder built the
    update with a ``global_step``; otherwise the global step at session creation,
    counted up by one per training run.

    A run that trains but does not itself run an op with a side effect that the recorder's fetches
    need (a ``tf.data`` iterator's ``IteratorGetNext``, a dropout's random op, a queue's dequeue) is
    not recorded either, with a warning: adding the fetches would run that op once more, and change
    the program the tool checks. Until session 23 they were added: an evaluation that ran batch
    norm's updates on its own iterator (``sess.run([eval_loss, eval_update_ops])``), and the apply
    and zeroing runs of gradient accumulation, each took one batch of the training iterator, so the
    TF1 original trained on other batches under the hook than without it (a new user's faithful
    port was a false DIVERGE at the first step after an evaluation, blamed on "another batch", and
    the TF1 run stopped early when its dataset ran out).
    """

    def __init__(self, recorder: Recorder) -> None:
        self._recorder = recorder
        self._fetches: dict = {}
        self._next_step: Optional[int] = None
        self._global_step: Optional[tf.Variable] = None
        self._updates: frozenset = frozenset()
        self._side_effects: set = set()  # ops with a side effect that the recorder's fetches run
        self._records: dict[tuple, bool] = {}  # a run's fetched ops -> whether it is a step to record

    def begin(self) -> None:
        self._fetches = self._recorder.fetches
        self._updates = self._recorder.training_ops or frozenset(
            op for v in tf.compat.v1.trainable_variables() for op in ordering.writers(v)
        )
        if "step" not in self._fetches:
            self._global_step = tf.compat.v1.train.get_global_step()
        self._side_effects = ordering.side_effects(ordering.ancestors(self._ops(self._fetches)))

    def after_create_session(self, session: tf.compat.v1.Session, coord: Any) -> None:
        if "step" not in self._fetches:
            self._next_step = int(session.run(self._global_step)) if self._global_step is not None else 0

    @staticmethod
    def _ops(fetches: Any) -> list[tf.Operation]:
        """The ops that fetching ``fetches`` (tensors, ops or their names, nested) runs."""
        graph = tf.compat.v1.get_default_graph()
        ops = []
        for f in tf.nest.flatten(fetches):
            element = graph.as_graph_element(f) if isinstance(f, str) else f
            op = element if isinstance(element, tf.Operation) else getattr(element, "op", None)
            if op is not None:
                ops.append(op)
        return ops

    def _is_step(self, fetches: Any) -> bool:
        """Whether a run of ``fetches`` is a step to record: it runs an update (no updates known:
        every run does), and the recorder's fetches add no op with a side effect to it (a warning
        says so when they would). Decided once per set of fetched ops, from one walk of the graph."""
        ops = self._ops(fetches)
        key = tuple(op.name for op in ops)
        if key not in self._records:
            before = ordering.ancestors(ops) if self._updates or self._side_effects else set()
            if self._updates and not before & self._updates:
                self._records[key] = False
                return False
            added = sorted(self._side_effects - before, key=lambda op: op.name)
            if added:
                names = ", ".join(f"{op.name!r} ({op.type})" for op in added[:3])
                warnings.warn(
                    f"tb_parity: a sess.run of {', '.join(key[:3]) or 'nothing'} writes recorded variables but does "
                    f"not run {names}, which the recorder's fetches need: it is not recorded, since fetching them "
                    "would run those once more (consume a batch of your input pipeline, draw random numbers) and "
                    "change the training the tool checks. An evaluation that runs UPDATE_OPS is then no step, and "
                    "under gradient accumulation run the update with the last micro-batch's (README: Gradient "
                    "accumulation)",
                    stacklevel=4,
                )
            self._records[key] = not added
        return self._records[key]

    def before_run(self, run_context: Any) -> Optional[tf.compat.v1.train.SessionRunArgs]:
        if not self._is_step(run_context.original_args.fetches):
            return None
        return tf.compat.v1.train.SessionRunArgs(self._fetches)

    def after_run(self, run_context: Any, run_values: Any) -> None:
        if run_values.results is None:  # a run that trains nothing (before_run asked for nothing)
            return
        step = None
        if self._next_step is not None:
            step, self._next_step = self._next_step, self._next_step + 1
        self._recorder.write(run_values.results, step=step)

    def end(self, session: tf.compat.v1.Session) -> None:
        self._recorder.flush()


def _slots_not_built(optimizer: Any) -> bool:
    """Whether ``optimizer`` is a TF1 optimizer that keeps slots (its class creates some: Momentum,
    Adam, RMSProp, ...; not plain gradient descent) but has built none yet, its update not built."""
    base = tf.compat.v1.train.Optimizer
    return (
        isinstance(optimizer, base)
        and type(optimizer)._create_slots is not base._create_slots
        and not optimizer.get_slot_names()
    )
