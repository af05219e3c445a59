"""Framed records -> the tb-parity items they hold (layouts, stats and values blocks, scalars).

The fast path files runs of same-shaped records by byte template (:mod:`event_scan`);
protobuf parses the rest. Both paths go through :func:`_make_item`, so they convert
(and fail) the same way.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Optional

import numpy as np
from google.protobuf.message import DecodeError
from tensorboard.compat.proto import event_pb2, summary_pb2

from tb_parity_plugin.logdir import event_scan
from tb_parity_plugin.logdir.run_state import Item
from tb_parity_plugin.logdir.rundata import ReadProblem
from tb_parity_plugin.records import event_file, metadata
from tb_parity_plugin.records.dtypes import decode_tensor, np_dtype

#: Records are filed through event_scan's templates (False: protobuf only; tests compare both).
FAST_PATH = True
_MAX_TEMPLATES = 4  # per uniform run of records; what no template matches goes to protobuf
_CACHED_LENGTHS = 64  # record lengths whose templates a run keeps between chunks
_CACHED_LAYOUTS = 64  # parsed layouts a reader keeps for its runs
_CACHED_FIXED_BYTES = 64 << 10  # largest fixed part of a template kept between chunks
_UNKNOWN: Any = object()
_HEAD = event_file.HEADER_SIZE
#: Bytes every record of ours holds (its tag prefix): framing skips records without them.
MARK = metadata.TAG_PREFIX.encode("utf-8")
_SCALARS_PLUGIN = "scalars"  # tensorboard.plugins.scalar.metadata.PLUGIN_NAME, without importing the plugin


def _parse_event(
    buf: event_scan.Buffer,
    start: int,
    length: int,
    base: int,
    out: list[Item],
    problems: list[ReadProblem],
    rel: str,
    routes: TagRoutes,
    limit: Optional[int] = None,
) -> None:
    """Append the tb-parity items of the record at ``buf[start:]``, parsed by protobuf.

    Raises DecodeError if the event does not parse. The slow path: layouts, run info,
    typed tensor fields and anything :mod:`event_scan` does not describe exactly.
    ``limit``: the file's size; no value may decode to more bytes than that.
    """
    event = event_pb2.Event()
    event.ParseFromString(memoryview(buf)[start : start + length].toreadonly())
    routes.reading_at = start
    if not event.HasField("summary"):
        return
    offset = base + start - _HEAD
    steps, offsets = np.array([event.step], np.int64), np.array([offset], np.int64)
    for value in event.summary.value:
        if value.HasField("metadata"):
            route = routes.learn(value.tag, value.metadata)
        else:
            route = routes.route(value.tag)
        if route is None:
            continue
        try:
            if route[0] == "scalar" and value.WhichOneof("value") == "simple_value":
                array = np.array([value.simple_value])
            elif route[0] == "scalar" and len(value.tensor.float_val) == 1 and not value.tensor.tensor_content:
                array = np.array([value.tensor.float_val[0]])
            else:
                array = decode_tensor(value.tensor, limit)[None]
            out.append(_make_item(route, steps, offsets, array, routes.layout))
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            problems.append(ReadProblem(rel, offset, f"bad {value.tag!r} value: {exc}"))


Route = tuple[str, str, str]  # (what, key, dtype): what is layout|stats|values|info|scalar


class TagRoutes:
    """Which tags of one run are ours, learnt from each tag's summary metadata.

    TensorBoard's plugins find their data by the plugin name in a tag's metadata, not by
    its name; so do we. A tag is ours when a value of it carried ``plugin_name ==
    "tb_parity"`` with a content version this reader knows (or is one of our lr/loss
    scalars, whose metadata names the ``scalars`` plugin). TF1's ``FileWriter`` writes the
    metadata with a tag's first value only, so the answer is remembered for the run; a
    tag never seen with metadata is not ours, whatever its name.
    """

    def __init__(self, layouts: Optional[dict[bytes, metadata.Layout]] = None) -> None:
        """``layouts``: parsed layouts by their JSON, shared by the runs of one reader."""
        self._routes: dict[str, Optional[Route]] = {}
        self._refused: set[str] = set()  # tags whose metadata named our plugin but could not be used
        #: Messages about tags that carried our plugin name but could not be used.
        self.rejected: list[str] = []
        #: Record length -> templates built under the current routes, reused by later chunks
        #: (a template bakes in which tags are ours, so any change of a route drops them all).
        self.templates: dict[int, list[event_scan.Template]] = {}
        self._layouts = {} if layouts is None else layouts
        #: Where the record being decoded starts (set by its reader), and the first such start
        #: at which a route was decided or changed since scan_chunk last reset it to None.
        self.reading_at = 0
        self.changed_at: Optional[int] = None

    def checkpoint(self) -> tuple[dict[str, Optional[Route]], set[str], int]:
        """The routes as they are, for :meth:`restore` before a chunk is read again."""
        return dict(self._routes), set(self._refused), len(self.rejected)

    def restore(self, saved: tuple[dict[str, Optional[Route]], set[str], int]) -> None:
        """Forget what was learnt since ``saved``: a chunk read again learns it again, in record order."""
        routes, refused, rejected = saved
        if routes != self._routes:
            self.templates.clear()
        self._routes, self._refused = dict(routes), set(refused)
        del self.rejected[rejected:]

    def layout(self, data: bytes) -> metadata.Layout:
        """The layout serialized as ``data``, parsed once per reader (about 1 ms for 200 tensors).

        The runs a reader compares usually come from one model, so they write the same layouts;
        a Layout is immutable, so the runs may share one.
        """
        layout = self._layouts.get(data)
        if layout is None:
            if len(self._layouts) >= _CACHED_LAYOUTS:
                self._layouts.clear()
            layout = self._layouts[data] = metadata.Layout.from_json_bytes(data)
        return layout

    def remember(self, length: int, template: event_scan.Template) -> None:
        """Keep ``template`` for later chunks' records of ``length`` bytes (a bounded cache).

        Not one that copies a large ignored value (another tool's image in the same event):
        the cache stays under 64 lengths x 4 templates x 64 KiB, and rebuilding such a
        template costs little next to matching its fixed bytes in every record.
        """
        if template.fixed_bytes > _CACHED_FIXED_BYTES:
            return
        if length not in self.templates and len(self.templates) >= _CACHED_LENGTHS:
            self.templates.clear()
        kept = self.templates.setdefault(length, [])
        kept.append(template)
        del kept[:-_MAX_TEMPLATES]

    def learn(self, tag: str, meta: summary_pb2.SummaryMetadata) -> Optional[Route]:
        """Decide from a value's metadata (once per tag, unless refused before); returns the tag's route.

        A tag refused once (its metadata damaged, or naming another plugin) is decided again when
        a later value's metadata names ours: one damaged record must not hide every later step.
        """
        plugin = meta.plugin_data.plugin_name
        if tag in self._routes:
            known = self._routes[tag]
            if known is not None or plugin != metadata.PLUGIN_NAME:
                return known
        route: Optional[Route] = None
        if plugin == metadata.PLUGIN_NAME:
            try:
                body = metadata.parse_plugin_content(meta.plugin_data.content)
                route = _route_of(tag, body)
            except ValueError as exc:
                if tag not in self._refused:  # once per tag, not once per record
                    self._refused.add(tag)
                    self.rejected.append(f"tag {tag!r}: {exc}")
            if route is not None and tag in self._routes and tag not in self._refused:
                self.rejected.append(
                    f"tag {tag!r}: an earlier value's metadata did not mark it as a tb_parity record; its values before this "
                    "record were skipped"
                )
        elif plugin == _SCALARS_PLUGIN:
            for key, name in metadata.SCALAR_TAGS.items():
                if tag == name or tag.endswith("/" + name):  # a tf.name_scope may prefix it
                    route = ("scalar", key, "")
        if self._routes.get(tag, _UNKNOWN) != route:
            self.templates.clear()
            if self.changed_at is None or self.reading_at < self.changed_at:
                self.changed_at = self.reading_at
        self._routes[tag] = route
        return route

    def route(self, tag: str) -> Optional[Route]:
        """The route of a tag whose metadata was seen; None for tags that are not ours."""
        return self._routes.get(tag)

    def wanted(self, tag: str, meta: Optional[bytes]) -> Optional[bool]:
        """For event_scan: file per step (True), skip (False), or protobuf only (None)."""
        if meta is not None:
            self.learn(tag, summary_pb2.SummaryMetadata.FromString(meta))
        route = self._routes.get(tag)
        if route is None:
            return False
        return None if route[0] in ("layout", "info") else True


def _route_of(tag: str, body: dict[str, Any]) -> Optional[Route]:
    """Our route from the metadata content (``block``, ``layout``); values' dtype ends the tag.

    A block this reader does not know, in a format version it does know, is skipped: later
    writers may add blocks that older readers can do without.
    """
    block, layout_hash = body.get("block"), str(body.get("layout", ""))
    if block == "stats":
        return ("stats", layout_hash, "")
    if block == "values":
        return ("values", layout_hash, tag.rsplit("/", 1)[-1])
    if block == "layout":
        return ("layout", layout_hash, "")
    if block == "run_info":
        return ("info", "", "")
    return None


def _make_item(
    route: Route,
    steps: np.ndarray,
    offsets: np.ndarray,
    array: np.ndarray,
    parse_layout: Callable[[bytes], metadata.Layout] = metadata.Layout.from_json_bytes,
) -> Item:
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
        data = parse_layout(array.reshape(-1)[0])
    else:
        info = json.loads(array.reshape(-1)[0].decode("utf-8"))
        data = info if isinstance(info, dict) else {}
    return Item(what, key, dtype, steps, offsets, data)


class LearntOutOfOrder(Exception):
    """A record taught a tag's route after records later in the file were already filed."""


def scan_chunk(
    buf: event_scan.Buffer,
    framed: event_scan.Framed,
    base: int,
    rel: str,
    routes: TagRoutes,
    limit: Optional[int] = None,
) -> tuple[list[Item], list[ReadProblem]]:
    """Items and problems of a chunk's marked records (event_scan first, protobuf for the rest).

    Raises DecodeError for an unparsable event, and LearntOutOfOrder when a record taught a
    route after records later in the file were filed: runs go by record length, not file
    order, so those were filed without the route (a tag's metadata may come with a later value
    than its first). Callers then restore the routes and use :func:`parse_in_order`. Our
    writer's logs (metadata with every value) never raise it, nor TF1-style ones (metadata
    with a tag's first value only) whose tags all begin with the run.
    """
    items: list[Item] = []
    problems: list[ReadProblem] = []
    passed = -1  # start of the last record of the runs filed so far
    for run in event_scan.uniform_runs(framed.starts, framed.lengths):
        routes.changed_at = None
        left = _scan_run(buf, run, base, items, problems, rel, routes) if FAST_PATH else range(run.count)
        for i in left:
            _parse_event(buf, run.first + i * run.stride, run.length, base, items, problems, rel, routes, limit)
        if routes.changed_at is not None and passed > routes.changed_at:
            raise LearntOutOfOrder(f"a route learnt at byte {base + routes.changed_at - _HEAD}")
        passed = max(passed, run.first + (run.count - 1) * run.stride)
    items.sort(key=lambda item: item.offsets[0])  # stable: record order, then value order
    problems.sort(key=lambda problem: problem.offset)
    return items, problems


def _scan_run(
    buf: event_scan.Buffer,
    run: event_scan.Uniform,
    base: int,
    items: list[Item],
    problems: list[ReadProblem],
    rel: str,
    routes: TagRoutes,
) -> list[int]:
    """File the records of a uniform run that match a template; returns the rest's indices.

    Templates kept from earlier chunks are tried first: building one walks the wire format and
    has protobuf parse the seed record (about 0.3 ms for a 600 KB values record, per chunk).
    A record they match has the very bytes protobuf accepted in the seed, except the wall time,
    the step varint (checked by ``matches``) and the slots' numbers.
    """
    rows = event_scan.rows_view(buf, run)
    todo = np.ones(run.count, dtype=bool)
    slow: list[int] = []
    for kept in list(routes.templates.get(run.length, ())):
        _file_matches(buf, run, kept, rows, todo, base, items, problems, rel, routes)
    for _ in range(_MAX_TEMPLATES):
        if not todo.any():
            break
        seed = int(np.argmax(todo))
        start = run.first + seed * run.stride
        routes.reading_at = start
        template = event_scan.build_template(buf, start, run.length, routes.wanted)
        if template is not None:  # protobuf validates the seed's fixed bytes (UTF-8 of strings, ...)
            event_pb2.Event.FromString(memoryview(buf)[start : start + run.length].toreadonly())
        if template is None:
            slow.append(seed)
            todo[seed] = False
        else:
            routes.remember(run.length, template)
            _file_matches(buf, run, template, rows, todo, base, items, problems, rel, routes)
    return sorted(slow + np.flatnonzero(todo).tolist())


def _file_matches(
    buf: event_scan.Buffer,
    run: event_scan.Uniform,
    template: event_scan.Template,
    rows: np.ndarray,
    todo: np.ndarray,
    base: int,
    items: list[Item],
    problems: list[ReadProblem],
    rel: str,
    routes: TagRoutes,
) -> None:
    """Items of the ``todo`` records that ``template`` matches; they are taken off ``todo``."""
    ok = template.matches(rows) & todo
    if not ok.any():
        return
    todo &= ~ok
    every = bool(ok.all())
    steps = template.steps(rows) if every else template.steps(rows)[ok]
    offsets = base - _HEAD + run.first + run.stride * np.flatnonzero(ok)
    for slot in template.slots:
        array = event_scan.slot_array(buf, run, slot)
        route = routes.route(slot.tag)
        assert route is not None  # templates only hold slots of routed tags (wanted())
        try:
            items.append(_make_item(route, steps, offsets, array if every else array[ok], routes.layout))
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            problems.extend(ReadProblem(rel, int(o), f"bad {slot.tag!r} value: {exc}") for o in offsets)


def parse_in_order(
    buf: event_scan.Buffer,
    framed: event_scan.Framed,
    base: int,
    rel: str,
    routes: TagRoutes,
    limit: Optional[int] = None,
) -> tuple[list[Item], list[ReadProblem], Optional[tuple[int, str]]]:
    """Protobuf only, record by record, up to the first unparsable one: (its offset, message) or None.

    Also the fallback when the fast path met something no check foresaw, or learnt a route out
    of record order: each record is filed whole or not at all, so every record before the bad
    one is kept (not the chunk lost), and routes are learnt in the order the records come.
    """
    items: list[Item] = []
    problems: list[ReadProblem] = []
    for start, length in zip(framed.starts, framed.lengths):
        mine: list[Item] = []
        try:
            _parse_event(buf, start, length, base, mine, problems, rel, routes, limit)
        except DecodeError as exc:
            return items, problems, (base + start - _HEAD, f"unparsable event: {exc}")
        except Exception as exc:  # unforeseen content: this file stops at this record
            return items, problems, (base + start - _HEAD, f"unreadable event: {type(exc).__name__}: {exc}")
        items += mine
    return items, problems, None
