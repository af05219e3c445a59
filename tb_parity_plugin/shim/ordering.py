"""Which graph ops write a variable, so the recorder's read of it can run first.

A step's writes are not only the train op: ``UPDATE_OPS`` (batch-norm moving statistics),
a user's own ``assign``, Keras layers assigning inside their forward pass. In a graph
(TF1, or a ``tf.function`` being traced) every such op takes the variable's handle (or, for
a legacy ref variable, its ref tensor) as an input, so the handle's consumers are the
candidates; this module tells writes from reads by op type.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

import tensorflow as tf

#: Ops that take a variable's handle and only read it (or its metadata).
_READ_TYPES = frozenset(
    {
        "ReadVariableOp",
        "VarIsInitializedOp",
        "IsVariableInitialized",
        "VariableShape",
        "ResourceGather",
        "ResourceGatherNd",
        "Identity",  # a ref variable's ``read`` snapshot
        "Const",
        "DestroyResourceOp",
        "_Retval",
    }
)
#: Call op type -> (the function attributes it runs, how many leading inputs are not the functions'
#: arguments: an ``If``'s predicate, a ``Case``'s branch index).
_CALLS = {
    "If": (("then_branch", "else_branch"), 1),
    "StatelessIf": (("then_branch", "else_branch"), 1),
    "Case": (("branches",), 1),
    "StatelessCase": (("branches",), 1),
    "While": (("cond", "body"), 0),
    "StatelessWhile": (("cond", "body"), 0),
    "PartitionedCall": (("f",), 0),
    "StatefulPartitionedCall": (("f",), 0),
}
#: Ops that run a function over their inputs: they may write a handle they are given.
CALL_TYPES = frozenset(_CALLS)
#: Call op type -> the function attributes it runs.
CALL_FUNCTION_ATTRS = {t: attrs for t, (attrs, _) in _CALLS.items()}
_WRITE_PREFIXES = (
    "Assign",
    "Apply",
    "SparseApply",
    "Scatter",
    "ResourceApply",
    "ResourceSparseApply",
    "ResourceScatter",
)


def is_write(op: tf.Operation) -> bool:
    """Whether ``op`` (a consumer of a variable's handle) may write the variable (a function call
    may: :func:`call_writes` looks inside)."""
    return _writes_type(op.type) or op.type in CALL_TYPES


def _writes_type(t: str) -> bool:
    """Whether an op of type ``t`` that takes a variable's handle writes it (calls aside)."""
    if t in _READ_TYPES:
        return False
    return t.startswith(_WRITE_PREFIXES) or "StridedSliceAssign" in t


def call_writes(op: tf.Operation, index: int) -> tuple[bool, bool]:
    """(may, always): whether call op ``op`` writes the variable whose handle is its input ``index``
    on some path, and on every path (each branch of an ``If``/``Case``; a ``While``'s body may not
    run). Looks into the functions' bodies (nested calls too): TF2 control flow passes every handle a
    branch reads to the ``If``, so counting each consumer as a write made a batch norm's read-only
    ``bn1/cond`` an update (an evaluation's ``sess.run(loss)`` was written as a training step) and
    ordered ``ExponentialMovingAverage``'s ``initialized_value`` cond after the recorder's read (the
    shadow's initializer then ran the read, and what it waited for, before the variables existed).
    A function it cannot find counts as a write."""
    found = _call_functions(op.graph, op.type, [op.get_attr(a) for a in _CALLS[op.type][0]], index)
    if found is None:
        return True, True
    return _paths(op.type, found)


def _call_functions(graph: Any, op_type: str, attrs: list, index: int) -> Optional[list[bool]]:
    """Whether each function a call of ``op_type`` runs (``attrs``: its function attributes' values)
    writes its argument fed by input ``index``; None when a function is not in ``graph``'s library."""
    skip = _CALLS[op_type][1]
    if index < skip:
        return [False]
    names = [f.name for a in attrs for f in (a if isinstance(a, list) else [a])]
    out = []
    for name in names:
        writes = _function_writes(graph, name, index - skip)
        if writes is None:
            return None
        out.append(writes)
    return out


def _paths(op_type: str, writes: list[bool]) -> tuple[bool, bool]:
    """(may, always) from each function's answer (see :func:`call_writes`)."""
    if op_type in ("While", "StatelessWhile"):
        return any(writes), writes[0]  # the condition runs at least once, the body may not
    return any(writes), all(writes)


def _function_writes(graph: Any, name: str, arg: int) -> Optional[bool]:
    """Whether function ``name`` of ``graph``'s library may write the handle it takes as argument
    ``arg`` (None: not found). Cached per graph: a function's body never changes."""
    cache = getattr(graph, "_tb_parity_function_writes", None)
    if cache is None:
        cache = graph._tb_parity_function_writes = {}
    if (name, arg) not in cache:
        cache[(name, arg)] = False  # a recursive call is not a write by itself
        cache[(name, arg)] = _body_writes(graph, name, arg)
    result: Optional[bool] = cache[(name, arg)]
    return result


def _body_writes(graph: Any, name: str, arg: int) -> Optional[bool]:
    """See :func:`_function_writes`: follows the handle through the body's forwarding ops to a write
    or a nested call that writes it."""
    function = graph._get_function(name)
    definition = getattr(function, "definition", None)
    if definition is None:
        return None
    args = definition.signature.input_arg
    if arg >= len(args):
        return True
    tracked = {args[arg].name}  # names of the handle in the body: ``arg`` or ``node:output:i``
    nodes = list(definition.node_def)
    changed = True
    while changed:  # node_def is not in topological order: repeat until no new forwarding is found
        changed = False
        for node in nodes:
            inputs = [i for i in node.input if not i.startswith("^")]
            fed = [j for j, i in enumerate(inputs) if i in tracked or i.split(":")[0] in tracked]
            if not fed:
                continue
            if node.op in _FORWARD_TYPES:
                if node.name not in tracked:
                    tracked.add(node.name)  # any of its outputs
                    changed = True
                continue
            if _writes_type(node.op):
                return True
            call = _CALLS.get(node.op)
            if call is None and graph._get_function(node.op) is not None:  # a direct call by name
                attrs: list = [tf.compat.v1.NameAttrList(name=node.op)]
                call, op_type = (("f",), 0), "PartitionedCall"
            elif call is not None:
                op_type = node.op
                attrs = [_attr_functions(node.attr[a]) for a in call[0]]
            else:
                continue
            for j in fed:
                found = _call_functions(graph, op_type, attrs, j)
                if found is None or any(found):
                    return True
    return False


def _attr_functions(value: Any) -> Any:
    """A NodeDef's function attribute as ``op.get_attr`` gives it: one function, or a list."""
    if value.HasField("func"):
        return value.func
    return list(value.list.func)


def handle_of(var: Any) -> tf.Tensor:
    """The tensor a writer of ``var`` takes in the current graph: the resource handle (inside a
    ``tf.function``, its captured placeholder), or the ref tensor of a legacy variable."""
    if not hasattr(var, "handle"):
        return var.op.outputs[0]
    handle = var.handle
    graph = tf.compat.v1.get_default_graph()
    if getattr(handle, "graph", None) is not graph and hasattr(graph, "capture"):
        handle = graph.capture(handle)
    return handle


#: Ops that pass a variable's ref or handle on unchanged: v1 ``cond``'s ``Switch``/``Merge`` (what
#: ``disable_v2_behavior()`` builds for ``batch_normalization(training=<placeholder>)``), an
#: ``Identity`` of a handle. A write to their output writes the variable: a new user's batch-norm
#: update (``AssignSub`` on a ``RefSwitch``) went unordered and its moving statistics were logged
#: after the update at half the steps. Not ``Enter``: a while loop's frame cannot take an edge
#: from outside it.
_FORWARD_TYPES = frozenset({"Switch", "RefSwitch", "Merge", "RefMerge", "Identity", "RefIdentity"})


def _forwards(t: tf.Tensor) -> bool:
    """Whether ``t`` is the variable itself (a ref or a resource handle), not a value read of it."""
    return bool(t.dtype._is_ref_dtype) or t.dtype == tf.resource


def writers(var: Any, calls: bool = True, conditional: bool = True) -> list[tf.Operation]:
    """Ops of the current graph that may write ``var`` (directly, or through ops that forward its
    ref or handle: :data:`_FORWARD_TYPES`), its initializer excluded. A function call counts when
    its body writes it (:func:`call_writes`); with ``conditional=False`` only when it does on every
    path (not a cond writing it in one branch: a batch norm's update under ``tf.cond(is_training,
    ...)``, run with the other branch by an evaluation). With ``calls=False``, no call counts (inside
    a ``tf.function`` calls also initialize variables created in it)."""
    init = getattr(var, "initializer", None)
    found: list[tf.Operation] = []
    seen: set[tf.Operation] = set()
    stack = [handle_of(var)]
    while stack:
        handle = stack.pop()
        for op in handle.consumers():
            if op in seen:
                continue
            seen.add(op)
            if op.type in _FORWARD_TYPES:
                stack.extend(t for t in op.outputs if _forwards(t))
            elif op.type in CALL_TYPES:
                if calls and _call_writes_input(op, handle, conditional):
                    found.append(op)
            elif is_write(op) and op is not init:
                found.append(op)
    return found


def _call_writes_input(op: tf.Operation, t: tf.Tensor, conditional: bool) -> bool:
    """Whether call op ``op`` writes the handle ``t`` it takes (on every path unless ``conditional``)."""
    for i, x in enumerate(op.inputs):
        if x is t:
            may, always = call_writes(op, i)
            if always or (may and conditional):
                return True
    return False


#: Stateful op types that leave the program as it was when a run executes them once more: variable
#: handles and reads (and the copy of a legacy variable's buffer), an iterator's or a table's handle
#: and lookups, assertions and prints. Every other stateful op changes what later runs see: a
#: ``tf.data`` iterator's ``IteratorGetNext`` consumes a batch, a random op draws from its stream,
#: a queue's dequeue takes an element, ``MakeIterator`` restarts a pipeline, a write writes.
_SIDE_EFFECT_FREE = frozenset(
    {
        "VarHandleOp",
        "ReadVariableOp",
        "VariableV2",
        "Variable",
        "VarIsInitializedOp",
        "IsVariableInitialized",
        "ResourceGather",
        "ResourceGatherNd",
        "DeepCopy",
        "OneShotIterator",
        "Iterator",
        "IteratorV2",
        "AnonymousIteratorV2",
        "AnonymousIteratorV3",
        "MultiDeviceIterator",
        "HashTable",
        "HashTableV2",
        "MutableHashTableV2",
        "MutableHashTableOfTensorsV2",
        "MutableDenseHashTableV2",
        "LookupTableFindV2",
        "LookupTableSizeV2",
        "Assert",
        "Print",
        "PrintV2",
    }
)


def side_effects(ops: Iterable[tf.Operation]) -> set[tf.Operation]:
    """The ops among ``ops`` whose run changes what later runs see (see :data:`_SIDE_EFFECT_FREE`):
    stateful ops but for reads and handles; a function call counts when stateful."""
    return {op for op in ops if op.op_def is not None and op.op_def.is_stateful and op.type not in _SIDE_EFFECT_FREE}


def ancestors(ops: Iterable[tf.Operation]) -> set[tf.Operation]:
    """Every op ``ops`` depend on, through data and control inputs (``ops`` included)."""
    return _closure(ops, lambda op: [*(t.op for t in op.inputs), *op.control_inputs])


def descendants(ops: Iterable[tf.Operation]) -> set[tf.Operation]:
    """Every op that depends on ``ops``, through data and control edges (``ops`` included)."""
    return _closure(ops, lambda op: [*(c for t in op.outputs for c in t.consumers()), *op._control_outputs])


def _closure(
    ops: Iterable[tf.Operation], neighbours: Callable[[tf.Operation], list[tf.Operation]]
) -> set[tf.Operation]:
    """``ops`` and everything reached from them through ``neighbours``."""
    seen: set[tf.Operation] = set()
    stack = list(ops)
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        stack.extend(neighbours(op))
    return seen


#: Ops that take a step's input (a feed, a batch from a dataset or a queue).
_STEP_INPUTS = frozenset(
    {
        "Placeholder",
        "IteratorGetNext",
        "IteratorGetNextSync",
        "QueueDequeueV2",
        "QueueDequeueManyV2",
        "QueueDequeueUpToV2",
        "ReaderReadV2",
    }
)


def unordered_alias_readers(recorded: Iterable[tf.Tensor]) -> dict[tf.Operation, list[tf.Operation]]:
    """Writer -> the ops feeding a recorded tensor that read, through the aliasing ``read``
    Identity of a legacy ref variable, the very buffer that writer updates in place, and that
    are ordered neither before nor after any write (a gradient computed apart from the train
    op's own, a norm of the weights): they may run after the update and see its result."""
    ops = [t.op for t in recorded]
    if not ops:
        return {}
    graph = ops[0].graph
    feeding = ancestors(ops)
    keys = (tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, tf.compat.v1.GraphKeys.LOCAL_VARIABLES)
    inits = {v.initializer for key in keys for v in graph.get_collection(key) if hasattr(v, "initializer")}
    found: list[tuple[list[tf.Operation], list[tf.Operation]]] = []
    for op in feeding:
        if op.type != "Identity" or not op.inputs or not op.inputs[0].dtype._is_ref_dtype:
            continue
        writes = [c for c in op.inputs[0].consumers() if is_write(c) and c not in inits and not restores(c)]
        readers = [c for c in op.outputs[0].consumers() if c in feeding]
        if writes and readers:
            found.append((writes, readers))
    if not found:
        return {}
    writes_all = {w for writes, _ in found for w in writes}
    settled = ancestors(writes_all) | descendants(writes_all)  # ordered already, one way or the other
    inputs: dict[tf.Operation, set[tf.Operation]] = {}  # op -> the step inputs it takes, each walked once

    def inputs_of(op: tf.Operation) -> set[tf.Operation]:
        if op not in inputs:
            inputs[op] = {a for a in ancestors([op]) if a.type in _STEP_INPUTS}
        return inputs[op]

    out: dict[tf.Operation, list[tf.Operation]] = {}
    for writes, readers in found:
        late = [r for r in readers if r not in settled]
        for w in writes if late else ():
            # Only where the write already takes the step's inputs: an edge must not make a write
            # the user runs on its own (a reset, a copy) need a feed or pull a batch.
            fit = [r for r in late if inputs_of(r) <= inputs_of(w)]
            out.setdefault(w, []).extend(r for r in fit if r not in out.get(w, []))
    return {w: rs for w, rs in out.items() if rs}


def restores(op: tf.Operation, depth: int = 4) -> bool:
    """Whether ``op`` assigns a value restored from a checkpoint (a ``Saver``'s restore op)."""
    frontier = [t.op for t in op.inputs]
    for _ in range(depth):
        if any(o.type.startswith(("Restore", "MergeV2Checkpoints")) for o in frontier):
            return True
        frontier = [t.op for o in frontier for t in o.inputs]
    return False


def watch_session_runs() -> None:
    """Note, each time a ``Session`` runs a graph, how many ops that graph holds (see :func:`ran`).

    Why: TensorFlow ignores a control edge added to an op a session has already run (it only
    logs that the mutation "will have no effect"). A recorder that ordered an update after its
    read that way would log weights read after the update, silently; knowing which ops a
    session has seen lets it refuse instead. Sessions take ``graph._session_run_lock()`` before
    they extend their copy of the graph; the method is wrapped once, for every graph, when the
    TF1 shim is imported (a recorder created after its session ran must still know)."""
    graph_class: Any = tf.Graph
    if getattr(graph_class, "_tb_parity_watched", False):
        return
    lock = graph_class._session_run_lock

    def session_run_lock(graph: Any) -> Any:
        graph._tb_parity_ran_ops = graph.version  # the number of ops: all of them are the session's
        return lock(graph)

    graph_class._session_run_lock = session_run_lock
    graph_class._tb_parity_watched = True


def ran(op: tf.Operation) -> bool:
    """Whether a session has run ``op``'s graph since ``op`` was built (as far as
    :func:`watch_session_runs` saw): a control edge added to it now would be ignored."""
    graph = op.graph
    seen = getattr(graph, "_tb_parity_ran_ops", 0)
    if not seen:
        return False
    # The id of the last op the session saw (ops in creation order), looked up once per session
    # run: a recorder asks once per writer of every variable, and listing the ops is O(graph).
    last = getattr(graph, "_tb_parity_ran_last", None)
    if last is None or last[0] != seen:
        last = graph._tb_parity_ran_last = (seen, graph.get_operations()[seen - 1]._id)
    return bool(op._id <= last[1])
