"""TFRecord framing of TensorBoard event files: CRC32C, read and write, no TensorFlow.

A record is ``uint64 length | uint32 masked_crc(length) | data | uint32 masked_crc(data)``.
CRC32C comes from ``google_crc32c`` (C, hardware-accelerated); TensorBoard's own
TF-free path computes it in pure Python at about 6 MB/s.
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
import time
from typing import BinaryIO, Optional

import google_crc32c
from tensorboard.compat.proto import event_pb2, summary_pb2

from tb_parity_plugin.records import urls

_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
HEADER_SIZE = 12
FOOTER_SIZE = 4
_MASK_DELTA = 0xA282EAD8


def masked_crc32c(data: bytes) -> int:
    """The masked CRC32C TFRecord stores (rotate right by 15, plus a constant)."""
    crc: int = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame_record(data: bytes) -> bytes:
    """One TFRecord holding ``data``."""
    header = _U64.pack(len(data))
    return header + _U32.pack(masked_crc32c(header)) + data + _U32.pack(masked_crc32c(data))


#: Files this process opened: a name's last number, so one process's files of one second sort in
#: the order they were opened (the reader orders a run's files by name).
_OPENED = itertools.count()


class EventFileWriter:
    """Appends events to one ``events.out.tfevents.*`` file in a run directory.

    Pure Python so the TF1 shim can pack every value of a step into one event. A URL
    run directory (``gs://``, ``s3://`` with tensorflow-io, ...) is written through TensorFlow's
    file systems, as TensorFlow's own summary writers do: there the file's content is uploaded
    again on each :meth:`flush`, which the reader takes as the same file grown longer.
    """

    def __init__(self, run_dir: str, filename_suffix: str = "") -> None:
        name = (
            f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}"
            f".{os.getpid()}.{next(_OPENED):06d}{filename_suffix}"
        )
        self._file: Optional[BinaryIO]
        if urls.is_url(run_dir):
            import tensorflow as tf  # only the TF1 shim writes, and it runs with TensorFlow

            tf.io.gfile.makedirs(run_dir)
            self.path = run_dir.rstrip("/") + "/" + name
            self._file = tf.io.gfile.GFile(self.path, "wb")
        else:
            os.makedirs(run_dir, exist_ok=True)
            self.path = os.path.join(run_dir, name)
            self._file = open(self.path, "ab")
        self.write_event(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))
        self.flush()

    def write_event(self, event: event_pb2.Event) -> None:
        if self._file is None:
            raise ValueError(f"writer for {self.path} is closed")
        self._file.write(frame_record(event.SerializeToString()))

    def write_summary(self, step: int, summary: summary_pb2.Summary) -> None:
        self.write_event(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
