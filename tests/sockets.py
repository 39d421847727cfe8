"""A DEALER socket the tests speak through to a manager's or a worker's port."""

from __future__ import annotations

import zmq


def dealer(context, address, identity=None, keys=None, server_key=None):
    """Connected, never lingering; with ``keys`` (public, secret) a CurveZMQ client of
    the server whose public key is ``server_key``."""
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if identity:
        sock.setsockopt(zmq.IDENTITY, identity)
    if keys is not None:
        sock.curve_serverkey = server_key
        sock.curve_publickey, sock.curve_secretkey = keys
    sock.connect(address)
    return sock
