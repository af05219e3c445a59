"""Everything read so far from one run's files, and the snapshots built from it.

Each tag's step blocks are copied into one growable ``[n_steps, ...]`` array per run;
duplicate (tag, step) records resolve as last write wins (file order, then record order).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, Hashable, Iterator, NamedTuple, Optional, Union

import numpy as np

from tb_parity_plugin.logdir.rundata import ReadProblem, RunData, TensorSeries, note_grown
from tb_parity_plugin.records import metadata
from tb_parity_plugin.records.dtypes import np_dtype

#: A column's winning rows: (unique sorted steps, row index, file ranks, offsets).
Resolved = tuple[np.ndarray, Union[slice, np.ndarray], np.ndarray, np.ndarray]
#: One tensor's rows in one layout: (spec, steps, stats, values or None, file ranks, offsets,
#: the layout's whole stats block, the tensor's column in it).
Part = tuple[metadata.TensorSpec, np.ndarray, np.ndarray, Optional[np.ndarray], np.ndarray, np.ndarray, np.ndarray, int]


def _last_wins(steps: np.ndarray, ranks: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Indices of the rows to keep, in step order: the last write of each step wins."""
    order = np.lexsort((offsets, ranks))  # write order: file rank, then offset
    reverse = order[::-1]
    _, first = np.unique(steps[reverse], return_index=True)
    return reverse[first]


@dataclasses.dataclass(frozen=True)
class Timeline:
    """How a run's files order its records. ``rank_of[file_id]``: the file's place in name order
    (event file names start with their creation time). ``cut_of[file_id]``: the first step of the
    earliest-starting later file, past which this file's records are superseded (the int64 max
    when none restarts before it). TensorBoard purges such orphaned steps too: a run written
    again into the same directory from step 0, stopped sooner, kept the older run's later steps
    and a faithful rerun was reported diverging there (a new user's). A resumed run (a later
    file from step 15 after one that reached 20) keeps 0-14 of the first, as before."""

    rank_of: np.ndarray
    cut_of: np.ndarray


_NO_CUT = np.iinfo(np.int64).max
_CREATED = re.compile(r"tfevents\.(\d+)\.")
#: ``...tfevents.<time>.<host>.<pid>.<N>[.v2]``, TensorFlow's and the TF1 shim's names: the writing process
_WRITER = re.compile(r"tfevents\.\d+\.(.+\.\d+)\.\d+(?:\.v2)?$")


def _created(rel: str) -> int:
    """The creation time (seconds) an event file's name holds, -1 for a name without one."""
    found = _CREATED.search(rel.rsplit("/", 1)[-1])
    return int(found.group(1)) if found else -1


_DIGITS = re.compile(r"(\d+)")


def _writer(rel: str) -> Optional[str]:
    """``<host>.<pid>`` of the process an event file's name says wrote it, None for another name."""
    found = _WRITER.search(rel.rsplit("/", 1)[-1])
    return found.group(1) if found else None


def _in_name_order(files: dict[str, FileState]) -> list[str]:
    """Paths in name order with numbers compared as numbers: TensorFlow names its files
    ``...tfevents.<time>.<host>.<pid>.<N>.v2`` with ``N`` unpadded, so a process's tenth writer
    (``.10.v2``) sorted before its ninth and a retry's steps lost to the crashed attempt's."""
    return sorted(files, key=lambda path: [int(p) if p.isdigit() else p for p in _DIGITS.split(path)])


def _after(earlier: FileState, later: FileState) -> bool:
    """Whether ``later`` began after ``earlier``'s last record was written (by the records' wall
    times; True when either has none, as for files written before wall times were read)."""
    if earlier.walls is None or later.walls is None:
        return True
    return earlier.walls[1] <= later.walls[0]


class _Column:
    """Step blocks of one tag, copied straight into one growable ``[capacity, *row]`` array.

    Why not a list stacked on access: for full values the list doubles peak memory
    and the page faults of fresh memory cost more than the copy. ``reserve`` lets a
    cold read size the array once from the bytes left in the file. Rows below ``n``
    never change, so snapshots may keep views of them.
    """

    def __init__(self, row_shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.row_shape, self.dtype = row_shape, dtype
        self._rows = np.empty((0, *row_shape), dtype)
        self._row_bytes = max(1, int(np.prod(row_shape, dtype=np.int64)) * dtype.itemsize)
        self._meta = np.empty((0, 3), np.int64)  # per row: step, file id, record offset
        self._n = 0
        self._increasing = True  # steps strictly increasing in arrival order: nothing to dedupe
        self._resolved: Optional[tuple[Timeline, Resolved]] = None  # (the timeline it is for, result)

    def extend(
        self, steps: np.ndarray, file_id: int, offsets: np.ndarray, blocks: np.ndarray, hint: tuple[int, int] = (0, 0)
    ) -> None:
        """Add ``len(steps)`` blocks; ``hint`` = (records, bytes) left in the file, to size growth."""
        n, k = self._n, len(steps)
        if n + k > len(self._rows):
            records_left, bytes_left = hint
            # A quarter more than the file holds now: a run still being written appends into the
            # same memory (snapshots share it, so the engine sees old rows unchanged without reading
            # them); pages never written are never faulted in, so the slack costs no memory.
            extra = max(n, k, min(records_left, bytes_left // self._row_bytes) * 5 // 4)
            self._rows = _grown(self._rows, n, n + extra)
            self._meta = _grown(self._meta, n, n + extra)
        self._rows[n : n + k] = blocks
        meta = self._meta[n : n + k]
        meta[:, 0], meta[:, 1], meta[:, 2] = steps, file_id, offsets
        if k and self._increasing:
            self._increasing = bool(
                (n == 0 or steps[0] > self._meta[n - 1, 0]) and (k == 1 or (np.diff(steps) > 0).all())
            )
        self._n = n + k
        self._resolved = None

    def rows(self) -> np.ndarray:
        """All blocks in arrival order, ``[n, *row_shape]`` (a view)."""
        return self._rows[: self._n]

    def __len__(self) -> int:
        return self._n

    def forget_from(self, n: int) -> None:
        """Drop rows ``n`` and later, added by the call being filed (no snapshot has seen them)."""
        self._n = min(self._n, n)
        self._resolved = None

    def rewritten(self, timeline: Timeline) -> list[tuple[bool, int, int, np.ndarray]]:
        """Steps written more than once among the rows ``timeline`` keeps, of which the last
        write wins: ``(by several files, how many steps, the first, the file ids)`` for the steps
        more than one file wrote (two writers of one tag in one run), then for those one file
        wrote again (a TF1 ``ParityHook`` under gradient accumulation writes on every micro-batch's
        ``sess.run``: 3 of 4 were dropped without a word). Only a column whose steps did not only
        increase can have any."""
        if self._increasing:
            return []
        meta = self._meta[: self._n]
        live = meta[meta[:, 0] < timeline.cut_of[meta[:, 1]]]
        pairs, per_pair = np.unique(live[:, :2], axis=0, return_counts=True)  # (step, file id)
        steps, files = np.unique(pairs[:, 0], return_counts=True)
        found = []
        for several, twice in ((True, steps[files > 1]), (False, np.unique(pairs[per_pair > 1, 0]))):
            if len(twice):
                chosen = np.isin(pairs[:, 0], twice) & (several | (per_pair > 1))
                found.append((several, len(twice), int(twice[0]), np.unique(pairs[chosen, 1])))
        return found

    def resolve(self, timeline: Timeline) -> Resolved:
        """(unique sorted steps, row index, file ranks, offsets) of the winning rows: a row a later
        file restarted the run before (:class:`Timeline`) is superseded, and of the rest the last
        write of each step wins."""
        if self._resolved is None or self._resolved[0] is not timeline:
            meta = self._meta[: self._n]
            steps, ranks, offsets = meta[:, 0].copy(), timeline.rank_of[meta[:, 1]], meta[:, 2].copy()
            live = steps < timeline.cut_of[meta[:, 1]]
            index: Union[slice, np.ndarray]
            if live.all():
                index = slice(0, len(steps)) if self._increasing else _last_wins(steps, ranks, offsets)
            else:
                rows = np.flatnonzero(live)
                index = rows[_last_wins(steps[rows], ranks[rows], offsets[rows])]
            self._resolved = (timeline, (steps[index], index, ranks[index], offsets[index]))
        return self._resolved[1]


#: The whole-number columns of a stats row (consecutive: field_span checks it) and their weights:
#: dtype and rank scaled far below 1, size negated, the six counts: a row's dot product is within
#: 0.5 of 0 exactly when all nine are finite and the counts add up to the size.
_WHOLE = metadata.field_span(("dtype", "rank", "size", *metadata.COUNT_FIELDS))
_CHECK = np.array([1e-300, 1e-300, -1.0] + [1.0] * len(metadata.COUNT_FIELDS))


def impossible_stats(blocks: np.ndarray) -> np.ndarray:
    """bool ``[n]``: which ``[n, tensors, N_STATS]`` stats blocks hold a row no writer produces.

    CRC-valid nonsense there would otherwise be judged (a NaN dtype is a "dtype" divergence,
    a NaN count a "nonfinite" one) or crash the engine (a NaN size). One matrix-vector product
    over all rows of the chunk (about 1.6 ms per 200 k rows), not a pass per column: the reader's
    speed is kept. ``einsum``, not ``@``: BLAS threads the product, which on two busy cores
    took 8 ms instead of 2. ``abs`` in place: a temporary this large is fresh memory, and
    its page faults cost as much as the product.
    """
    if blocks.size == 0:
        return np.zeros(len(blocks), dtype=bool)
    rows = blocks.reshape(-1, blocks.shape[-1])  # one 2-D product, not one per block: 3x faster
    with np.errstate(invalid="ignore", over="ignore"):
        residual = np.einsum("ij,j->i", rows[:, _WHOLE], _CHECK)
        ok = (np.abs(residual, out=residual) < 0.5).reshape(blocks.shape[:-1])
    bad: np.ndarray = ~ok.all(axis=-1)
    return bad


def _grown(array: np.ndarray, used: int, capacity: int) -> np.ndarray:
    """A ``capacity``-row copy of ``array``'s first ``used`` rows (the rest uninitialised), noted
    as such (``rundata.note_grown``) so the engine knows them unchanged without reading them."""
    grown = np.empty((capacity, *array.shape[1:]), array.dtype)
    grown[:used] = array[:used]
    note_grown(grown, array, used)
    return grown


@dataclasses.dataclass
class FileState:
    path: str  # absolute
    rel: str  # relative to the logdir, "/"-separated
    file_id: int
    offset: int = 0
    stopped: bool = False
    #: The storage's identity of the file when last read, and the bytes just before ``offset``:
    #: a new identity with the same bytes there is the same file rewritten longer (an object
    #: store's append), anything else a replacement.
    identity: Hashable = None
    tail: bytes = b""
    #: (earliest, latest) wall time of our records read so far (``event_scan.wall_span``)
    walls: Optional[tuple[float, float]] = None


class Item(NamedTuple):
    """Values of one of our tags at one or more records, before they are filed into a run."""

    what: str  # "layout" | "stats" | "values" | "info" | "scalar"
    key: str  # layout hash or scalar key
    dtype: str
    steps: np.ndarray  # int64 [n]
    offsets: np.ndarray  # int64 [n], record offsets in the file
    data: Any  # [n, ...] array; a Layout or dict (n == 1) for "layout" and "info"


class RunState:
    """Everything read so far from one run's files. Callers hold the reader's lock."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.files: dict[str, FileState] = {}
        self.layouts: dict[str, metadata.Layout] = {}
        self.widths: dict[tuple[str, str], int] = {}  # (hash, dtype) -> values block length
        self.held: dict[str, list[tuple[int, str, Item]]] = {}  # blocks waiting for their layout
        self.stats: dict[str, _Column] = {}
        self.values: dict[tuple[str, str], _Column] = {}
        self.scalars: dict[str, _Column] = {}
        self.info: dict[str, Any] = {}
        self.problems: list[ReadProblem] = []
        #: rel path -> the failure of its last read, for failures that may pass (a network error)
        self.transient: dict[str, ReadProblem] = {}
        self.generation = 0
        self._gaps: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]] = []  # steps left out (snapshot)
        self._timeline = Timeline(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
        self._span: dict[int, tuple[int, int, int]] = {}  # file_id -> (first record offset, its step, last step)
        self._hint: tuple[int, int] = (0, 0)
        self._snapshot: Optional[RunData] = None

    def add_file(self, path: str, rel: str) -> FileState:
        state = FileState(path, rel, len(self.files))
        self.files[path] = state
        self._retime()
        return state

    def _retime(self) -> None:
        """A new :class:`Timeline` from the files' name order and the steps each began at (the
        same object when nothing changed, so resolved columns stay cached). Only a file created in
        a later second (the time in its name) restarts an earlier one: two files of one second
        (one process's writers, a test's) are not ordered by their names."""
        ordered = _in_name_order(self.files)
        ranks = np.empty(len(self.files), dtype=np.int64)
        for rank, name in enumerate(ordered):
            ranks[self.files[name].file_id] = rank
        cuts = np.full(len(self.files), _NO_CUT, dtype=np.int64)
        for q, r in self._restarting_pairs(ordered):
            cuts[q.file_id] = min(cuts[q.file_id], self._span[r.file_id][1])
        old = self._timeline
        if not (np.array_equal(old.rank_of, ranks) and np.array_equal(old.cut_of, cuts)):
            self._timeline = Timeline(ranks, cuts)

    def _restarting_pairs(self, ordered: list[str]) -> Iterator[tuple[FileState, FileState]]:
        """(earlier file, later file created in a later second that has step records and began after
        the earlier one's last record). A file still written after the later one began is another
        writer, not a run restarted: ``summary_v2.Recorder`` opens a second file for steps of
        relaxed shapes when it first meets one, and an evaluation process may write beside training;
        taken for restarts they cut a single run's later steps (a reviewer's false AGREE)."""
        for i, older in enumerate(ordered):
            q = self.files[older]
            for newer in ordered[i + 1 :]:
                r = self.files[newer]
                if r.file_id in self._span and _created(r.rel) > _created(q.rel) >= 0 and _after(q, r):
                    yield q, r

    def _note_steps(self, file_id: int, item: Item) -> None:
        """Where ``file_id``'s step records begin (the step of its first, by offset) and end."""
        if not len(item.steps):
            return
        i = int(np.argmin(item.offsets))
        offset, step, last = int(item.offsets[i]), int(item.steps[i]), int(item.steps.max())
        known = self._span.get(file_id)
        if known is None or offset < known[0]:
            self._span[file_id] = (offset, step, max(last, known[2]) if known else last)
            self._retime()
        elif last > known[2]:
            self._span[file_id] = (known[0], known[1], last)

    def restarts(self) -> list[str]:
        """Each file that restarts the run at or before a step an earlier file reached, in words:
        what it supersedes is left out of the run, so the report must say so."""
        earlier: dict[str, list[FileState]] = {}
        for q, r in self._restarting_pairs(_in_name_order(self.files)):
            earlier.setdefault(r.path, []).append(q)
        out = []
        for path in sorted(earlier):
            r = self.files[path]
            start = self._span[r.file_id][1]
            cut = [q for q in earlier[path] if q.file_id in self._span and self._span[q.file_id][2] >= start]
            if cut:
                reached = max(self._span[q.file_id][2] for q in cut)
                out.append(
                    f"{r.rel} restarts the run at step {start}: the steps from {start} to {reached} of "
                    f"{', '.join(q.rel for q in cut)} (created earlier by the time in its name, and written to "
                    "its end before this file began) are left out (superseded, as TensorBoard drops them); write a "
                    "rerun to a new directory to compare both (a clock set back between the two misorders them)"
                )
        return out

    def _resumed_at(self) -> tuple[int, ...]:
        """The first step of each file (name order) that starts at or before a step an earlier file
        of ours reached: a run resumed from a checkpoint taken before it stopped. A file that merely
        goes on where the one before ended (a new recorder each epoch) is no resume: a review saw the
        resume named first at every epoch's first step. Unless another process wrote it, after the
        earlier file's last record: a process started again can only go on from a checkpoint (a job
        preempted right after it saved, at step 10, was resumed there with its input pipeline back at
        its first batch, and was told of fit's shuffling; its Adam slots left out of the checkpoint were
        told of clipping and betas)."""
        found, reached, last = set(), None, None
        for path in _in_name_order(self.files):
            fs = self.files[path]
            span = self._span.get(fs.file_id)
            if span is None:
                continue
            if reached is not None and span[1] <= reached:
                found.add(span[1])
            elif last is not None and _writer(fs.rel) not in (None, _writer(last.rel)) and _after(last, fs):
                found.add(span[1])
            reached = span[2] if reached is None else max(reached, span[2])
            last = fs
        return tuple(sorted(found))

    def rewrites(self) -> list[str]:
        """Each tag that more than one file of the run wrote at the same steps, in words: the last
        write wins, which hid a second writer's values (a reviewer's evaluation recorder logging
        ``loss`` into the training run replaced training's loss at steps 10, 20, 30, silently)."""
        rel = {fs.file_id: fs.rel for fs in self.files.values()}
        out = []
        for what, columns in (("statistics of layout", self.stats), ("scalar", self.scalars)):
            for key, column in sorted(columns.items()):
                for several, n, first, ids in column.rewritten(self._timeline):
                    files = ", ".join(rel[int(i)] for i in ids)
                    if several:
                        out.append(
                            f"{what} {key}: {n} step(s) from step {first} written by more than one file ({files}){_TWO_WRITERS}"
                        )
                    else:
                        out.append(f"{what} {key}: {n} step(s) from step {first} written again by {files}{_ONE_WRITER}")
        return out

    def ingest(
        self,
        fs: FileState,
        items: list[Item],
        problems: list[ReadProblem],
        hint: tuple[int, int] = (0, 0),
        walls: Optional[tuple[float, float]] = None,
    ) -> None:
        """File one chunk's items; ``hint`` = (records, bytes) left in the file; ``walls``: the
        chunk's (earliest, latest) record wall time (whether files were written concurrently)."""
        self._hint = hint
        if walls is not None:
            old = fs.walls
            fs.walls = walls if old is None else (min(old[0], walls[0]), max(old[1], walls[1]))
            if fs.walls != old and len(self.files) > 1:
                self._retime()
        for item in items:
            self._file(fs, item)
        self.problems.extend(problems)
        if items or problems:
            self.generation += 1

    def set_transient(self, fs: FileState, problem: Optional[ReadProblem]) -> bool:
        """Record (or with None clear) a passing failure of ``fs``; True if that changed anything.

        Kept apart from :attr:`problems`, which only grow: a remote read that failed is retried
        from the same offset, and once it succeeds its problem is gone.
        """
        if self.transient.get(fs.rel) == problem:
            return False
        if problem is None:
            del self.transient[fs.rel]
        else:
            self.transient[fs.rel] = problem
        self.generation += 1
        return True

    def _gap_problems(self) -> list[ReadProblem]:
        """Steps left out because their values block is missing or was unreadable."""
        by_rank = {int(self._timeline.rank_of[fs.file_id]): fs.rel for fs in self.files.values()}
        return [
            ReadProblem(
                by_rank.get(int(ranks[0]), ""),
                int(offsets[0]),
                f"{len(steps)} step(s) (first {int(steps[0])}) of layout {layout_hash} have statistics but no "
                "readable values block: those steps are left out",
            )
            for layout_hash, ranks, offsets, steps in self._gaps
        ]

    def _layoutless(self) -> list[ReadProblem]:
        """Blocks whose layout record never came (missing or malformed): named, never silently dropped."""
        out = []
        for layout_hash, waiting in self.held.items():
            _, rel, item = waiting[0]
            steps = sorted({int(st) for _, _, it in waiting for st in it.steps})
            out.append(
                ReadProblem(
                    rel,
                    int(item.offsets[0]),
                    f"{len(steps)} step(s) (first {steps[0]}) of layout {layout_hash} have no layout record "
                    "(missing or malformed): their tensors are not compared",
                )
            )
        return out

    def all_problems(self) -> list[ReadProblem]:
        return self.problems + list(self.transient.values())

    def _file(self, fs: FileState, item: Item) -> None:
        if item.what in ("stats", "values", "scalar"):
            self._note_steps(fs.file_id, item)
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

    def _block(self, file_id: int, rel: str, item: Item) -> None:
        layout = self.layouts[item.key]
        shape: tuple[int, ...]
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
        before = len(column)
        column.extend(item.steps, file_id, item.offsets, item.data, self._hint)
        if item.what == "stats":  # checked in the column's own aligned copy: the read buffer may be unaligned
            bad = impossible_stats(column.rows()[before:])
            if bad.any():
                self.problems.extend(
                    ReadProblem(
                        rel,
                        int(offset),
                        f"step {int(step)}: statistics no writer produces (a non-finite dtype, rank or size, or "
                        "counts that do not add up to the size): the step is left out",
                    )
                    for step, offset in zip(item.steps[bad], item.offsets[bad])
                )
                keep = ~bad
                column.forget_from(before)
                column.extend(item.steps[keep], file_id, item.offsets[keep], item.data[keep], self._hint)

    def _width(self, layout_hash: str, dtype: str) -> int:
        key = (layout_hash, dtype)
        if key not in self.widths:
            ends = [
                s.values[1] + s.values[2]
                for s in self.layouts[layout_hash].tensors
                if s.values and s.values[0] == dtype
            ]
            self.widths[key] = max(ends, default=0)
        return self.widths[key]

    def snapshot(self) -> RunData:
        """The run as a :class:`RunData`, rebuilt only after new data arrived."""
        if self._snapshot is not None and self._snapshot.generation == self.generation:
            return self._snapshot
        merged: dict[tuple[str, str], list[Part]] = {}
        self._gaps = []  # filled by _layout_parts
        for layout_hash, layout in self.layouts.items():
            if layout_hash in self.stats:
                for tensor_key, part in self._layout_parts(layout_hash, layout):
                    merged.setdefault(tensor_key, []).append(part)
        tensors = {key: _merge(parts) for key, parts in merged.items()}
        scalars: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for key, column in self.scalars.items():
            steps, index, _, _ = column.resolve(self._timeline)
            scalars[key] = (steps, _readonly(column.rows()[index]))
        all_steps = list({id(series.steps): series.steps for series in tensors.values()}.values())  # shared per layout
        self._snapshot = RunData(
            name=self.name,
            tensors=tensors,
            scalars=scalars,
            info=dict(self.info),
            steps=np.unique(np.concatenate(all_steps)) if all_steps else np.zeros(0, dtype=np.int64),
            problems=self.all_problems() + self._layoutless() + self._gap_problems(),
            generation=self.generation,
            notices=self.restarts() + self.rewrites() + _twice_notice(merged),
            resumed_at=self._resumed_at(),
        )
        return self._snapshot

    def _layout_parts(self, layout_hash: str, layout: metadata.Layout) -> Iterator[tuple[tuple[str, str], Part]]:
        """Per tensor of one layout: (key, (spec, steps, stats, values, ranks, offsets))."""
        steps, index, ranks, offsets = self.stats[layout_hash].resolve(self._timeline)
        dtypes = sorted({s.values[0] for s in layout.tensors if s.values})
        blocks = {
            d: self.values[(layout_hash, d)].resolve(self._timeline) for d in dtypes if (layout_hash, d) in self.values
        }
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
            if len(complete) and len(complete) < len(steps):
                # A step inside the run whose values block is missing or was unreadable: leave the
                # step out (named as a read problem) rather than every step's full values.
                has = np.isin(steps, complete)
                self._gaps.append((layout_hash, ranks[~has], offsets[~has], steps[~has]))
                rows = np.arange(len(self.stats[layout_hash].rows()))[index][has]
                steps, ranks, offsets, index = steps[has], ranks[has], offsets[has], rows
        stats = _readonly(self.stats[layout_hash].rows()[index])
        aligned = {d: _align(steps, blocks[d], self.values[(layout_hash, d)]) for d in blocks}
        for i, spec in enumerate(layout.tensors):
            values = None
            if spec.values is not None and (block := aligned.get(spec.values[0])) is not None:
                start, length = int(spec.values[1]), int(spec.values[2])
                values = block[:, start : start + length]
            yield (spec.kind, spec.name), (spec, steps, stats[:, i, :], values, ranks, offsets, stats, i)


def _readonly(array: np.ndarray) -> np.ndarray:
    view: np.ndarray = array.view()
    view.flags.writeable = False
    return view


def _align(steps: np.ndarray, resolved: Resolved, column: _Column) -> Optional[np.ndarray]:
    """Values rows for exactly ``steps``, or None if some step has no values block."""
    v_steps, v_index = resolved[0], resolved[1]
    if len(v_steps) == len(steps) and np.array_equal(v_steps, steps):
        return _readonly(column.rows()[v_index])
    pos = np.searchsorted(v_steps, steps)
    if (
        len(v_steps) == 0
        or np.any(pos >= len(v_steps))
        or not np.array_equal(v_steps[np.minimum(pos, len(v_steps) - 1)], steps)
    ):
        return None
    rows = np.arange(len(column.rows()))[v_index][pos]
    return _readonly(column.rows()[rows])


_TWO_WRITERS = (
    "; the last written is used: two writers in one run directory (an evaluation recorder beside training?) "
    "overwrite each other, give each its own"
)


_ONE_WRITER = (
    "; the last written is used: a step counter that advanced less often than the writes (gradient "
    "accumulation: global_step moves once per update, and TF1's ParityHook writes on every sess.run of the "
    "train op); record one micro-batch per step, or give each its own name"
)


def _twice_notice(merged: dict[tuple[str, str], list[Part]]) -> list[str]:
    """Tensors that two layouts hold at the same step (after restarts): two writers (an evaluation
    recorder logging training's activations), or two traced functions of one recorder logging the
    same tensors under one step counter (a new user's micro-batch function and update function
    under gradient accumulation, told "two writers" though it had one)."""
    twice = [(key, _first_twice(parts)) for key, parts in merged.items() if len(parts) > 1]
    found = [(key, step) for key, step in twice if step is not None]
    if not found:
        return []
    (kind, name), step = min(found, key=lambda t: t[1])
    return [
        f"{len(found)} tensor(s) written at the same steps by two layouts (first {kind}/{name} at step {step}): "
        "two writers, or two traced functions of one recorder logging them under one step counter (gradient "
        "accumulation: a function per micro-batch beside the update's); the last written is used: give each "
        "writer its own run directory, or each micro-batch's tensors their own names"
    ]


def _first_twice(parts: list[Part]) -> Optional[int]:
    """The first step that more than one of a tensor's layouts holds (None if none)."""
    steps = np.sort(np.concatenate([p[1] for p in parts]))
    same = steps[1:][steps[1:] == steps[:-1]]
    return int(same[0]) if len(same) else None


def _merge(parts: list[Part]) -> TensorSeries:
    """One TensorSeries from a tensor's parts in one or more layouts (last write wins).

    Layouts of one tensor differ when a writer resolved its runtime shape per step (a partial
    last batch): values of different widths are zero-padded to the widest, and each step's
    runtime shape comes from its layout (or from the size statistic and the static shape).
    """
    spec = max(parts, key=lambda p: p[1][-1] if len(p[1]) else -1)[0]
    static = tuple(spec.static if spec.static is not None else spec.shape)
    change: Optional[str] = None
    partial_values: Optional[np.ndarray] = None
    value_rows: Optional[np.ndarray] = None
    block: Optional[np.ndarray] = None
    column = -1
    if len(parts) == 1:
        _, steps, stats, values, _, _, block, column = parts[0]
        dims = _dims(spec, stats)
    else:
        steps_all = np.concatenate([p[1] for p in parts])
        pick = _last_wins(steps_all, np.concatenate([p[4] for p in parts]), np.concatenate([p[5] for p in parts]))
        steps = steps_all[pick]
        stats = _readonly(np.concatenate([p[2] for p in parts])[pick])
        vals = [p[3] for p in parts if p[3] is not None]
        values = None
        if vals and len({v.dtype for v in vals}) == 1:
            width = max(v.shape[1] for v in vals)
            padded = [v if v.shape[1] == width else np.pad(v, ((0, 0), (0, width - v.shape[1]))) for v in vals]
            if len(vals) == len(parts):
                values = _readonly(np.concatenate(padded)[pick])
            else:  # some layouts kept values (a small partial batch), others did not
                partial_values, value_rows = _partial(parts, padded, pick)
        kinds = {(p[0].dtype, tuple(p[0].static if p[0].static is not None else p[0].shape)) for p in parts}
        if len(kinds) > 1:
            listed = "; ".join(f"{d} {list(sh)}" for d, sh in sorted(kinds, key=str))
            if (
                len({d for d, _ in kinds}) == 1
                and len({sh[1:] for _, sh in kinds}) == 1
                and all(len(sh) for _, sh in kinds)
            ):
                # Only the leading dimension: a function traced again for a partial last batch.
                change = f"was {metadata.BATCH_SIZES} ({listed}): each step is compared at the shape it ran with"
            else:
                change = "changed layout mid-run: " + listed
        each = [_dims(p[0], p[2]) for p in parts]
        ranks = {d.shape[1] for d in each if d is not None}
        dims = None
        if all(d is not None for d in each) and len(ranks) == 1:
            dims = np.concatenate([d for d in each if d is not None])[pick]
    return TensorSeries(
        spec.kind,
        spec.name,
        spec.order,
        spec.dtype,
        static,
        steps,
        stats,
        values,
        dims,
        change,
        block,
        column,
        partial_values=partial_values,
        value_rows=value_rows,
        random=tuple(spec.random or ()),
    )


def _partial(
    parts: list[Part], padded: list[np.ndarray], pick: np.ndarray
) -> tuple[Optional[np.ndarray], Optional[np.ndarray]]:
    """(values rows, their rows among the merged ``pick``) of the parts that kept values (``padded``,
    in the parts' order), or (None, None) when no picked row has values (a later write without
    values won every such step)."""
    index, start = [], 0
    for part in parts:
        n = len(part[1])
        if part[3] is not None:
            index.append(np.arange(start, start + n))
            start += n
        else:
            index.append(np.full(n, -1))
    at = np.concatenate(index)[pick]
    rows = np.flatnonzero(at >= 0)
    if not len(rows):
        return None, None
    return _readonly(np.concatenate(padded)[at[rows]]), _readonly(rows)


@functools.lru_cache(maxsize=1024)
def _same_dims(shape: tuple[int, ...], steps: int) -> np.ndarray:
    """``[steps, rank]`` rows all equal to ``shape`` (read-only, shared by the tensors of that shape):
    a snapshot of 200 tensors built these per tensor, a third of its time."""
    return _readonly(np.broadcast_to(np.array(shape, dtype=np.int64).reshape(-1), (steps, len(shape))))


def _dims(spec: metadata.TensorSpec, stats: np.ndarray) -> Optional[np.ndarray]:
    """Per-step runtime shape of one layout's tensor: its (resolved) shape, one unknown
    dimension inferred from the size statistic; None when the rank is unknown."""
    shape = tuple(spec.shape)
    if shape == (None,) and spec.static is None:  # unknown rank
        return None
    unknown = [i for i, d in enumerate(shape) if d is None]
    if not unknown:  # every step has the same shape: one read-only row, broadcast (no per-tensor copy)
        return _same_dims(tuple(d for d in shape if d is not None), len(stats))
    known = np.array([-1 if d is None else d for d in shape], dtype=np.int64)
    dims = np.broadcast_to(known, (len(stats), len(shape))).copy()
    if len(unknown) == 1:
        rest = int(np.prod([d for d in shape if d is not None], dtype=np.int64))
        size = stats[:, metadata.STAT_INDEX["size"]].astype(np.int64)
        dims[:, unknown[0]] = np.where(rest > 0, size // max(rest, 1), -1)
    out: np.ndarray = dims
    return out
