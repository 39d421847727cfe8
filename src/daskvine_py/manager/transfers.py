"""What a worker says it received from its peers (``Transfers``), checked before it counts.

The counts feed ``manager.last_run`` and the report. A worker fetches only from workers
that joined (by their peer addresses), never from itself, and each peer at most once per
report; a record that says otherwise is not counted, and the scheduler state takes it as a
false claim (``scheduler/claims.py``).
"""

from __future__ import annotations

from collections.abc import Mapping

from daskvine_py.wire import protocol as p

#: Bytes from one peer in one report past which it is not believed: a worker reports every
#: loop pass, and 16 TiB is more than any link moves in one.
MAX_REPORTED_BYTES = 1 << 44


def credible(message: p.Transfers, names_by_peer: Mapping[str, str], own_address: str) -> bool:
    """Whether ``message`` names only peers that joined (``names_by_peer``), other than
    its sender, each once, with byte counts a link can move."""
    received = message.received
    if len(received) > len(names_by_peer):
        return False
    seen = set()
    for address, nbytes in received:  # (checked fields: str and int)
        if address not in names_by_peer or address == own_address or address in seen:
            return False
        if not 0 <= nbytes <= MAX_REPORTED_BYTES:
            return False
        seen.add(address)
    return True
