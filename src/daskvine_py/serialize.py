"""Serialization of tasks, results and exceptions.

cloudpickle with pickle protocol 5: large buffers (numpy arrays, bytes) stay out of band
in ``Serialized.buffers``, so they travel as their own ZeroMQ frames and are never copied
into a message header. A ``Serialized`` inside a protocol message pickles its buffers as
``PickleBuffer``, which the protocol's encoder turns into separate frames.
"""

from __future__ import annotations

import pickle
import traceback
from typing import Any

import cloudpickle

#: Buffers smaller than this ride inside the pickle stream: a separate frame costs more
#: than copying a few kilobytes.
OUT_OF_BAND_MIN_BYTES = 64 * 1024


class Serialized:
    """A pickled object: the pickle stream and its out-of-band buffers."""

    __slots__ = ("header", "buffers")

    def __init__(self, header: bytes, buffers: list[Any]) -> None:
        self.header = header
        self.buffers = buffers

    @property
    def nbytes(self) -> int:
        return len(self.header) + sum(memoryview(b).nbytes for b in self.buffers)

    def __reduce__(self) -> tuple:
        return (Serialized, (self.header, [pickle.PickleBuffer(b) for b in self.buffers]))

    def __repr__(self) -> str:
        return f"Serialized({self.nbytes} bytes, {len(self.buffers)} buffers)"


def dumps(obj: Any) -> Serialized:
    """Serialize ``obj``; raises whatever cloudpickle raises for an unpicklable object."""
    buffers: list[Any] = []

    def keep_large_out_of_band(buf: pickle.PickleBuffer) -> bool:
        raw = buf.raw()
        if raw.nbytes < OUT_OF_BAND_MIN_BYTES:
            return True  # serialize in band
        buffers.append(raw)
        return False

    header = cloudpickle.dumps(obj, protocol=5, buffer_callback=keep_large_out_of_band)
    return Serialized(header, buffers)


def loads(ser: Serialized) -> Any:
    return pickle.loads(ser.header, buffers=ser.buffers)


def dumps_function(obj: Any) -> bytes:
    """Serialize a task (function and arguments) to one bytes object."""
    return cloudpickle.dumps(obj, protocol=5)


def dumps_exception(exc: BaseException) -> tuple[Serialized | None, str]:
    """The exception, if it pickles and unpickles, and its formatted traceback."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        ser = dumps(exc)
        loads(ser)  # some exceptions pickle but cannot be rebuilt
    except Exception:
        return None, text
    return ser, text
