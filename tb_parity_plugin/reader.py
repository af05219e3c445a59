"""Incremental, CRC-checked reader of tb-parity event files. No TensorFlow, ever.

Why not TensorBoard's data provider: it samples (100 or 10 steps of a tensor
series), and a parity tool must see every step. Why not ``EventFileLoader``: without
TensorFlow its CRC path is pure Python (about 6 MB/s here). So :mod:`event_scan`
frames TFRecords (``struct`` on big chunks, ``google_crc32c`` on zero-copy views) and
cuts each tag's blocks out of runs of identical records by template; protobuf parses
the rest. Each tag's blocks are copied into one ``[n_steps, ...]`` array per run.

Contract (docs/ARCHITECTURE.md): runs are the directories under the logdir holding
``*tfevents*`` files, files read in name order; one kept-open handle per file resumes
at its last good offset; a truncated tail is retried on the next :meth:`reload`; a
bad CRC or unparsable event becomes a :class:`ReadProblem` and stops that file,
keeping everything before it; duplicate (run, tag, step): last write wins (file
order, then record order); nothing outside the logdir is read.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import threading
from typing import Any, BinaryIO, Iterator, NamedTuple, Optional, Union

import numpy as np
from google.protobuf.message import DecodeError
from tensorboard.compat.proto import event_pb2, types_pb2

from tb_parity_plugin import event_file, event_scan, metadata

try:  # ships with TensorFlow; without it bfloat16 values are widened to float32
    import ml_dtypes

    _BFLOAT16: Any = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    _BFLOAT16 = None

#: Bytes read per chunk; a record larger than this is read whole.
CHUNK_SIZE = 16 << 20
#: Records are filed through event_scan's templates (False: protobuf only; tests compare both).
FAST_PATH = True
_MAX_TEMPLATES = 4  # per uniform run of records; what no template matches goes to protobuf
_HEAD = event_file.HEADER_SIZE
_MARK = metadata.TAG_PREFIX.encode("utf-8")
_SCALAR_KEYS = {tag: key for key, tag in metadata.SCALAR_TAGS.items()}

# TF DataType -> (numpy dtype, repeated field holding the values when there is no tensor_content)
_DECODE: dict[int, tuple[Any, str]] = {
    types_pb2.DT_FLOAT: (np.float32, "float_val"),
    types_pb2.DT_DOUBLE: (np.float64, "double_val"),
    types_pb2.DT_INT32: (np.int32, "int_val"),
    types_pb2.DT_UINT8: (np.uint8, "int_val"),
    types_pb2.DT_INT16: (np.int16, "int_val"),
    types_pb2.DT_INT8: (np.int8, "int_val"),
    types_pb2.DT_UINT16: (np.uint16, "int_val"),
    types_pb2.DT_INT64: (np.int64, "int64_val"),
    types_pb2.DT_UINT32: (np.uint32, "uint32_val"),
    types_pb2.DT_UINT64: (np.uint64, "uint64_val"),
    types_pb2.DT_BOOL: (np.bool_, "bool_val"),
    types_pb2.DT_HALF: (np.float16, "half_val"),  # float16 bits in an int32 field
    types_pb2.DT_BFLOAT16: (_BFLOAT16 or np.uint16, "half_val"),
}


@dataclasses.dataclass(frozen=True)
class ReadProblem:
    """A record that could not be used: ``path`` relative to the logdir, byte ``offset``."""

    path: str
    offset: int
    message: str


@dataclasses.dataclass
class TensorSeries:
    """One logical tensor of one run, every step it was logged at.

    ``stats`` and ``values`` are read-only views into the run's stacked blocks.
    ``values`` is ``None`` unless full values exist at every step in ``steps``.
    """

    kind: str
    name: str
    order: int
    dtype: str
    shape: tuple
    steps: np.ndarray
    stats: np.ndarray
    values: Optional[np.ndarray]

    @property
    def tag(self) -> str:
        return f"{self.kind}/{self.name}"


@dataclasses.dataclass
class RunData:
    """A consistent snapshot of one run; later reloads never change it."""

    name: str
    tensors: dict
    scalars: dict
    info: dict
    steps: np.ndarray
    problems: list
    generation: int


def np_dtype(name: str) -> np.dtype:
    """numpy dtype for a layout dtype name (``bfloat16`` needs ml_dtypes, else float32)."""
    if name == "bfloat16":
        return _BFLOAT16 if _BFLOAT16 is not None else np.dtype(np.float32)
    return np.dtype(name)


def decode_tensor(proto: Any) -> np.ndarray:
    """numpy array of a ``TensorProto``, from ``tensor_content`` or the typed fields.

    Typed fields may be shorter than the shape (TensorFlow's compression repeats the
    last element), as ``tf.make_ndarray`` accepts.
    """
    shape = tuple([d.size for d in proto.tensor_shape.dim])
    size = math.prod(shape)
    code = proto.dtype
    if code not in _DECODE:
        if code == types_pb2.DT_STRING:
            return np.array(list(proto.string_val), dtype=object).reshape(shape)
        raise ValueError(f"unsupported tensor dtype {code}")
    dtype, field = _DECODE[code]
    content = proto.tensor_content
    if content:
        array = np.frombuffer(content, dtype=dtype)
    else:
        typed = getattr(proto, field)
        if field == "half_val":
            array = np.array(typed, dtype=np.uint16).view(dtype)
        else:
            array = np.array(list(typed), dtype=dtype)
        if 0 < array.size < size:
            array = np.pad(array, (0, size - array.size), mode="edge")
        elif array.size == 0:
            array = np.zeros(size, dtype=dtype)
    if array.size != size:
        raise ValueError(f"tensor holds {array.size} values for shape {list(shape)}")
    if proto.dtype == types_pb2.DT_BFLOAT16 and _BFLOAT16 is None:  # pragma: no cover
        array = (array.astype(np.uint32) << 16).view(np.float32)
    return array.reshape(shape)


def _last_wins(steps: np.ndarray, ranks: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Indices of the rows to keep, in step order: the last write of each step wins."""
    order = np.lexsort((offsets, ranks))  # write order: file rank, then offset
    reverse = order[::-1]
    _, first = np.unique(steps[reverse], return_index=True)
    return reverse[first]


class _Column:
    """Step blocks of one tag, copied straight into one growable ``[capacity, *row]`` array.

    Why not a list stacked on access: for full values the list doubles peak memory
    and the page faults of fresh memory cost more than the copy. ``reserve`` lets a
    cold read size the array once from the bytes left in the file. Rows below ``n``
    never change, so snapshots may keep views of them.
    """

    def __init__(self, row_shape: tuple, dtype: np.dtype) -> None:
        self.row_shape, self.dtype = row_shape, dtype
        self._rows = np.empty((0, *row_shape), dtype)
        self._row_bytes = max(1, int(np.prod(row_shape, dtype=np.int64)) * dtype.itemsize)
        self._meta = np.empty((0, 3), np.int64)  # per row: step, file id, record offset
        self._n = 0
        self._increasing = True  # steps strictly increasing in arrival order: nothing to dedupe
        self._resolved: Optional[tuple] = None

    def extend(self, steps: np.ndarray, file_id: int, offsets: np.ndarray, blocks: np.ndarray, hint: tuple = (0, 0)) -> None:
        """Add ``len(steps)`` blocks; ``hint`` = (records, bytes) left in the file, to size growth."""
        n, k = self._n, len(steps)
        if n + k > len(self._rows):
            records_left, bytes_left = hint
            extra = max(n, k, min(records_left, bytes_left // self._row_bytes))
            self._rows = _grown(self._rows, n, n + extra)
            self._meta = _grown(self._meta, n, n + extra)
        self._rows[n : n + k] = blocks
        meta = self._meta[n : n + k]
        meta[:, 0], meta[:, 1], meta[:, 2] = steps, file_id, offsets
        if k and self._increasing:
            self._increasing = bool((n == 0 or steps[0] > self._meta[n - 1, 0]) and (k == 1 or (np.diff(steps) > 0).all()))
        self._n = n + k
        self._resolved = None

    def rows(self) -> np.ndarray:
        """All blocks in arrival order, ``[n, *row_shape]`` (a view)."""
        return self._rows[: self._n]

    def resolve(self, rank_of: np.ndarray) -> tuple[np.ndarray, Union[slice, np.ndarray], np.ndarray, np.ndarray]:
        """(unique sorted steps, row index, file ranks, offsets) of the winning rows."""
        if self._resolved is None or self._resolved[0] is not rank_of:
            meta = self._meta[: self._n]
            steps, ranks, offsets = meta[:, 0].copy(), rank_of[meta[:, 1]], meta[:, 2].copy()
            index: Union[slice, np.ndarray]
            if self._increasing:
                index = slice(0, len(steps))
            else:
                index = _last_wins(steps, ranks, offsets)
            self._resolved = (rank_of, (steps[index], index, ranks[index], offsets[index]))
        return self._resolved[1]


def _grown(array: np.ndarray, used: int, capacity: int) -> np.ndarray:
    """A ``capacity``-row copy of ``array``'s first ``used`` rows (the rest uninitialised)."""
    grown = np.empty((capacity, *array.shape[1:]), array.dtype)
    grown[:used] = array[:used]
    return grown


@dataclasses.dataclass
class _FileState:
    path: str  # absolute
    rel: str  # relative to the logdir, "/"-separated
    file_id: int
    offset: int = 0
    handle: Optional[BinaryIO] = None
    stopped: bool = False


class _Item(NamedTuple):
    """Values of one of our tags at one or more records, before they are filed into a run."""

    what: str  # "layout" | "stats" | "values" | "info" | "scalar"
    key: str  # layout hash or scalar key
    dtype: str
    steps: np.ndarray  # int64 [n]
    offsets: np.ndarray  # int64 [n], record offsets in the file
    data: Any  # [n, ...] array; a Layout or dict (n == 1) for "layout" and "info"


class _RunState:
    """Everything read so far from one run's files. Callers hold the reader's lock."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.files: dict[str, _FileState] = {}
        self.layouts: dict[str, metadata.Layout] = {}
        self.widths: dict[tuple[str, str], int] = {}  # (hash, dtype) -> values block length
        self.held: dict[str, list[tuple[int, str, _Item]]] = {}  # blocks waiting for their layout
        self.stats: dict[str, _Column] = {}
        self.values: dict[tuple[str, str], _Column] = {}
        self.scalars: dict[str, _Column] = {}
        self.info: dict = {}
        self.problems: list[ReadProblem] = []
        self.generation = 0
        self._rank_of = np.zeros(0, dtype=np.int64)
        self._hint = (0, 0)
        self._snapshot: Optional[RunData] = None

    def add_file(self, path: str, rel: str) -> _FileState:
        state = _FileState(path, rel, len(self.files))
        self.files[path] = state
        ranks = np.empty(len(self.files), dtype=np.int64)
        for rank, name in enumerate(sorted(self.files)):
            ranks[self.files[name].file_id] = rank
        self._rank_of = ranks
        return state

    def ingest(self, fs: _FileState, items: list[_Item], problems: list[ReadProblem], hint: tuple = (0, 0)) -> None:
        """File one chunk's items; ``hint`` = (records, bytes) left in the file."""
        self._hint = hint
        for item in items:
            self._file(fs, item)
        self.problems.extend(problems)
        if items or problems:
            self.generation += 1

    def _file(self, fs: _FileState, item: _Item) -> None:
        if item.what == "info":
            self.info = item.data
        elif item.what == "scalar":
            column = self.scalars.get(item.key)
            if column is None:
                column = self.scalars[item.key] = _Column((), np.dtype(np.float64))
            column.extend(item.steps, fs.file_id, item.offsets, item.data, self._hint)
        elif item.what == "layout":
            if item.key not in self.layouts:
                self.layouts[item.key] = item.data
                for file_id, rel, held in self.held.pop(item.key, []):
                    self._block(file_id, rel, held)
        elif item.key not in self.layouts:
            held = item._replace(data=np.array(item.data))  # may be a view into the read buffer
            self.held.setdefault(item.key, []).append((fs.file_id, fs.rel, held))
        else:
            self._block(fs.file_id, fs.rel, item)

    def _block(self, file_id: int, rel: str, item: _Item) -> None:
        layout = self.layouts[item.key]
        if item.what == "stats":
            shape = (len(layout.tensors), metadata.N_STATS)
            column = self.stats.get(item.key)
            if column is None:
                column = self.stats[item.key] = _Column(shape, np.dtype(np.float64))
        else:
            shape = (self._width(item.key, item.dtype),)
            column = self.values.get((item.key, item.dtype))
            if column is None:
                column = self.values[(item.key, item.dtype)] = _Column(shape, np_dtype(item.dtype))
        if item.data.shape[1:] != shape:
            message = f"{item.what} block of shape {list(item.data.shape[1:])}, layout needs {list(shape)}"
            self.problems.extend(ReadProblem(rel, int(offset), message) for offset in item.offsets)
            return
        column.extend(item.steps, file_id, item.offsets, item.data, self._hint)

    def _width(self, layout_hash: str, dtype: str) -> int:
        key = (layout_hash, dtype)
        if key not in self.widths:
            ends = [s.values[1] + s.values[2] for s in self.layouts[layout_hash].tensors if s.values and s.values[0] == dtype]
            self.widths[key] = max(ends, default=0)
        return self.widths[key]

    def snapshot(self) -> RunData:
        """The run as a :class:`RunData`, rebuilt only after new data arrived."""
        if self._snapshot is not None and self._snapshot.generation == self.generation:
            return self._snapshot
        merged: dict[tuple[str, str], list[tuple]] = {}
        for layout_hash, layout in self.layouts.items():
            if layout_hash in self.stats:
                for key, part in self._layout_parts(layout_hash, layout):
                    merged.setdefault(key, []).append(part)
        tensors = {key: _merge(parts) for key, parts in merged.items()}
        scalars = {}
        for key, column in self.scalars.items():
            steps, index, _, _ = column.resolve(self._rank_of)
            scalars[key] = (steps, _readonly(column.rows()[index]))
        all_steps = list({id(series.steps): series.steps for series in tensors.values()}.values())  # shared per layout
        self._snapshot = RunData(
            name=self.name,
            tensors=tensors,
            scalars=scalars,
            info=dict(self.info),
            steps=np.unique(np.concatenate(all_steps)) if all_steps else np.zeros(0, dtype=np.int64),
            problems=list(self.problems),
            generation=self.generation,
        )
        return self._snapshot

    def _layout_parts(self, layout_hash: str, layout: metadata.Layout) -> Iterator[tuple]:
        """Per tensor of one layout: (key, (spec, steps, stats, values, ranks, offsets))."""
        steps, index, ranks, offsets = self.stats[layout_hash].resolve(self._rank_of)
        dtypes = sorted({s.values[0] for s in layout.tensors if s.values})
        blocks = {d: self.values[(layout_hash, d)].resolve(self._rank_of) for d in dtypes if (layout_hash, d) in self.values}
        # A step whose values event has not arrived yet (TF's writer may flush a step's
        # events separately) is held back when it is at the tail, so a live run does
        # not lose its values for one half-written step.
        if len(blocks) == len(dtypes) and dtypes:
            complete = steps
            for d in dtypes:
                complete = np.intersect1d(complete, blocks[d][0], assume_unique=True)
            if len(complete) and complete[-1] < steps[-1]:
                keep = int(np.searchsorted(steps, complete[-1], side="right"))
                steps, ranks, offsets = steps[:keep], ranks[:keep], offsets[:keep]
                index = slice(0, keep) if isinstance(index, slice) else index[:keep]
        stats = _readonly(self.stats[layout_hash].rows()[index])
        aligned = {d: _align(steps, blocks[d], self.values[(layout_hash, d)]) for d in blocks}
        for i, spec in enumerate(layout.tensors):
            values = None
            if spec.values is not None and aligned.get(spec.values[0]) is not None:
                start, length = int(spec.values[1]), int(spec.values[2])
                values = aligned[spec.values[0]][:, start : start + length]
            yield (spec.kind, spec.name), (spec, steps, stats[:, i, :], values, ranks, offsets)


def _readonly(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view


def _align(steps: np.ndarray, resolved: tuple, column: _Column) -> Optional[np.ndarray]:
    """Values rows for exactly ``steps``, or None if some step has no values block."""
    v_steps, v_index = resolved[0], resolved[1]
    if len(v_steps) == len(steps) and np.array_equal(v_steps, steps):
        return _readonly(column.rows()[v_index])
    pos = np.searchsorted(v_steps, steps)
    if len(v_steps) == 0 or np.any(pos >= len(v_steps)) or not np.array_equal(v_steps[np.minimum(pos, len(v_steps) - 1)], steps):
        return None
    rows = np.arange(len(column.rows()))[v_index][pos]
    return _readonly(column.rows()[rows])


def _merge(parts: list[tuple]) -> TensorSeries:
    """One TensorSeries from a tensor's parts in one or more layouts (last write wins)."""
    spec = max(parts, key=lambda p: p[1][-1] if len(p[1]) else -1)[0]
    if len(parts) == 1:
        _, steps, stats, values, _, _ = parts[0]
    else:
        steps_all = np.concatenate([p[1] for p in parts])
        pick = _last_wins(steps_all, np.concatenate([p[4] for p in parts]), np.concatenate([p[5] for p in parts]))
        steps = steps_all[pick]
        stats = _readonly(np.concatenate([p[2] for p in parts])[pick])
        vals = [p[3] for p in parts]
        same = all(v is not None for v in vals) and len({(v.shape[1], v.dtype) for v in vals}) == 1
        values = _readonly(np.concatenate(vals)[pick]) if same else None
    return TensorSeries(spec.kind, spec.name, spec.order, spec.dtype, tuple(spec.shape), steps, stats, values)


def _parse_event(buf: bytearray, start: int, length: int, base: int, out: list, problems: list, rel: str) -> None:
    """Append the tb-parity items of the record at ``buf[start:]``, parsed by protobuf.

    Raises DecodeError if the event does not parse. The slow path: layouts, run info,
    typed tensor fields and anything :mod:`event_scan` does not describe exactly.
    """
    event = event_pb2.Event()
    event.ParseFromString(memoryview(buf)[start : start + length].toreadonly())
    if not event.HasField("summary"):
        return
    offset = base + start - _HEAD
    steps, offsets = np.array([event.step], np.int64), np.array([offset], np.int64)
    for value in event.summary.value:
        route = _route(value.tag)
        if route is None:
            continue
        try:
            if route[0] == "scalar" and value.WhichOneof("value") == "simple_value":
                array = np.array([value.simple_value])
            elif route[0] == "scalar" and len(value.tensor.float_val) == 1 and not value.tensor.tensor_content:
                array = np.array([value.tensor.float_val[0]])
            else:
                array = decode_tensor(value.tensor)[None]
            out.append(_make_item(route, steps, offsets, array))
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            problems.append(ReadProblem(rel, offset, f"bad {value.tag!r} value: {exc}"))


@functools.lru_cache(maxsize=4096)
def _route(tag: str) -> Optional[tuple[str, str, str]]:
    """(what, key, dtype) of one of our tags, None for other tools' or newer formats' tags."""
    if not tag.startswith(metadata.TAG_PREFIX):
        at = tag.find("/" + metadata.TAG_PREFIX)  # a tf.name_scope prefix
        if at < 0:
            return None
        tag = tag[at + 1 :]
    head, _, rest = tag[len(metadata.TAG_PREFIX) :].partition("/")
    if head == "stats":
        return ("stats", rest, "")
    if head == "values":
        layout_hash, _, dtype = rest.partition("/")
        return ("values", layout_hash, dtype)
    if head == "layout":
        return ("layout", rest, "")
    if tag in _SCALAR_KEYS:
        return ("scalar", _SCALAR_KEYS[tag], "")
    if tag == metadata.RUN_INFO_TAG:
        return ("info", "", "")
    return None


def _wanted(tag: str) -> Optional[bool]:
    """For event_scan: file per step (True), skip (False), or protobuf only (None)."""
    route = _route(tag)
    if route is None:
        return False
    return None if route[0] in ("layout", "info") else True


def _make_item(route: tuple[str, str, str], steps: np.ndarray, offsets: np.ndarray, array: np.ndarray) -> _Item:
    """The item of ``len(steps)`` values of one tag; ``array`` is ``[n, *tensor shape]``.

    One function for both paths, so they convert (and fail) the same way.
    """
    what, key, dtype = route
    n = len(steps)
    if what == "stats":
        data: Any = array.astype(np.float64, copy=False)
    elif what == "values":
        data = array.reshape(n, -1).astype(np_dtype(dtype), copy=False)
    elif what == "scalar":
        data = array.reshape(n, -1)[:, 0].astype(np.float64)
    elif what == "layout":
        data = metadata.Layout.from_json_bytes(array.reshape(-1)[0])
    else:
        info = json.loads(array.reshape(-1)[0].decode("utf-8"))
        data = info if isinstance(info, dict) else {}
    return _Item(what, key, dtype, steps, offsets, data)


def _scan_chunk(buf: bytearray, framed: event_scan.Framed, base: int, rel: str) -> tuple[list, list]:
    """Items and problems of a chunk's marked records (event_scan first, protobuf for the rest).

    Raises DecodeError for an unparsable event (callers then use :func:`_parse_in_order`).
    """
    items: list[_Item] = []
    problems: list[ReadProblem] = []
    for run in event_scan.uniform_runs(framed.starts, framed.lengths):
        left = _scan_run(buf, run, base, items, problems, rel) if FAST_PATH else range(run.count)
        for i in left:
            _parse_event(buf, run.first + i * run.stride, run.length, base, items, problems, rel)
    items.sort(key=lambda item: item.offsets[0])  # stable: record order, then value order
    problems.sort(key=lambda problem: problem.offset)
    return items, problems


def _scan_run(buf: bytearray, run: event_scan.Uniform, base: int, items: list, problems: list, rel: str) -> list[int]:
    """File the records of a uniform run that match a template; returns the rest's indices."""
    rows = event_scan.rows_view(buf, run)
    todo = np.ones(run.count, dtype=bool)
    slow: list[int] = []
    for _ in range(_MAX_TEMPLATES):
        seed = int(np.argmax(todo))
        start = run.first + seed * run.stride
        template = event_scan.build_template(buf, start, run.length, _wanted)
        if template is not None:  # protobuf validates the seed's fixed bytes (UTF-8 of strings, ...)
            event_pb2.Event.FromString(memoryview(buf)[start : start + run.length].toreadonly())
        if template is None:
            slow.append(seed)
            todo[seed] = False
        else:
            ok = template.matches(rows) & todo
            todo &= ~ok
            every = bool(ok.all())
            steps = template.steps(rows) if every else template.steps(rows)[ok]
            offsets = base - _HEAD + run.first + run.stride * np.flatnonzero(ok)
            for slot in template.slots:
                array = event_scan.slot_array(buf, run, slot)
                try:
                    items.append(_make_item(_route(slot.tag), steps, offsets, array if every else array[ok]))
                except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
                    problems.extend(ReadProblem(rel, int(o), f"bad {slot.tag!r} value: {exc}") for o in offsets)
        if not todo.any():
            break
    return sorted(slow + np.flatnonzero(todo).tolist())


def _parse_in_order(buf: bytearray, framed: event_scan.Framed, base: int, rel: str) -> tuple[list, list, Optional[tuple]]:
    """Protobuf only, record by record, up to the first unparsable one: (its offset, message) or None."""
    items: list[_Item] = []
    problems: list[ReadProblem] = []
    for start, length in zip(framed.starts, framed.lengths):
        try:
            _parse_event(buf, start, length, base, items, problems, rel)
        except DecodeError as exc:
            return items, problems, (base + start - _HEAD, f"unparsable event: {exc}")
    return items, problems, None


class LogdirReader:
    """Reads every step of every run under ``logdir``, incrementally.

    Thread-safe: :meth:`reload` may run on a background thread while others call
    :meth:`run`; file reading happens outside the lock, filing of each chunk's blocks
    and snapshot building under it, so a :class:`RunData` is always consistent.
    The first :meth:`run_names`, :meth:`run` or :attr:`problems` call loads the
    logdir if :meth:`reload` was never called.
    """

    def __init__(self, logdir: str) -> None:
        if not os.path.isdir(logdir):
            raise FileNotFoundError(f"logdir {logdir!r} does not exist or is not a directory")
        self.logdir = logdir
        self._root = os.path.realpath(logdir)
        self._runs: dict[str, _RunState] = {}
        self._lock = threading.RLock()
        self._reload_lock = threading.Lock()
        self._loaded = False
        #: Bytes of complete records consumed so far (an incremental reload adds only what was appended).
        self.bytes_read = 0
        self._buffer = event_scan.new_buffer(0)

    def reload(self) -> bool:
        """Read whatever was appended since the last call; True if anything new was read."""
        with self._reload_lock:
            if not os.path.isdir(self._root):
                raise FileNotFoundError(f"logdir {self.logdir!r} does not exist or is not a directory")
            changed = False
            for name, paths in self._discover().items():
                with self._lock:
                    state = self._runs.get(name)
                    if state is None:
                        state = self._runs[name] = _RunState(name)
                        state.generation = 1
                        changed = True
                    new = [p for p in paths if p not in state.files]
                    for path in new:
                        state.add_file(path, os.path.relpath(path, self._root).replace(os.sep, "/"))
                for path in paths:
                    changed |= self._read_file(state, state.files[path])
            self._loaded = True
            return changed

    def run_names(self) -> list[str]:
        self._ensure_loaded()
        with self._lock:
            return sorted(self._runs)

    def run(self, name: str) -> RunData:
        """Snapshot of run ``name``; raises KeyError naming the run and the logdir."""
        self._ensure_loaded()
        with self._lock:
            state = self._runs.get(name)
            if state is None:
                raise KeyError(f"no run {name!r} in {self.logdir}")
            return state.snapshot()

    @property
    def problems(self) -> list[ReadProblem]:
        self._ensure_loaded()
        with self._lock:
            return [p for name in sorted(self._runs) for p in self._runs[name].problems]

    def close(self) -> None:
        """Close the kept-open event files."""
        with self._reload_lock:
            for state in self._runs.values():
                for fs in state.files.values():
                    if fs.handle is not None:
                        fs.handle.close()
                        fs.handle = None

    def __enter__(self) -> "LogdirReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _ensure_loaded(self) -> None:
        if not self._loaded:
            self.reload()

    def _inside(self, path: str) -> bool:
        real = os.path.realpath(path)
        return real == self._root or real.startswith(self._root + os.sep)

    def _discover(self) -> dict[str, list[str]]:
        """Run name -> its event files in name order; symlinks leaving the logdir are skipped."""
        runs: dict[str, list[str]] = {}
        seen: set[str] = set()
        for dirpath, dirnames, filenames in os.walk(self._root, followlinks=True):
            real = os.path.realpath(dirpath)
            if real in seen or not self._inside(dirpath):
                dirnames[:] = []
                continue
            seen.add(real)
            dirnames.sort()
            files = sorted(
                os.path.join(dirpath, f)
                for f in filenames
                if "tfevents" in f and self._inside(os.path.join(dirpath, f)) and os.path.isfile(os.path.join(dirpath, f))
            )
            if files:
                runs[os.path.relpath(dirpath, self._root).replace(os.sep, "/")] = files
        return runs

    def _read_file(self, state: _RunState, fs: _FileState) -> bool:
        """Read ``fs`` from its last good offset to the end; True if it yielded anything."""
        if fs.stopped:
            return False
        try:
            if fs.handle is None:
                fs.handle = open(fs.path, "rb")
            size = os.fstat(fs.handle.fileno()).st_size
        except OSError as exc:
            with self._lock:
                state.ingest(fs, [], [ReadProblem(fs.rel, fs.offset, f"cannot read: {exc}")])
            fs.stopped = True
            return True
        changed, want = False, CHUNK_SIZE
        while fs.offset < size:
            if len(self._buffer) < want:
                self._buffer = event_scan.new_buffer(want)
            buf = self._buffer  # reused: fresh memory per chunk would cost page faults
            fs.handle.seek(fs.offset)
            end = fs.handle.readinto(memoryview(buf)[:want])
            framed = event_scan.frame(buf, end, _MARK)
            used, error = framed.used, framed.error
            try:
                items, problems = _scan_chunk(buf, framed, fs.offset, fs.rel)
            except DecodeError:  # redo in record order to stop exactly at the first bad event
                items, problems, bad = _parse_in_order(buf, framed, fs.offset, fs.rel)
                if bad is not None:
                    used, error = bad[0] - fs.offset, bad[1]
            if error is not None:
                problems.append(ReadProblem(fs.rel, fs.offset + used, error))
                fs.stopped = True
            left = size - fs.offset  # from this chunk on, so the chunk's own blocks count
            hint = (left * framed.records // used if used else 0, left)
            with self._lock:
                state.ingest(fs, items, problems, hint)
            changed |= bool(items or problems)
            fs.offset += used
            self.bytes_read += used
            if error is not None or end < want:
                break  # end of file (a partial record stays for the next reload)
            want = max(CHUNK_SIZE, framed.need)
        return changed
