"""Incremental, CRC-checked reader of tb-parity event files. No TensorFlow, ever.

Why not TensorBoard's data provider: it samples (100 or 10 steps of a tensor
series), and a parity tool must see every step. Why not ``EventFileLoader``: without
TensorFlow its CRC path is pure Python (about 6 MB/s here). So this module frames
TFRecords itself (``struct`` on big chunks, ``google_crc32c`` on zero-copy
memoryviews), parses ``Event`` protos with protobuf, and keeps each step block as a
numpy array, stacking them into ``[n_steps, ...]`` arrays only when a run is asked
for after new data arrived.

Contract (docs/ARCHITECTURE.md): runs are the directories under the logdir holding
``*tfevents*`` files, files read in name order; one kept-open handle per file resumes
at its last good offset; a truncated tail is retried on the next :meth:`reload`; a
bad CRC or unparsable event becomes a :class:`ReadProblem` and stops that file,
keeping everything before it; duplicate (run, tag, step): last write wins (file
order, then record order); nothing outside the logdir is read.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
import threading
from typing import Any, BinaryIO, Callable, Iterator, NamedTuple, Optional, Union

import numpy as np
from google.protobuf.message import DecodeError
from tensorboard.compat.proto import event_pb2, tensor_pb2, types_pb2

from tb_parity_plugin import event_file, metadata

try:  # ships with TensorFlow; without it bfloat16 values are widened to float32
    import ml_dtypes

    _BFLOAT16: Any = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    _BFLOAT16 = None

#: Bytes read per chunk; a record larger than this is read whole.
CHUNK_SIZE = 16 << 20
_HEADER = struct.Struct("<QI")  # uint64 length, uint32 masked crc of the length
_FOOTER = struct.Struct("<I")
_F32 = struct.Struct("<f")
#: Records at least this big are walked without protobuf (see _walk_event).
WALK_BYTES = 1 << 16
_HEAD, _FOOT = event_file.HEADER_SIZE, event_file.FOOTER_SIZE
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
        self._steps: list[int] = []
        self._files: list[int] = []
        self._offsets: list[int] = []
        self._increasing = True  # steps strictly increasing in arrival order: nothing to dedupe
        self._resolved: Optional[tuple] = None

    def append(self, step: int, file_id: int, offset: int, block: np.ndarray, hint: tuple = (0, 0)) -> None:
        """Add one block; ``hint`` = (records, bytes) left in the file, to size growth."""
        n = len(self._steps)
        if n == len(self._rows):
            records_left, bytes_left = hint
            extra = max(n, 1, min(records_left, bytes_left // self._row_bytes))
            grown = np.empty((n + extra, *self.row_shape), self.dtype)
            grown[:n] = self._rows[:n]
            self._rows = grown
        self._rows[n] = block
        if n and step <= self._steps[-1]:
            self._increasing = False
        self._steps.append(step)
        self._files.append(file_id)
        self._offsets.append(offset)
        self._resolved = None

    def rows(self) -> np.ndarray:
        """All blocks in arrival order, ``[n, *row_shape]`` (a view)."""
        return self._rows[: len(self._steps)]

    def resolve(self, rank_of: np.ndarray) -> tuple[np.ndarray, Union[slice, np.ndarray], np.ndarray, np.ndarray]:
        """(unique sorted steps, row index, file ranks, offsets) of the winning rows."""
        if self._resolved is None or self._resolved[0] is not rank_of:
            steps = np.asarray(self._steps, dtype=np.int64)
            ranks = rank_of[np.asarray(self._files, dtype=np.int64)]
            offsets = np.asarray(self._offsets, dtype=np.int64)
            index: Union[slice, np.ndarray]
            if self._increasing:
                index = slice(0, len(steps))
            else:
                index = _last_wins(steps, ranks, offsets)
            self._resolved = (rank_of, (steps[index], index, ranks[index], offsets[index]))
        return self._resolved[1]


@dataclasses.dataclass
class _FileState:
    path: str  # absolute
    rel: str  # relative to the logdir, "/"-separated
    file_id: int
    offset: int = 0
    handle: Optional[BinaryIO] = None
    stopped: bool = False


class _Item(NamedTuple):
    """One useful summary value of an event, before it is filed into a run."""

    what: str  # "layout" | "stats" | "values" | "info" | "scalar"
    key: str  # layout hash or scalar key
    dtype: str
    step: int
    offset: int
    data: Any


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
            column.append(item.step, fs.file_id, item.offset, np.float64(item.data), self._hint)
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
        if item.data.shape != shape:
            self.problems.append(
                ReadProblem(rel, item.offset, f"{item.what} block of shape {list(item.data.shape)}, layout needs {list(shape)}")
            )
            return
        column.append(item.step, file_id, item.offset, item.data, self._hint)

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
        all_steps = [series.steps for series in tensors.values()]
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
    rows = np.arange(len(column._steps))[v_index][pos]
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


def _parse_event(payload: memoryview, offset: int, out: list, problems: list, rel: str) -> None:
    """Append the tb-parity items of one event, parsed by protobuf; DecodeError if broken."""
    event = event_pb2.Event()
    event.ParseFromString(payload)
    if not event.HasField("summary"):
        return
    step = event.step
    for value in event.summary.value:
        tag, simple = value.tag, None
        if tag in _SCALAR_KEYS:  # scalars skip decode_tensor: they are a third of a stats-only log's values
            if value.WhichOneof("value") == "simple_value":
                simple = value.simple_value
            elif len(value.tensor.float_val) == 1:
                simple = value.tensor.float_val[0]
        _add_item(tag, step, offset, lambda v=value: decode_tensor(v.tensor), simple, out, problems, rel)


class _Malformed(Exception):
    """The wire walker met something it does not handle; protobuf decides instead."""


def _varint(buf: bytearray, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise _Malformed


def _fields(buf: bytearray, pos: int, end: int) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, varint value or byte position or (start, end) span) of one message."""
    try:
        while pos < end:
            key, pos = _varint(buf, pos)
            wire = key & 7
            if wire == 0:
                value, pos = _varint(buf, pos)
            elif wire == 2:
                length, pos = _varint(buf, pos)
                value, pos = (pos, pos + length), pos + length
            elif wire in (1, 5):
                value, pos = pos, pos + (8 if wire == 1 else 4)
            else:
                raise _Malformed
            if pos > end:
                raise _Malformed
            yield key >> 3, wire, value
    except IndexError:
        raise _Malformed from None


def _walk_event(buf: bytearray, start: int, end: int, offset: int, out: list, problems: list, rel: str) -> None:
    """Like :func:`_parse_event`, but tensor_content stays a zero-copy view into ``buf``.

    Why: for big records protobuf's copies (into its arena, then into a Python bytes)
    cost more than framing the record; this walks Event.summary.value[].tensor
    (field numbers from event.proto, summary.proto, tensor.proto) instead. Raises
    _Malformed on anything unexpected. The views must be copied before ``buf`` is reused.
    """
    step, summary = 0, None
    for field, wire, value in _fields(buf, start, end):
        if field == 2 and wire == 0:
            step = value - (1 << 64) if value >= 1 << 63 else value
        elif field == 5 and wire == 2:
            summary = value
    for field, wire, span in _fields(buf, *summary) if summary else ():
        if field != 1 or wire != 2:
            continue
        tag, tensor, simple = "", None, None
        for f, w, value in _fields(buf, *span):
            if f == 1 and w == 2:
                tag = buf[value[0] : value[1]].decode("utf-8")
            elif f == 8 and w == 2:
                tensor = value
            elif f == 2 and w == 5:
                simple = _F32.unpack_from(buf, value)[0]
        _add_item(tag, step, offset, lambda t=tensor: _span_tensor(buf, t), simple, out, problems, rel)


def _span_tensor(buf: bytearray, span: Optional[tuple[int, int]]) -> np.ndarray:
    """The TensorProto at ``span``: a view of its tensor_content, else via protobuf."""
    if span is None:
        raise ValueError("no tensor")
    dtype, dims, content, plain = 0, [], None, True
    for field, wire, value in _fields(buf, *span):
        if field == 1 and wire == 0:
            dtype = value
        elif field == 2 and wire == 2:  # TensorShapeProto.dim[].size
            dims = [size for f, w, dim in _fields(buf, *value) if f == 2 and w == 2 for g, v, size in _fields(buf, *dim) if g == 1 and v == 0]
        elif field == 4 and wire == 2:
            content = value
        elif field != 3:  # anything but version_number: typed values, handles, ...
            plain = False
    if content is None or not plain or dtype not in _DECODE or (dtype == types_pb2.DT_BFLOAT16 and _BFLOAT16 is None):
        return decode_tensor(tensor_pb2.TensorProto.FromString(bytes(buf[span[0] : span[1]])))
    np_type = np.dtype(_DECODE[dtype][0])
    count, extra = divmod(content[1] - content[0], np_type.itemsize)
    if extra or count != math.prod(dims):
        raise ValueError(f"tensor_content of {content[1] - content[0]} bytes for shape {dims}")
    return np.frombuffer(buf, np_type, count, content[0]).reshape(dims)


def _add_item(tag: str, step: int, offset: int, tensor: Callable[[], np.ndarray], simple: Optional[float],
              out: list, problems: list, rel: str) -> None:
    """Append the item of one summary value if it is ours; bad content becomes a ReadProblem."""
    if not tag.startswith(metadata.TAG_PREFIX):
        at = tag.find("/" + metadata.TAG_PREFIX)  # a tf.name_scope prefix
        if at < 0:
            return
        tag = tag[at + 1 :]
    try:
        item = _item(tag, step, offset, tensor, simple)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        problems.append(ReadProblem(rel, offset, f"bad {tag!r} value: {exc}"))
        return
    if item is not None:
        out.append(item)


def _item(tag: str, step: int, offset: int, tensor: Callable[[], np.ndarray], simple: Optional[float]) -> Optional[_Item]:
    head, _, rest = tag[len(metadata.TAG_PREFIX) :].partition("/")
    if head == "stats":
        return _Item("stats", rest, "", step, offset, tensor().astype(np.float64, copy=False))
    if head == "values":
        layout_hash, _, dtype = rest.partition("/")
        return _Item("values", layout_hash, dtype, step, offset, tensor().reshape(-1).astype(np_dtype(dtype), copy=False))
    if head == "layout":
        return _Item("layout", rest, "", step, offset, metadata.Layout.from_json_bytes(tensor().reshape(-1)[0]))
    if tag in _SCALAR_KEYS:
        number = simple if simple is not None else float(tensor().reshape(-1)[0])
        return _Item("scalar", _SCALAR_KEYS[tag], "", step, offset, number)
    if tag == metadata.RUN_INFO_TAG:
        info = json.loads(tensor().reshape(-1)[0].decode("utf-8"))
        return _Item("info", "", "", step, offset, info if isinstance(info, dict) else {})
    return None  # a tag of a later format version, or another tool's


def scan_records(buf: Union[bytes, bytearray], end: int, base: int) -> tuple[list, int, int, Optional[str]]:
    """Frame the complete records in ``buf[:end]`` (read at file offset ``base``).

    Returns (records as (file offset, read-only payload view), bytes consumed, bytes
    needed to complete the next record (0 if none started), corruption message or
    None). The length CRC and the data CRC of every record are checked, zero-copy.
    """
    view = memoryview(buf).toreadonly()  # protobuf parses read-only buffers
    u8 = np.frombuffer(buf, dtype=np.uint8)  # google_crc32c rejects memoryviews, takes arrays
    crc, records, pos = event_file.masked_crc32c, [], 0
    while pos + _HEAD <= end:
        length, length_crc = _HEADER.unpack_from(buf, pos)
        if crc(u8[pos : pos + 8]) != length_crc:
            return records, pos, 0, "length CRC mismatch (corrupt record header)"
        data_end = pos + _HEAD + length
        if data_end + _FOOT > end:
            return records, pos, _HEAD + length + _FOOT, None
        if crc(u8[pos + _HEAD : data_end]) != _FOOTER.unpack_from(buf, data_end)[0]:
            return records, pos, 0, "data CRC mismatch (corrupt record)"
        records.append((base + pos, view[pos + _HEAD : data_end]))
        pos = data_end + _FOOT
    return records, pos, (_HEAD if pos < end else 0), None


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
        self._buffer = bytearray(0)

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

    @staticmethod
    def _parse(buf: bytearray, start: int, stop: int, payload: memoryview, offset: int,
               items: list, problems: list, rel: str) -> None:
        """Items of one record: big ones walked zero-copy, the rest (and anything odd) by protobuf."""
        if stop - start >= WALK_BYTES:
            walked: list = []
            found: list = []
            try:
                _walk_event(buf, start, stop, offset, walked, found, rel)
            except _Malformed:
                pass
            else:
                items.extend(walked)
                problems.extend(found)
                return
        _parse_event(payload, offset, items, problems, rel)

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
                self._buffer = bytearray(want)
            buf = self._buffer  # reused: fresh memory per chunk would cost page faults
            fs.handle.seek(fs.offset)
            end = fs.handle.readinto(memoryview(buf)[:want])
            records, used, need, error = scan_records(buf, end, fs.offset)
            items: list[_Item] = []
            problems: list[ReadProblem] = []
            for offset, payload in records:
                start = offset - fs.offset + _HEAD
                if buf.find(_MARK, start, start + len(payload)) < 0:
                    continue  # CRC-checked, but not ours: skip the parse
                try:
                    self._parse(buf, start, start + len(payload), payload, offset, items, problems, fs.rel)
                except DecodeError as exc:
                    error, used = f"unparsable event: {exc}", offset - fs.offset
                    break
            if error is not None:
                problems.append(ReadProblem(fs.rel, fs.offset + used, error))
                fs.stopped = True
            left = size - fs.offset  # from this chunk on, so the chunk's own blocks count
            hint = (left * len(records) // used if used else 0, left)
            with self._lock:
                state.ingest(fs, items, problems, hint)
            changed |= bool(items or problems)
            fs.offset += used
            self.bytes_read += used
            if error is not None or end < want:
                break  # end of file (a partial record stays for the next reload)
            want = max(CHUNK_SIZE, need)
        return changed
