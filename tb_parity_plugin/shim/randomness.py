"""Which random ops a recorded forward tensor is computed from.

A port that computes the same function draws other random numbers than its original unless the
user makes them equal (feeds the noise, or seeds both sides with the migration guide's
``DeterministicRandomTestTool``): a VAE's reparameterization ``mu + exp(0.5 * logvar) * eps``
with ``eps = tf.random.normal(...)`` on each side diverges at step 0 whatever else is right. The
engine cannot tell that from the values; the graph can. Each recorded forward tensor is written
with the types of the random ops it is computed from (``RandomStandardNormal``), found by walking
its graph back to the tensors recorded before it, the inputs and the variables: a random op
behind an earlier recorded tensor is that tensor's. The functions a call op runs count (a TF2
``tf.cond``'s branches: TF1 code's ``tf.compat.v1.layers.dropout(h, rate, training=is_training)``
draws its mask inside an ``If``). An eager tensor has no graph, so none.
"""

from __future__ import annotations

import re
from typing import Any, Collection, Iterator

from tb_parity_plugin.shim import ordering

#: Op types that draw random numbers: TF1's and ``tf.random``'s stateful ops
#: (``RandomStandardNormal``, ``RandomUniform``, ``TruncatedNormal``, ``Multinomial``,
#: ``RandomShuffle``...), the stateless ones (a seed the port chose differently draws other
#: numbers), ``tf.random.Generator``'s (``StatefulUniform``, ``RngReadAndSkip``), the candidate
#: samplers of a sampled loss (word2vec's ``fixed_unigram_candidate_sampler``) and
#: ``sample_distorted_bounding_box``. Not ``UniformQuantize`` and its kin, nor
#: ``AllCandidateSampler`` (every class): they draw nothing.
_RANDOM = re.compile(
    r"Random|TruncatedNormal|StandardNormal|^StatefulUniform|Multinomial|^Rng|(?<!All)CandidateSampler"
    r"|SampleDistortedBoundingBox|StatelessShuffle"
)

#: The kinds of the forward pass: a gradient is computed from the whole forward graph.
FORWARD_KINDS = frozenset({"input", "activation", "output", "loss", "metric"})


def random_ops(tensor: Any, recorded: Collection[Any] = ()) -> tuple[str, ...]:
    """The sorted types of the random ops ``tensor`` is computed from, not walking past the
    tensors (``.ref()``) in ``recorded``; ``()`` for an eager tensor."""
    try:
        start = tensor.op
    except AttributeError:  # an EagerTensor: no graph to walk
        return ()
    found: set[str] = set()
    seen = {start}
    todo = [start]
    while todo:
        op = todo.pop()
        if _RANDOM.search(op.type):
            found.add(op.type)
        if op.type in ordering.CALL_FUNCTION_ATTRS or op.graph._get_function(op.type) is not None:
            for name in _called(op.graph, op.type, op.node_def.attr):
                found |= _function_random(op.graph, name)
        for x in op.inputs:
            if x.ref() not in recorded and x.op not in seen:
                seen.add(x.op)
                todo.append(x.op)
    return tuple(sorted(found))


def _called(graph: Any, op_type: str, attrs: Any) -> Iterator[str]:
    """The names of the functions a call of ``op_type`` (``attrs``: its NodeDef's attributes) runs."""
    if op_type not in ordering.CALL_FUNCTION_ATTRS:
        yield op_type  # a function called by name
        return
    for a in ordering.CALL_FUNCTION_ATTRS[op_type]:
        value = attrs[a]
        yield from [value.func.name] if value.HasField("func") else [f.name for f in value.list.func]


def _function_random(graph: Any, name: str) -> frozenset[str]:
    """The random op types function ``name`` of ``graph``'s library runs, nested calls included
    (cached per graph: a function's body never changes)."""
    cache = getattr(graph, "_tb_parity_function_random", None)
    if cache is None:
        cache = graph._tb_parity_function_random = {}
    if name not in cache:
        cache[name] = frozenset()  # a recursive call adds nothing by itself
        definition = getattr(graph._get_function(name), "definition", None)
        found: set[str] = set()
        for node in definition.node_def if definition is not None else ():
            if _RANDOM.search(node.op):
                found.add(node.op)
            if node.op in ordering.CALL_FUNCTION_ATTRS or graph._get_function(node.op) is not None:
                for called in _called(graph, node.op, node.attr):
                    found |= _function_random(graph, called)
        cache[name] = frozenset(found)
    result: frozenset[str] = cache[name]
    return result
