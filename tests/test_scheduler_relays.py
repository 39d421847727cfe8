"""The ``Relays`` component alone: inputs that go through the manager."""

from __future__ import annotations

import logging

from daskvine_py.scheduler.messages import BytesRelayed
from daskvine_py.scheduler.records import RunRecord, TaskRecord, WorkerRecord
from daskvine_py.scheduler.relays import Relays
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import dumps
from parts import context


def test_one_holder_uploads_once_for_every_reader_and_each_gets_the_value(caplog):
    names = (b"h", b"r1", b"r2")
    sent: list = []
    ctx = context(
        None,
        tuple(WorkerRecord(n, n.decode(), 1, f"tcp://{n.decode()}:1") for n in names),
        claims={"send": lambda w, m: sent.append((w.name, m))},
    )
    h, r1, r2 = ctx.workers.values()
    dep = TaskRecord(1, "x", RunRecord(3, 0, ()), b"", (), 0, "x")
    dep.state = "memory"
    dep.hold(h)
    ctx.tasks[1] = dep
    out = ctx.out
    relays = Relays(ctx)
    with caplog.at_level(logging.WARNING, "daskvine_py.manager"):
        relays.on_relay(r1, p.Relay((1, 2)))  # 2: unknown, nothing to relay
        relays.on_relay(r2, p.Relay((1,)))
        relays.on_relay(r1, p.Relay((1,)))
    assert sent == [("h", p.Upload((1,))), ("r1", p.Relayed(2, None))]
    assert relays.waiting == {1: {r1, r2}}
    # Logged when the upload is asked, once: r2 waits for the same one.
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "worker r1 cannot fetch results from worker h"
    ]
    value = dumps(b"x" * 100)
    del ctx.workers[b"r2"]  # gone meanwhile: nothing sent there
    relays.on_uploaded(h, p.Uploaded(1, value))
    assert sent[-1] == ("r1", p.Relayed(1, value)) and len(sent) == 3
    assert out == [BytesRelayed(3, "h", "r1", value.nbytes)] and not relays.waiting
