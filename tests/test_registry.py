"""The manager's registry of workers, driven by hand: admission, rejection, retiring and
status clients, with no loop, no sockets and no workers."""

from __future__ import annotations

import logging

from daskvine_py.manager.registry import Registry
from daskvine_py.wire import protocol as p


class Posted:
    """What the registry queued for each identity."""

    def __init__(self) -> None:
        self.messages: list[tuple[bytes, object]] = []

    def __call__(self, ident: bytes, message: object) -> None:
        self.messages.append((ident, message))


def registry(loads=None) -> tuple[Registry, Posted]:
    posted = Posted()
    reg = Registry(
        posted,
        p.DropLog(logging.getLogger("test")),
        0.5,
        lambda: (3, 2, 1),
        lambda: loads if loads is not None else {},
    )
    return reg, posted


def register(name: str, version: int = p.PROTOCOL_VERSION) -> p.Register:
    return p.Register(version, name, 2, 1 << 20, "elsewhere", f"tcp://{name}:1", 7)


def test_a_registration_is_admitted_published_and_welcomed():
    reg, posted = registry()
    info = reg.stranger(b"id1", [register("w1")], now=0.0)
    assert info is not None and info.name == "w1" and reg.workers == {b"id1": info}
    assert reg.snapshot[b"id1"]["cores"] == 2
    assert posted.messages == [(b"id1", p.Welcome("w1", 0.5))]
    assert reg.remove(b"id1", "it left") is info
    assert reg.workers == {} and reg.snapshot == {}
    assert reg.remove(b"id1", "again") is None


def test_another_version_or_a_malformed_registration_is_rejected():
    reg, posted = registry()
    assert reg.stranger(b"old", [register("w1", version=p.PROTOCOL_VERSION + 1)], 0.0) is None
    bad = p.Register(p.PROTOCOL_VERSION, "w2", "two", 1, "h", "tcp://w2:1", 7)
    assert reg.stranger(b"bad", [bad], now=0.0) is None
    assert reg.stranger(b"quiet", [p.Heartbeat()], now=0.0) is None  # dropped, unanswered
    assert [(ident, type(m)) for ident, m in posted.messages] == [
        (b"old", p.Rejected),
        (b"bad", p.Rejected),
    ]
    assert reg.workers == {} and reg.snapshot == {}


def test_status_clients_get_the_demand_and_retire_workers(caplog):
    reg, posted = registry(loads={b"id1": (2, 0)})
    reg.stranger(b"id1", [register("w1")], now=0.0)
    posted.messages.clear()
    reg.stranger(b"pool", [p.StatusRequest(p.PROTOCOL_VERSION, "pool")], now=5.0)
    assert reg.wants_demand and reg.demand.cores_needed == 5  # ready 3 + processing 2
    assert posted.messages == [(b"pool", p.StatusReply(5, (("w1", 2, 0.0),)))]
    posted.messages.clear()
    reg.stranger(b"pool", [p.RetireWorker("w1", "idle")], now=6.0)
    assert posted.messages == [(b"id1", p.Shutdown("idle"))]
    reg.publish_demand(now=9.0)
    assert reg.demand.workers == {"w1": (2, 9.0 - 5.0)}  # idle since it was first seen
    reg.stranger(b"pool", [p.StatusRequest(p.PROTOCOL_VERSION + 1, "pool")], now=9.0)
    assert type(posted.messages[-1][1]) is p.Rejected
    with caplog.at_level(logging.INFO, logger="daskvine_py.manager"):
        reg.remove(b"id1", "it left: retired")
    assert [r.levelno for r in caplog.records if "w1 left" in r.message] == [logging.INFO]


def test_a_live_request_is_answered_with_the_snapshot_and_never_registers():
    reg, posted = registry()
    reg.live = lambda: {"totals": {"workers": 0}}
    assert reg.stranger(b"view", [p.LiveRequest(3), p.LiveRequest(4)], now=1.0) is None
    assert posted.messages == [
        (b"view", p.LiveReply(3, {"totals": {"workers": 0}})),
        (b"view", p.LiveReply(4, {"totals": {"workers": 0}})),
    ]
    posted.messages.clear()
    reg.stranger(b"view", [tuple.__new__(p.LiveRequest, ("3",))], now=2.0)  # malformed
    assert posted.messages == [] and reg.workers == {}


def test_a_second_worker_under_a_taken_name_joins_under_a_suffix(caplog):
    reg, posted = registry()
    first = reg.stranger(b"id1", [register("w1")], now=0.0)
    with caplog.at_level(logging.WARNING, logger="daskvine_py.manager"):
        second = reg.stranger(b"id2", [register("w1")], now=0.0)
        third = reg.stranger(b"id3", [register("w1")], now=0.0)
    assert (first.name, second.name, third.name) == ("w1", "w1~2", "w1~3")
    assert posted.messages[1] == (b"id2", p.Welcome("w1~2", 0.5))
    assert sorted(i["name"] for i in reg.snapshot.values()) == ["w1", "w1~2", "w1~3"]
    assert "a connected worker has that name already; it joins as w1~2" in caplog.text
    reg.remove(b"id1", "it left")  # its name is free again
    assert reg.stranger(b"id4", [register("w1")], now=0.0).name == "w1"


def test_a_name_or_host_holding_control_characters_is_refused_in_one_line(caplog):
    """A newline in a name would forge log lines and rows of ``Manager.workers``: such a
    registration is refused as malformed, a flood of them in one line, and nothing of
    a worker that never joined is logged as lost."""
    reg, posted = registry()
    forged = "evil\nWARNING worker x lost: forged"
    with caplog.at_level(logging.INFO):
        for i in range(60):
            reg.stranger(f"id{i}".encode(), [register(forged)], now=i / 60)
        reg.stranger(b"host", [register("w1")._replace(hostname="h\r\n")], now=1.0)
        for i in range(60):
            assert reg.remove(f"id{i}".encode(), "gone") is None
    assert reg.workers == {} and reg.snapshot == {}
    assert [type(m) for _, m in posted.messages] == [p.Rejected] * 61
    assert "Register.name" in posted.messages[0][1].reason
    assert "Register.hostname" in posted.messages[-1][1].reason
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "malformed registration" in lines[0], lines
    assert "\n" not in lines[0] and "\\n" in lines[0]  # shown escaped, never a line of its own


def test_a_flood_under_one_taken_name_is_one_line(caplog):
    reg, _ = registry()
    with caplog.at_level(logging.WARNING):
        names = [
            reg.stranger(f"id{i}".encode(), [register("w")], now=i / 60).name for i in range(60)
        ]
    assert names == ["w"] + [f"w~{i}" for i in range(2, 61)]
    assert [r.getMessage() for r in caplog.records] == [
        "worker w: a connected worker has that name already; it joins as w~2"
    ]
