"""The one dtype table: layout names, TF ``DataType`` codes, numpy types, proto fields.

Everything that maps a dtype (the stats row's ``dtype`` column, the template scanner's
``tensor_content`` decoding, protobuf's typed-field decoding, the layout's dtype names)
reads it from :data:`DTYPES`, so a dtype added here is known everywhere.
No TensorFlow: codes are those of ``tensorflow/core/framework/types.proto``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import numpy as np

try:  # ships with TensorFlow; without it bfloat16 values are widened to float32
    import ml_dtypes

    BFLOAT16: Optional[np.dtype] = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    BFLOAT16 = None


@dataclasses.dataclass(frozen=True)
class DType:
    """One dtype: its layout name, TF enum code, numpy type and TensorProto field."""

    name: str
    code: int
    numpy: np.dtype  # little-endian
    field: str  # repeated TensorProto field holding the values when there is no tensor_content


def _entry(name: str, code: int, numpy: Any, field: str) -> DType:
    return DType(name, code, np.dtype(numpy).newbyteorder("<"), field)


DTYPES: tuple[DType, ...] = (
    _entry("float32", 1, np.float32, "float_val"),
    _entry("float64", 2, np.float64, "double_val"),
    _entry("int32", 3, np.int32, "int_val"),
    _entry("uint8", 4, np.uint8, "int_val"),
    _entry("int16", 5, np.int16, "int_val"),
    _entry("int8", 6, np.int8, "int_val"),
    _entry("int64", 9, np.int64, "int64_val"),
    _entry("bool", 10, np.bool_, "bool_val"),
    DType("bfloat16", 14, BFLOAT16 if BFLOAT16 is not None else np.dtype("<u2"), "half_val"),
    _entry("uint16", 17, np.uint16, "int_val"),
    _entry("float16", 19, np.float16, "half_val"),  # float16 bits in an int32 field
    _entry("uint32", 22, np.uint32, "uint32_val"),
    _entry("uint64", 23, np.uint64, "uint64_val"),
)
BY_NAME = {d.name: d for d in DTYPES}
BY_CODE = {d.code: d for d in DTYPES}
DT_FLOAT = BY_NAME["float32"].code
DT_STRING = 7

#: Layout dtype name -> TF enum code (the stats row's ``dtype`` column; 0 = unknown).
TF_DTYPE_ENUM = {d.name: d.code for d in DTYPES}
#: TF enum code -> numpy dtype of ``tensor_content``, for the template scanner. bfloat16 is
#: left to protobuf: its numpy type depends on ml_dtypes being importable.
CONTENT_DTYPES = {d.code: d.numpy for d in DTYPES if d.name != "bfloat16"}


def np_dtype(name: str) -> np.dtype:
    """numpy dtype for a layout dtype name (``bfloat16`` needs ml_dtypes, else float32)."""
    if name == "bfloat16":
        return BFLOAT16 if BFLOAT16 is not None else np.dtype(np.float32)
    return np.dtype(name)


def decode_tensor(proto: Any, max_bytes: Optional[int] = None) -> np.ndarray:
    """numpy array of a ``TensorProto``, from ``tensor_content`` or the typed fields.

    Typed fields may be shorter than the shape (TensorFlow's compression repeats the
    last element), as ``tf.make_ndarray`` accepts. That expansion is the one place a few
    bytes of a file can ask for gigabytes, so with ``max_bytes`` (the reader passes the
    file's size) a shape declaring more bytes than that is a ``ValueError`` before anything
    is allocated: no writer of ours compresses, and a file cannot hold more than its size.
    """
    shape = tuple([d.size for d in proto.tensor_shape.dim])
    if any(d < 0 for d in shape):
        raise ValueError(f"tensor shape {list(shape)} has a negative dimension")
    size = math.prod(shape)
    code = proto.dtype
    itemsize = BY_CODE[code].numpy.itemsize if code in BY_CODE else 1
    if max_bytes is not None and size * itemsize > max(max_bytes, 0):
        raise ValueError(
            f"tensor shape {list(shape)} declares {size * itemsize} bytes, more than the file's {max_bytes}"
        )
    if code not in BY_CODE:
        if code == DT_STRING:
            return np.array(list(proto.string_val), dtype=object).reshape(shape)
        raise ValueError(f"unsupported tensor dtype {code}")
    entry = BY_CODE[code]
    dtype, field = entry.numpy, entry.field
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
    if entry.name == "bfloat16" and BFLOAT16 is None:  # pragma: no cover
        array = (array.astype(np.uint32) << 16).view(np.float32)
    return array.reshape(shape)
