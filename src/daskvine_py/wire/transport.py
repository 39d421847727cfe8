"""Sending a batch's frames on a ZeroMQ socket, at the least cost per frame.

``Socket.send_multipart`` builds flag enums and checks every frame on each call; at a
few µs per frame that shows on the latency of a one-task ``get``. Here each frame is one
``send`` with plain integer flags, and frames are copied unless the batch carries
out-of-band buffers (see ``protocol.zero_copy``).
"""

from __future__ import annotations

from collections.abc import Sequence

import zmq

from daskvine_py.wire import protocol as p

_SNDMORE = int(zmq.SNDMORE)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)


def send_batch(
    sock: zmq.Socket[bytes], frames: Sequence[p.Frame], ident: bytes | None = None
) -> None:
    """Send the frames of one ``protocol.encode`` batch, to ``ident`` on a ROUTER."""
    copy = not p.zero_copy(frames)
    if ident is not None:
        sock.send(ident, _SNDMORE)
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        sock.send(frame, _SNDMORE if i < last else 0, copy=copy)


def has_more(sock: zmq.Socket[bytes]) -> bool:
    """Whether a message waits on ``sock``: drain loops ask this after each message
    instead of reading until ``zmq.Again`` (an exception per drain, some 10 µs)."""
    # ZMQ_EVENTS is an int option; pyzmq types every option's value as int | bytes.
    return bool(sock.get(_EVENTS) & _POLLIN)  # type: ignore[operator]
