"""Optimizer slots of a model variable, for the TF1 ``tf.compat.v1.train`` optimizers and
the Keras ones (tf_keras legacy ``OptimizerV2``, tf_keras and Keras 3 ``Optimizer``).

Each family stores its slots differently (``get_slot`` by name, or lists indexed per
variable), and names them differently (``dense/kernel/Momentum:0``, ``dense/kernel/m:0``,
``m/dense/kernel:0``, ``adam/dense_kernel_momentum``); ``engine/align.py`` pairs those names
without a user map. This module only finds the variables, and says how to read them so that
both sides mean the same quantity (see :data:`Slot.scale`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import re
from typing import Any, Optional, Sequence

import tensorflow as tf

from tb_parity_plugin.shim import partitions
from tb_parity_plugin.shim.variables import is_variable, variable_name


@dataclasses.dataclass(frozen=True)
class Slot:
    """One slot variable of one model variable.

    Attributes:
      name: the record name (the slot variable's own name; for Keras 3, whose slot names
        flatten the model variable's path, ``<variable path>/<slot>``; for a TF1 optimizer given
        its own ``name=``, the name its class would have given: :func:`_tf1_spelling`).
      variable: the slot variable.
      lr_units: Keras SGD keeps ``m = momentum*m - lr*g`` (weight units) where TF1's
        ``MomentumOptimizer`` keeps ``a = momentum*a + g`` (gradient units); such a slot is
        recorded as ``-m / lr`` (lr of this step), so both sides record the accumulator this
        step's update multiplies by ``-lr``, and a faithful port agrees.
    """

    name: str
    variable: Any
    lr_units: bool = False


def _is_keras_sgd(optimizer: Any) -> bool:
    return any(c.__name__ == "SGD" for c in type(optimizer).__mro__) and hasattr(optimizer, "nesterov")


#: The methods that hold a Keras optimizer's update rule (tf_keras and Keras 3; tf_keras legacy).
_UPDATE_RULES = ("update_step", "_resource_apply_dense", "_resource_apply_sparse")


def _keeps_keras_velocity(optimizer: Any) -> bool:
    """Whether ``optimizer`` is a Keras SGD updating by Keras's own rule, so its momentum slot is
    ``-lr x accumulator`` (:attr:`Slot.lr_units`). A subclass that overrides the rule keeps the slot
    as its own rule does, recorded as held: a new user's port wrote TF1's accumulator rule into an
    ``SGD`` subclass's ``update_step`` (the README: no Keras SGD matches ``MomentumOptimizer`` under
    a schedule), and the slot, divided by ``-lr`` anyway, was a false DIVERGE at step 1, cosine -1.
    An override that calls ``super().<rule>(...)`` keeps Keras's rule (a subclass that only adds to it)."""
    if not _is_keras_sgd(optimizer):
        return False
    sgd = next(c for c in type(optimizer).__mro__ if c.__name__ == "SGD")
    for rule in _UPDATE_RULES:
        own = getattr(type(optimizer), rule, None)
        if own is not getattr(sgd, rule, None) and not _calls_super(own, rule):
            return False
    return True


def _calls_super(method: Any, rule: str) -> bool:
    """Whether ``method``'s source calls ``super().<rule>(`` (False when it has no source)."""
    try:
        source = inspect.getsource(method)
    except (OSError, TypeError):
        return False
    return re.search(r"super\([^)]*\)\s*\.\s*" + re.escape(rule) + r"\s*\(", source) is not None


def _strip(name: str) -> str:
    return name[:-2] if name.endswith(":0") else name


def build_slots(optimizer: Any, var_list: list[Any]) -> None:
    """Create the optimizer's slots now (Keras builds them lazily at its first update), outside the
    function being traced, as Keras's own ``apply_gradients`` builds them (``tf.init_scope``): under
    ParameterServerStrategy a step scheduled by ClusterCoordinator traces with the strategy current
    but its variable creator not in force, so a legacy optimizer's slots built in the trace were made
    on the coordinator ("Cannot place the graph ... /job:chief ... vs /job:ps"); under
    MirroredStrategy, ``fit``'s first step built them inside the function's variable-initialization
    ``cond`` and failed ("You must feed a value for placeholder tensor 'cond/else/...'").

    In the scope of the strategy the variables were made in, when no strategy is current: a tf_keras
    optimizer makes its slots with ``tf.distribute.get_strategy()``, which is the strategy inside
    ``strategy.run`` (where Keras builds them) but the default one around it, where a custom loop
    records (``rec.step(..., variables=model, optimizer=opt)`` before ``strategy.run``): the slots
    were plain variables that each replica updated in turn (a new user's faithful MirroredStrategy
    port trained otherwise, its momentum 1.9 times TF1's after one step, the replicas' weights apart)."""
    with tf.init_scope(), _variables_strategy_scope(var_list):
        if hasattr(optimizer, "_create_all_weights"):  # tf_keras legacy OptimizerV2: per variable, each call
            optimizer._create_all_weights(var_list)
        elif hasattr(optimizer, "build") and unbuilt(optimizer):
            optimizer.build(var_list)


def _variables_strategy_scope(var_list: list[Any]) -> Any:
    """The scope of the strategy whose variables ``var_list`` holds (a Keras 3 variable's through its
    ``value``), entered only when no strategy is current; else a no-op."""
    if tf.distribute.has_strategy():
        return contextlib.nullcontext()
    for var in var_list:
        for candidate in (var, getattr(var, "value", None)):
            if isinstance(candidate, tf.distribute.DistributedValues):
                return candidate.distribute_strategy.scope()
    return contextlib.nullcontext()


def unbuilt(optimizer: Any) -> bool:
    """Whether ``optimizer`` is a Keras one that has not created its slots yet (so which variables
    it updates is not known); a TF1 optimizer keeps slots only for its ``var_list``: never."""
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        return False
    if hasattr(optimizer, "_create_all_weights"):  # tf_keras legacy OptimizerV2: set by its first update
        return not getattr(optimizer, "_hypers_created", True)  # (a plain SGD keeps no slot ever)
    if hasattr(optimizer, "build"):
        return not (getattr(optimizer, "_built", False) or getattr(optimizer, "built", False))
    return False


#: The role Keras ``use_ema`` gives the moving average of each model variable it keeps among its
#: optimizer's variables (tf_keras ``average/dense/kernel``, Keras 3 ``adam/dense_kernel_average``).
#: It is no slot: the update never reads it. TF1 keeps the same quantity outside the optimizer,
#: in ``ExponentialMovingAverage``'s shadow variables (``dense/kernel/ExponentialMovingAverage``),
#: which the shim records as ``state``; so the average is ``state`` on both sides, and a faithful
#: port pairs (as a slot it was recorded by one run only: a false structure DIVERGE, new user 5).
AVERAGE_ROLE = "average"

#: The leaves a moving average of ``<variable>`` is named with in a port's own optimizer: TF2's
#: ``tf.train.ExponentialMovingAverage`` names its shadow ``<variable>/ExponentialMovingAverage``
#: (``engine/align.py`` pairs each spelling with TF1's): ``state``, as TF1's shadows are, no slot (as
#: a slot a faithful port's average was a structure DIVERGE against TF1's).
AVERAGE_LEAVES = ("ExponentialMovingAverage", "average")

#: The role Keras 3 ``gradient_accumulation_steps`` gives the sum of a variable's micro-batch gradients
#: it keeps among its optimizer's variables (``adam/dense_kernel_gradient_accumulator``). No slot of
#: the update rule either: a TF1 original accumulates in its own non-trainable variables, which the
#: shim records as ``state`` (README: "Gradient accumulation"), so it is ``state`` here too.
ACCUMULATOR_ROLE = "gradient_accumulator"


def _keras_variables_of(optimizer: Any, var: Any) -> list[tuple[str, Slot]]:
    """(role, slot) for each variable a tf_keras (``m/dense/kernel:0``) or Keras 3
    (``adam/dense_kernel_m``) ``Optimizer`` keeps for ``var``."""
    out: list[tuple[str, Slot]] = []
    sgd = _keeps_keras_velocity(optimizer)
    path = getattr(var, "path", None)
    flat = path.replace("/", "_") if path else None
    for slot in _unsharded(optimizer.variables if not callable(optimizer.variables) else optimizer.variables()):
        own = _strip(variable_name(slot))
        scope = getattr(optimizer, "name", None)  # a LossScaleOptimizer has none
        scoped = own[len(scope) + 1 :] if scope and own.startswith(f"{scope}/") else ""
        if scoped.endswith("/" + _strip(var.name)) and scoped.count("/") == _strip(var.name).count("/") + 1:
            # built by Keras's own first update (a fit before the recorder saw the optimizer: a first phase
            # unrecorded, a second compiled with model.optimizer), under the optimizer's name scope
            # (SGD/m/dense/kernel): its slots went unrecorded, silently
            own = scoped
        if own.endswith("/" + _strip(var.name)) and own.count("/") == _strip(var.name).count("/") + 1:
            role = own.split("/", 1)[0]
            out.append((role, Slot(own, slot, lr_units=sgd and role in ("m", "momentum"))))
        elif flat and own.startswith(f"{optimizer.name}/{flat}_"):
            role = own[len(f"{optimizer.name}/{flat}_") :]
            out.append((role, Slot(f"{path}/{role}", slot, lr_units=sgd and role == "momentum")))
    roles = [role for role, _ in out]
    if len(set(roles)) < len(roles):
        # several variables of this one's name (tf_keras names a variable after its layer alone: two
        # sub-models with a layer "hidden" each), each with its slots of that name: each variable was
        # given both copies' slots, and the second was recorded twice
        indexed = _indexed_slots(optimizer, var)
        if indexed is not None:
            out = [(role, slot) for role, slot in out if id(slot.variable) in indexed]
    return out


def _indexed_slots(optimizer: Any, var: Any) -> Optional[set[int]]:
    """Ids of the variables a tf_keras ``Optimizer`` keeps for ``var`` by its index: each slot list it builds
    (SGD's ``momentums``, Adam's ``_momentums`` and ``_velocities`` ...) holds one per variable, in the order of
    ``_index_dict``; None when the optimizer keeps no such index, or not of ``var``."""
    index = getattr(optimizer, "_index_dict", None)
    key = getattr(optimizer, "_var_key", None)
    if not isinstance(index, dict) or not callable(key) or key(var) not in index:
        return None
    i = index[key(var)]
    lists = [v for v in vars(optimizer).values() if isinstance(v, list) and len(v) == len(index)]
    return {id(lst[i]) for lst in lists if is_variable(lst[i])}


def _unsharded(variables: Any) -> list[Any]:
    """``variables`` with each ``ShardedVariable`` replaced by its shards. A tf_keras ``Optimizer``
    keeps the slots of a ``ShardedVariable``'s shards (``ParameterServerStrategy``) in its
    ``variables`` only as one ``ShardedVariable`` per slot, named ``ShardedVariable``: the shards'
    slots ``m/item_embedding/embeddings/part_0`` went unfound, and a port's tables had no slots."""
    return [part for v in variables for part in (partitions.shards(v) or [v])]


def _new_slots(optimizer: Any, var: Any) -> list[Slot]:
    """Slots of a tf_keras or Keras 3 ``Optimizer`` (not its :data:`AVERAGE_ROLE` variables)."""
    if _is_keras_sgd(optimizer) and not getattr(optimizer, "momentum", 0):
        return []  # tf_keras builds momentum slots even without momentum; they stay unused
    return [slot for role, slot in _keras_variables_of(optimizer, var) if role not in (AVERAGE_ROLE, ACCUMULATOR_ROLE)]


def _tf1_spelling(optimizer: Any, name: str) -> str:
    """A TF1 slot's record name as its optimizer class names it by default. TF1 names a variable's
    slots ``<variable>/<optimizer name>``, ``..._1``, ``..._2`` in creation order, and the engine reads
    the role from the class's own spelling (RMSProp's ``RMSProp_1`` is the momentum, or the mean
    gradient when centered): a new user's ``RMSPropOptimizer(..., name="MyOpt")`` had its momentum
    paired with Keras's mean square by position, a false DIVERGE at step 0."""
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        return name
    try:
        default = inspect.signature(type(optimizer).__init__).parameters["name"].default
    except (KeyError, TypeError, ValueError):
        return name
    own = getattr(optimizer, "_name", None)
    if not isinstance(default, str) or not isinstance(own, str) or own == default:
        return name
    scope, _, leaf = name.rpartition("/")
    found = re.fullmatch(re.escape(own) + r"(_\d+)?(:\d+)?", leaf)
    return f"{scope}/{default}{found.group(1) or ''}{found.group(2) or ''}" if scope and found else name


def own_optimizer(optimizer: Any) -> bool:
    """Whether ``optimizer`` is none of TF1's, tf_keras's or Keras's optimizers: a port's own update, such
    as a ``tf.Module`` keeping its slots as ``tf.Variable``s (the migration guide's non-Keras ports)."""
    if isinstance(optimizer, tf.compat.v1.train.Optimizer) or hasattr(optimizer, "get_slot_names"):
        return False
    return not any(
        c.__module__.split(".")[0] in ("keras", "tf_keras") and "Optimizer" in c.__name__
        for c in type(optimizer).__mro__
    )


def keeps_unnamed_slots(optimizer: Any, var_list: list[Any], model: Sequence[Any] = ()) -> bool:
    """Whether a port's own optimizer (:func:`own_optimizer`) holds variables of some trained
    variable's shape and dtype: slots :func:`_own_slots` would find if they were named after their variables.
    One holding none (plain SGD, or a step counter alone) has no slot to record. The trained
    variables themselves and the rest of ``model``'s, which an optimizer may hold (a plain SGD given
    its parameters, ``self.params = var_list``), and its named averages are no unnamed slot: such an
    SGD was refused at its first step."""
    held = getattr(optimizer, "variables", ())
    # not a scalar's: a float step counter, learning rate or loss scale holds the shape and dtype of a
    # learnable scalar (an output scale), and a valid program is not refused for a guess
    kinds = {_shape_and_dtype(v) for v in var_list if _shape(v) != ()}
    skip = {id(v) for v in [*var_list, *model]} | own_named(optimizer, var_list)
    return any(
        _shape_and_dtype(v) in kinds for v in _unsharded(held() if callable(held) else held) if id(v) not in skip
    )


def _shape_and_dtype(var: Any) -> tuple[tuple[Optional[int], ...], str]:
    """A slot has its variable's shape and dtype: an int64 step counter is no slot of a scalar weight
    (a hand-written plain SGD on a model with a learnable scale was refused as a misnamed slot)."""
    return _shape(var), tf.as_dtype(var.dtype).base_dtype.name


def own_named(optimizer: Any, var_list: list[Any]) -> set[int]:
    """id of each variable of a port's own optimizer named after one of ``var_list``
    (:func:`_own_variables`): its slots and moving averages."""
    if not hasattr(optimizer, "variables"):
        return set()
    return {id(slot.variable) for var in var_list for slot in _own_variables(optimizer, var)}


def _own_variables(optimizer: Any, var: Any) -> list[Slot]:
    """A port's own optimizer's (:func:`own_optimizer`) variables named ``<variable>/<leaf>`` (also
    under its own name scope) of ``var``'s shape, named ``<variable>/<leaf>``."""
    stem = _strip(variable_name(var))
    scopes = {stem, f"{getattr(optimizer, 'name', '')}/{stem}"}
    out = []
    for slot in _unsharded(optimizer.variables if not callable(optimizer.variables) else optimizer.variables()):
        scope, _, leaf = _strip(variable_name(slot)).rpartition("/")
        if scope in scopes and leaf and _shape(slot) == _shape(var):
            out.append(Slot(f"{stem}/{leaf}", slot))
    return out


def _own_slots(optimizer: Any, var: Any) -> list[Slot]:
    """The slots a port's own optimizer (:func:`own_optimizer`) keeps for ``var``: its variables named
    ``<variable>/<slot>`` (also under its own name scope) of ``var``'s shape, recorded as
    ``<variable>/<slot>``, as TF1 and tf_keras legacy spell theirs (``dense/kernel/momentum``), so they
    pair by role. Matched as Keras's ``m/<variable>``, none was found: a new user's ``tf.Module``
    optimizer given to ``rec.step(..., optimizer=opt)`` had no slot recorded, silently, and was told to
    pass ``optimizer=opt``. Not its moving averages (:data:`AVERAGE_LEAVES`): :func:`averages_of`."""
    return [s for s in _own_variables(optimizer, var) if s.name.rpartition("/")[2] not in AVERAGE_LEAVES]


def slots_of(optimizer: Any, var: Any) -> list[Slot]:
    """Every slot ``optimizer`` keeps for ``var`` (empty if it keeps none, or has not built them)."""
    if hasattr(optimizer, "variables") and own_optimizer(optimizer):
        return _own_slots(optimizer, var)
    if hasattr(optimizer, "get_slot_names"):  # TF1 train.Optimizer, tf_keras legacy OptimizerV2
        found = []
        sgd = _keeps_keras_velocity(optimizer)
        for slot_name in optimizer.get_slot_names():
            try:
                slot = optimizer.get_slot(var, slot_name)
            except KeyError:  # legacy Keras raises when var has no such slot
                slot = None
            if slot is not None:
                name = _tf1_spelling(optimizer, variable_name(slot))
                found.append(Slot(name, slot, lr_units=sgd and slot_name == "momentum"))
        return found
    if hasattr(optimizer, "variables"):
        return _new_slots(optimizer, var)
    raise TypeError(f"tb_parity: cannot find the slots of {type(optimizer).__name__}: not an optimizer")


def averages_of(optimizer: Any, var: Any) -> list[Slot]:
    """The moving average of ``var`` that a Keras optimizer with ``use_ema=True`` keeps
    (:data:`AVERAGE_ROLE`; empty for every other optimizer), with or without momentum."""
    if hasattr(optimizer, "get_slot_names") or not hasattr(optimizer, "variables"):
        return []
    if own_optimizer(optimizer):  # a port's own: an ExponentialMovingAverage's <variable>/ExponentialMovingAverage
        return [s for s in _own_variables(optimizer, var) if s.name.rpartition("/")[2] in AVERAGE_LEAVES]
    return [slot for role, slot in _keras_variables_of(optimizer, var) if role == AVERAGE_ROLE]


def accumulators_of(optimizer: Any, var: Any) -> list[Slot]:
    """The gradient accumulator of ``var`` that a Keras 3 optimizer with ``gradient_accumulation_steps``
    keeps (:data:`ACCUMULATOR_ROLE`; empty for every other optimizer)."""
    if hasattr(optimizer, "get_slot_names") or not hasattr(optimizer, "variables"):
        return []
    return [slot for role, slot in _keras_variables_of(optimizer, var) if role == ACCUMULATOR_ROLE]


def accumulation_steps(optimizer: Any) -> int:
    """Keras 3's ``gradient_accumulation_steps`` of ``optimizer`` (0 when it applies every step)."""
    return int(getattr(optimizer, "gradient_accumulation_steps", None) or 0)


#: The leaves BERT's ``AdamWeightDecayOptimizer`` (google-research/bert ``optimization.py``, copied
#: by ELECTRA, ALBERT and thousands of fine-tuning projects) gives the two moments it keeps as plain
#: variables (``get_variable``), ``<variable>/adam_m`` and ``/adam_v``; the LAMB optimizers built on it give
#: theirs (ALBERT's ``adam_m``/``adam_v``, others' ``lamb_m``/``lamb_v``): ``b m + (1 - b) g`` and
#: ``b v + (1 - b) g²``, Adam's moments without bias correction. They are no TF1 slots (``get_slot``
#: finds none), so ``rec.variables`` once recorded them as ``state`` and the Keras port's ``m``/``v``
#: as slots: a new user's BERT port had 96 structure lines, and the hint's ``--allow-unmatched``
#: left every moment uncompared. ``engine/align.py`` reads these spellings as Adam's ``m`` and ``v``.
MOMENT_LEAVES = ("adam_m", "adam_v", "lamb_m", "lamb_v")


def _shape(var: Any) -> tuple[Optional[int], ...]:
    return tuple(tf.TensorShape(var.shape).as_list())


def named_moments(var_list: list[Any], candidates: list[Any]) -> dict[int, list[Slot]]:
    """id(variable) -> the moments among ``candidates`` that a BERT-style optimizer keeps for it
    (:data:`MOMENT_LEAVES`), in that order: a non-trainable variable named ``<variable>/adam_m``
    (...) of the variable's own shape. Both conditions, so that a user's own non-trainable
    ``<variable>/adam_v`` of another shape stays ``state``. Named as they are (a TF1 slot's record
    name is its own name too)."""
    trainable = [v for v in var_list if getattr(v, "trainable", True)]
    if not trainable:
        return {}
    by_name: dict[str, Any] = {}
    for c in candidates:
        if not getattr(c, "trainable", True):
            by_name.setdefault(_strip(variable_name(c)), c)
    found: dict[int, list[Slot]] = {}
    for var in trainable:
        stem = _strip(variable_name(var))
        for leaf in MOMENT_LEAVES:
            moment = by_name.get(f"{stem}/{leaf}")
            if moment is not None and _shape(moment) == _shape(var):
                found.setdefault(id(var), []).append(Slot(variable_name(moment), moment))
    return found


def current_lr(optimizer: Any, dtype: tf.DType = tf.float32) -> Optional[tf.Tensor]:
    """The learning rate ``optimizer`` applies at its current iteration (None if unknown).

    tf_keras's ``learning_rate`` property returns the rate of the *previous* update under a
    schedule, so a schedule is evaluated at ``iterations`` here.
    """
    if hasattr(optimizer, "_decayed_lr"):  # tf_keras legacy
        return tf.cast(optimizer._decayed_lr(dtype), dtype)
    schedule = getattr(optimizer, "_learning_rate", None)
    if callable(schedule) and hasattr(optimizer, "iterations"):
        # Keras 3 with gradient_accumulation_steps: `iterations` counts updates, while the schedule
        # it applies reads the micro-batch count `_iterations` (its docstring: "Learning rate schedules
        # will look at 'real' iterations value"); the update count recorded another lr than it applied
        counter = optimizer._iterations if accumulation_steps(optimizer) else optimizer.iterations
        return tf.cast(schedule(counter), dtype)
    lr = getattr(optimizer, "learning_rate", None)
    if lr is None:
        return None
    if isinstance(lr, tf.Variable) or hasattr(lr, "value"):
        lr = tf.convert_to_tensor(lr)
    return tf.cast(lr, dtype)


def lr_variable(optimizer: Any) -> Optional[tf.Variable]:
    """The variable holding ``optimizer``'s learning rate when it is one (a float lr, which a custom
    loop may assign each step), not a schedule; None otherwise."""
    if hasattr(optimizer, "_decayed_lr"):  # tf_keras legacy: the "learning_rate" hyper-parameter
        lr = getattr(optimizer, "_hyper", {}).get("learning_rate")
    else:
        lr = getattr(optimizer, "_learning_rate", None)
        if lr is None or callable(lr):
            lr = None if callable(lr) else getattr(optimizer, "learning_rate", None)
    lr = getattr(lr, "value", lr) if not isinstance(lr, tf.Variable) else lr  # a Keras 3 variable's tf.Variable
    return lr if isinstance(lr, tf.Variable) and not isinstance(lr, tf.distribute.DistributedValues) else None


def in_lr_units(slot_value: tf.Tensor, lr: tf.Tensor) -> tf.Tensor:
    """``-m / lr`` (0 where lr is 0): see :attr:`Slot.lr_units`."""
    return tf.math.divide_no_nan(-slot_value, tf.cast(lr, slot_value.dtype))
