"""Notes on an image model's spatial layers: an upsampling whose resize convention differs (TF1's
``resize_bilinear`` against TF2's half-pixel ``tf.image.resize``), and a pooling or convolution whose
padding differs (``'same'`` against Keras's default ``'valid'``), each read from the output recorded
just before the layer, as its input."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from tb_parity_plugin.engine.matrix import OK, SHAPE
from tb_parity_plugin.engine.notes.context import _RECORDED_BEFORE, NoteContext
from tb_parity_plugin.engine.pair import Pair
from tb_parity_plugin.records import metadata

#: The largest window and stride :meth:`SpatialNotes._window_padding_note` tries (pooling and convolution
#: windows are a few pixels; every pair up to an image's width was a million for a 1024-wide one).
_LARGEST_WINDOW = 16
#: The resizes :meth:`SpatialNotes._resize_note` tries, (method, convention) -> what computes it.
_RESIZES = {
    ("bilinear", "asymmetric"): (
        "bilinear with align_corners=False and half_pixel_centers=False (TF1 tf.compat.v1.image.resize_bilinear's "
        "and tf.compat.v1.image.resize's default)"
    ),
    ("bilinear", "align_corners"): "bilinear with align_corners=True",
    ("bilinear", "half_pixel"): (
        "bilinear with half-pixel centres (TF2 tf.image.resize, Keras UpSampling2D(interpolation='bilinear') and "
        "Resizing; TF1 only with half_pixel_centers=True)"
    ),
    ("nearest", "asymmetric"): (
        "nearest neighbour with align_corners=False and half_pixel_centers=False (TF1 "
        "tf.compat.v1.image.resize_nearest_neighbor's default)"
    ),
    ("nearest", "align_corners"): "nearest neighbour with align_corners=True",
    ("nearest", "half_pixel"): (
        "nearest neighbour with half-pixel centres (TF2 tf.image.resize(method='nearest'), Keras UpSampling2D's "
        "default interpolation)"
    ),
}


def resize_matrix(n_in: int, n_out: int, method: str, convention: str) -> np.ndarray:
    """``[n_out, n_in]`` weights of one axis of TensorFlow's resize kernels (``resize_bilinear``,
    ``resize_nearest_neighbor`` and ``tf.image.resize``, which computes each axis on its own)."""
    m = np.zeros((n_out, n_in))
    scale = (n_in - 1) / (n_out - 1) if convention == "align_corners" and n_out > 1 else n_in / n_out
    for o in range(n_out):
        if convention == "half_pixel":
            src = (o + 0.5) * scale - (0.5 if method == "bilinear" else 0.0)
        else:
            src = o * scale
        if method == "nearest":
            # the kernel's own float32 arithmetic, rounding half away from zero (roundf) with align_corners:
            # an index on a boundary falls where float32 puts it
            f32 = np.float32
            at = (f32(o) + f32(0.5 if convention == "half_pixel" else 0.0)) * (
                f32(n_in - 1) / f32(n_out - 1)
                if convention == "align_corners" and n_out > 1
                else f32(n_in) / f32(n_out)
            )
            i = int(np.floor(at + f32(0.5))) if convention == "align_corners" else int(np.floor(at))
            m[o, min(max(i, 0), n_in - 1)] = 1.0
            continue
        low = math.floor(src)
        t = src - low
        m[o, min(max(low, 0), n_in - 1)] += 1.0 - t
        m[o, min(max(math.ceil(src), 0), n_in - 1)] += t
    return m


def _along(m: np.ndarray, x: np.ndarray, axis: int) -> np.ndarray:
    """:func:`resize_matrix` ``m`` applied to ``x`` along ``axis`` from its nonzero weights, two a row at
    most (a dense product per axis took half a minute on a 512x512 image's twelve resizes)."""
    nonzero = m != 0
    low = nonzero.argmax(1)
    high = m.shape[1] - 1 - nonzero[:, ::-1].argmax(1)
    rows = np.arange(m.shape[0])
    shape = [1] * x.ndim
    shape[axis] = -1
    w_low = m[rows, low].reshape(shape)
    w_high = np.where(high != low, m[rows, high], 0.0).reshape(shape)
    out: np.ndarray = np.take(x, low, axis) * w_low + np.take(x, high, axis) * w_high
    return out


def _resized(x: np.ndarray, size: tuple[int, int], method: str, convention: str) -> np.ndarray:
    """``x`` ``[batch, height, width, channels]`` resized to ``size`` as TensorFlow resizes it."""
    rows = resize_matrix(x.shape[1], size[0], method, convention)
    cols = resize_matrix(x.shape[2], size[1], method, convention)
    return _along(cols, _along(rows, x, 1), 2)


class SpatialNotes(NoteContext):
    """Notes on a resize's convention and on a window's padding."""

    def _input_before(self, pair: Pair, k: int) -> Optional[Pair]:
        """The output (or input) recorded last before ``pair`` in execution order that both runs
        logged at step ``k``: the layer's input in a model that records each layer's output."""
        earlier = [
            p
            for p in self._pairs
            if p.base.kind in _RECORDED_BEFORE
            and p.base.order < pair.base.order
            and p.ib[k] >= 0
            and p.ic[k] >= 0
            and not metadata.is_sample(p.base.name)  # a sample of an output is not the layer's input
        ]
        return max(earlier, key=lambda p: p.base.order) if earlier else None

    def _resize_note(self, first: Pair, k: int) -> Optional[str]:
        """For a ``[batch, height, width, channels]`` output diverging first at ``k`` while the output
        recorded before it agrees element-wise and has its batch and channels on fewer rows or columns:
        which resize of that input each run's output is. A new user's U-Net port upsampled with Keras
        ``UpSampling2D(interpolation="bilinear")`` (half-pixel centres) where TF1's ``resize_bilinear``
        (``align_corners=False``, no half-pixel centres) was and was told that the layer "computes
        another function of its input (activation, padding, epsilon, a training flag)". None otherwise."""
        rb, rc = int(first.ib[k]), int(first.ic[k])
        if rb < 0 or rc < 0:
            return None
        shape = first.known_shape("base", rb)
        if shape is None or len(shape) != 4 or first.known_shape("cand", rc) != shape:
            return None
        source = self._input_before(first, k)
        if source is None or not source.by_values_at(k):
            return None
        source.ensure(k + 1, self.policy.equal_nan)
        if source.reason[k] != OK:
            return None
        rows = (int(source.ib[k]), int(source.ic[k]))
        small = source.known_shape("base", rows[0])
        if (
            small is None
            or len(small) != 4
            or (small[0], small[3]) != (shape[0], shape[3])
            or small[1] > shape[1]
            or small[2] > shape[2]
            or small[1:3] == shape[1:3]
        ):
            return None
        atol, rtol = first.atol_at(k), first.rtol_at(k)
        found = []
        for side, row, source_row in (("base", rb, rows[0]), ("cand", rc, rows[1])):
            out, x = first.values_at(side, row), source.values_at(side, source_row)
            if out is None or x is None or out.shape != shape or x.shape != small:
                return None
            out, x = np.asarray(out, np.float64), np.asarray(x, np.float64)
            found.append(
                [
                    way
                    for way in _RESIZES
                    if (np.abs(_resized(x, shape[1:3], *way) - out) <= atol + rtol * np.abs(out)).all()
                ]
            )
        if not any(found) or set(found[0]) == set(found[1]):
            return None
        frm = f"{source.base.kind}/{source.base.name} {list(small)}, recorded just before it,"
        said: list[str] = []
        for run, ways in zip((self.base.name, self.cand.name), found):
            said.append(
                f"'{run}''s is {frm if not said else 'that input'} resized to {shape[1]}x{shape[2]} "
                + (
                    "by " + " or ".join(_RESIZES[w] for w in ways)
                    if ways
                    else "by none of the bilinear or nearest-neighbour conventions"
                )
            )
        methods = [{w[0] for w in ways} for ways in found]
        conventions = [{w[1] for w in ways} for ways in found]
        if all(methods) and not methods[0] & methods[1]:
            why = "the runs resize with another interpolation (Keras UpSampling2D's default is 'nearest')"
        elif not all(found):
            why = (
                "the other resizes another way (bicubic, area, antialias, another size or convention) or reads "
                "another input"
            )
        elif any("half_pixel" in c for c in conventions):
            why = (
                "the resize's pixel-centre convention differs: TF2's tf.image.resize and Keras's UpSampling2D and "
                "Resizing use half-pixel centres, TF1's resize_bilinear and resize_nearest_neighbor do not unless "
                "asked (tf.compat.v1.image.resize_bilinear(x, size) computes TF1's default in TF2)"
            )
        else:
            why = "the resize's corner alignment differs: align_corners=True in one run only"
        return "; ".join(said) + f": {why}"

    def _window_padding_note(self, pair: Pair, k: int) -> Optional[str]:
        """For an output whose shapes at ``k`` differ in their spatial axes alone (neither the batch nor the
        last axis), while the output recorded just before it has one shape in both runs: the sizes a
        window's ``'same'`` and ``'valid'`` padding give from that input. A new user's U-Net port kept
        Keras ``MaxPool2D(3, 2)``'s default ``padding="valid"`` where TF1 pooled with ``padding="same"``
        (8x8 pooled to 3x3 against 4x4, the decoder's resize to a fixed size hiding it) and was told only
        the two shapes. None otherwise."""
        rb, rc = int(pair.ib[k]), int(pair.ic[k])
        if rb < 0 or rc < 0:
            return None
        sb, sc = pair.known_shape("base", rb), pair.known_shape("cand", rc)
        if sb is None or sc is None or len(sb) < 3 or len(sb) != len(sc):
            return None
        if sb[0] != sc[0] or sb[-1] != sc[-1] or sb == sc:
            return None
        source = self._input_before(pair, k)
        if source is None:
            return None
        source.ensure(k + 1, self.policy.equal_nan)
        rows = (int(source.ib[k]), int(source.ic[k]))
        shapes = (source.known_shape("base", rows[0]), source.known_shape("cand", rows[1]))
        if source.reason[k] == SHAPE or shapes[0] is None or shapes[0] != shapes[1] or len(shapes[0]) != len(sb):
            return None
        if shapes[0][0] != sb[0]:
            return None
        axes = [i for i in range(1, len(sb) - 1) if sb[i] != sc[i]]
        # every (stride, window, padding) of each run that gives its sizes on every axis apart from the input's,
        # then the pairs of them that differ in one of the three alone: a padding, a stride or a window
        found: list[set[tuple[int, int, str]]] = []
        for sizes in (sb, sc):
            ways: Optional[set[tuple[int, int, str]]] = None
            for i in axes:
                n = shapes[0][i]
                # windows and strides up to _LARGEST_WINDOW: a pass per pair of them, not n x n of a wide image's
                span = range(1, min(n, _LARGEST_WINDOW) + 1)
                here = {(st, w, "same") for st in span for w in span if math.ceil(n / st) == sizes[i]}
                here |= {(st, w, "valid") for st in span for w in span if (n - w) // st + 1 == sizes[i]}
                ways = here if ways is None else ways & here
            found.append(ways or set())
        runs = (self.base.name, self.cand.name)
        said: list[str] = []
        padding = sorted(
            (st, w, pb) for st, w, pb in found[0] for st2, w2, pc in found[1] if (st, w) == (st2, w2) and pb != pc
        )
        if padding:
            st, _, pb = padding[0]
            sizes_of = sorted({w for s2, w, _ in padding if s2 == st})
            window = str(sizes_of[0]) if len(sizes_of) == 1 else f"{sizes_of[0]} to {sizes_of[-1]}"
            same = runs[0] if pb == "same" else runs[1]
            valid = runs[1] if pb == "same" else runs[0]
            said.append(
                f"padding 'same' in '{same}' and 'valid' in '{valid}' (stride {st}, a window of {window}: Keras "
                "MaxPool2D, AveragePooling2D and Conv2D default to padding='valid', where TF1 code passes its own)"
            )
        strides = sorted(
            {(st, st2) for st, w, pb in found[0] for st2, w2, pc in found[1] if (w, pb) == (w2, pc) and st != st2}
        )
        if strides:
            pairs = ", ".join(f"{a} against {b}" for a, b in strides[:3]) + (" ..." if len(strides) > 3 else "")
            said.append(
                f"strides of {pairs} under one padding (Keras MaxPool2D's strides default to its pool size, TF1 "
                "code often pools with strides=2)"
            )
        windows = sorted(
            {
                (w, w2)
                for st, w, pb in found[0]
                for st2, w2, pc in found[1]
                if pb == pc == "valid" and st == st2 and w != w2
            }
        )
        if windows and not padding:
            pairs = ", ".join(f"{a} against {b}" for a, b in windows[:3]) + (" ..." if len(windows) > 3 else "")
            said.append(f"windows of {pairs} under padding 'valid' (another pool or kernel size)")
        if not said:
            return None
        size = "x".join(str(shapes[0][i]) for i in axes)
        return (
            f"only the spatial axes differ, from the {size} of {source.base.kind}/{source.base.name}, recorded just "
            f"before it with one shape in both runs: as its input, the layer's sizes fit " + "; or ".join(said)
        )
