"""Naming and collecting variables, for TF variables and Keras 3 ones alike."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tb_parity_plugin.shim.partitions import shards, whole_name


def is_variable(value: Any) -> bool:
    """A ``tf.Variable``, or a Keras 3 variable (not a ``tf.Variable`` subclass)."""
    return isinstance(value, tf.Variable) or (hasattr(value, "assign") and hasattr(value, "path"))


def variable_name(var: Any) -> str:
    """The name a variable is logged under: ``var.name`` (e.g. ``dense/kernel:0``), or a
    Keras 3 variable's ``path`` (its ``name`` lacks the layer, so names would collide), or a TF2
    ``ShardedVariable``'s shards' name without ``/part_k`` (``item_embedding/embeddings:0``), the
    name its shards are recorded under when recorded whole."""
    parts = shards(var)
    if parts:  # ParameterServerStrategy names none: each was "ShardedVariable", the second "logged twice"
        whole = whole_name(str(parts[0].name))
        if whole is not None:
            return whole
    name = getattr(var, "path", None) or getattr(var, "name", None)
    if not name:
        raise ValueError(f"cannot name {var!r}: pass name= explicitly")
    return str(name)


def _metrics(obj: Any) -> list[Any]:
    """The Keras metrics (tf_keras or Keras 3 ``Metric`` instances) ``obj`` holds, nested ones included."""
    return [
        sub
        for sub in getattr(obj, "submodules", ())
        if any(c.__name__ == "Metric" and ".metrics" in c.__module__ for c in type(sub).__mro__)
    ]


def _preprocessing_layers(obj: Any) -> list[Any]:
    """The Keras preprocessing layers (tf_keras or Keras 3: ``Normalization``, ``Discretization``,
    ``StringLookup``, ``TextVectorization`` ...) ``obj`` holds (a Keras 3 model has no ``submodules``)."""
    subs = getattr(obj, "submodules", None)
    if subs is None and hasattr(obj, "_flatten_layers"):
        subs = obj._flatten_layers(include_self=False)
    return [sub for sub in subs or () if any(_keras_preprocessing(c.__module__) for c in type(sub).__mro__)]


def _keras_preprocessing(module: str) -> bool:
    """Whether ``module`` is one of Keras's own preprocessing modules (``tf_keras.src.layers.preprocessing.*``,
    ``keras.src.layers.preprocessing.*``), not a user's package that happens to be named so: a user's layer in
    ``myproject.layers.preprocessing.scaler`` whose running statistics train with the model is state."""
    return module.partition(".")[0] in ("keras", "tf_keras", "tensorflow") and ".layers.preprocessing." in module


def model_variables(obj: Any) -> list[Any]:
    """``obj``'s variables: a Keras model/layer or ``tf.Module`` (trainable ones first), or a list."""
    if is_variable(obj):
        return [obj]
    if hasattr(obj, "trainable_variables") and hasattr(obj, "non_trainable_variables"):
        # a tf_keras subclassed model lists the accumulators of the metrics it holds as attributes (the
        # `loss_tracker = Mean(name="loss")` of Keras's "customize what happens in fit") among its
        # non-trainable variables: they are no state of the model (TF1's tf.compat.v1.metrics are local
        # variables), and a new user's faithful own-train_step port got a structure DIVERGE on total:0/count:0
        metric_vars = {id(v) for m in _metrics(obj) for v in m.variables}
        # nor are what a preprocessing layer's adapt() computed (Normalization's mean, variance and count):
        # constants of the input pipeline, which TF1's feature columns hold as graph constants (a
        # normalizer_fn's mean and std); a faithful feature-column port was a structure DIVERGE on state
        # mean:0, variance:0, count:0, and two adapted Normalization layers (tf_keras names their variables
        # without the layer's scope) crashed fit with "state/'mean:0' is logged twice"
        metric_vars |= {id(v) for p in _preprocessing_layers(obj) for v in p.non_trainable_variables}
        return [v for v in [*obj.trainable_variables, *obj.non_trainable_variables] if id(v) not in metric_vars]
    if hasattr(obj, "trainable_variables") and hasattr(obj, "variables"):  # tf.Module
        trainable = {id(v) for v in obj.trainable_variables}
        return [*obj.trainable_variables, *(v for v in obj.variables if id(v) not in trainable)]
    return [v for item in obj for v in model_variables(item)]


def frozen_variables(obj: Any) -> set[int]:
    """Ids of the variables of ``obj`` (as :func:`model_variables` walks it) that a Keras model or layer
    lists as non-trainable although their own ``trainable`` flag is set: a layer frozen with
    ``layer.trainable = False`` (a fine-tuning port's base), which no optimizer of it updates."""
    if is_variable(obj):
        return set()
    if hasattr(obj, "trainable_variables") and hasattr(obj, "non_trainable_variables"):
        return {id(v) for v in obj.non_trainable_variables if getattr(v, "trainable", False)}
    if hasattr(obj, "trainable_variables") and hasattr(obj, "variables"):  # tf.Module
        return set()
    return {i for item in obj for i in frozen_variables(item)}
