"""A private network of "hosts" made of Linux network namespaces, for multi-host tests.

::

    parent namespace (no address, no route: nothing gets in or out)
    ┌───────────────────────── br0 (bridge) ──────────────────────────┐
    │ v0              v1              v2              v3  (veth ends)  │
    └─┼───────────────┼───────────────┼───────────────┼───────────────┘
      eth0            eth0            eth0            eth0
      10.231.47.1     10.231.47.2     10.231.47.3     10.231.47.4
      host 0          host 1          host 2          host 3 ...

Each host is a namespace of its own with ``lo`` up, one address on ``eth0`` in
``SUBNET`` and no default route, and its own hostname (a UTS namespace per process,
``unshare --uts``), so hosts reach each other through the bridge and nothing else.
IPv6 is off everywhere: no link-local addresses, no neighbour discovery chatter in the
byte counters. The parent side of each veth (``veth(host)``) counts every byte its
host sent (``rx``) and received (``tx``), read with ``counters``.

Needs root, ``ip`` (iproute2) and ``unshare`` (util-linux); ``unavailable()`` says why
not. Names carry the pid, so parallel runs do not collide; ``close`` (also run at exit)
kills the process groups it started and deletes the hosts, then the parent, and a new
``Hosts`` first deletes the namespaces of runs whose process is gone.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

#: The private /24 the hosts live in; nothing outside the namespaces uses it.
SUBNET = "10.231.47"
#: Seconds any one ``ip`` command may take.
IP_TIMEOUT = 10.0
#: Seconds between SIGTERM and SIGKILL for processes still running at ``close``.
GRACE = 2.0

_PREFIX = "dvpy"
_NAME = re.compile(rf"^{_PREFIX}(\d+)x\d+-")
_counter = itertools.count()

#: Run as ``python -c`` inside a fresh UTS namespace: name the host, then become argv.
_AS_HOST = """
import os, socket, sys
socket.sethostname(sys.argv[1])
os.execvp(sys.argv[2], sys.argv[2:])
"""


#: Run as ``python -c`` inside a new namespace: no IPv6 on its interfaces, present or future.
_NO_IPV6 = """
import os
for conf in ("all", "default"):
    path = f"/proc/sys/net/ipv6/conf/{conf}/disable_ipv6"
    if os.path.exists(path):
        with open(path, "w") as flag:
            flag.write("1")
"""


class Unavailable(RuntimeError):
    """This machine cannot build the network (not root, no ``ip``, no namespaces)."""


def unavailable() -> str | None:
    """Why namespaces cannot be used here, or None when they may be."""
    if sys.platform != "linux":
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs this test as root)"
    for tool, package in (("ip", "iproute2"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            return f"no `{tool}` command (install {package})"
    return None


def _ip(*args: str) -> str:
    """Run ``ip ARGS``; ``Unavailable`` with its message when it fails."""
    try:
        out = subprocess.run(
            ["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(f"`ip {' '.join(args)}` failed: {exc}") from exc
    if out.returncode != 0:
        raise Unavailable(f"`ip {' '.join(args)}` failed: {out.stderr.strip()}")
    return out.stdout


def _namespaces() -> list[str]:
    try:
        out = _ip("netns", "list")
    except Unavailable:
        return []
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace_processes(namespace: str) -> None:
    """SIGKILL whatever still runs in one of our namespaces (they are all ours)."""
    try:
        pids = [int(pid) for pid in _ip("netns", "pids", namespace).split()]
    except (Unavailable, ValueError):
        return
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _delete(namespace: str) -> None:
    _kill_namespace_processes(namespace)
    try:
        _ip("netns", "del", namespace)
    except Unavailable:
        pass


def remove_stale() -> list[str]:
    """Delete the namespaces of earlier runs whose process is gone (killed outright, so
    their ``close`` never ran); hosts before their parent. Returns the names deleted."""
    stale = []
    for name in _namespaces():
        match = _NAME.match(name)
        if match and not _pid_alive(int(match.group(1))):
            stale.append(name)
    stale.sort(key=lambda name: name.endswith("-net"))  # parents last
    for name in stale:
        _delete(name)
    return stale


class Hosts:
    """Namespaces ``hosts`` (their names), each with one address, joined by a bridge.

    Use as a context manager; ``popen``/``run`` start commands on a host. Every process
    started gets a session (process group) of its own, killed by ``close``.
    """

    def __init__(self, hosts: Sequence[str]) -> None:
        if len(set(hosts)) != len(hosts) or not 0 < len(hosts) < 250:
            raise ValueError(f"need distinct host names, 1 to 249 of them: {hosts}")
        tag = f"{_PREFIX}{os.getpid()}x{next(_counter)}"
        self.hosts = list(hosts)
        #: the namespace holding the bridge; deleted last
        self.parent = f"{tag}-net"
        self.namespaces = {host: f"{tag}-{host}" for host in hosts}
        self.addresses = {host: f"{SUBNET}.{i + 1}" for i, host in enumerate(hosts)}
        self._veths = {host: f"v{i}" for i, host in enumerate(hosts)}
        self._processes: list[subprocess.Popen] = []
        self._created: list[str] = []
        self._closed = False

    def __enter__(self) -> Hosts:
        self.create()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Hosts {self.parent} {self.addresses}>"

    def create(self) -> Hosts:
        """Build the network; ``Unavailable`` (and nothing left behind) if it cannot."""
        reason = unavailable()
        if reason:
            raise Unavailable(reason)
        remove_stale()
        atexit.register(self.close)
        try:
            self._add_namespace(self.parent)
            _ip("-n", self.parent, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.parent, "link", "set", "br0", "up")
            for host in self.hosts:
                namespace, veth = self.namespaces[host], self._veths[host]
                self._add_namespace(namespace)
                _ip(
                    "-n",
                    self.parent,
                    "link",
                    "add",
                    veth,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "eth0",
                    "netns",
                    namespace,
                )
                _ip("-n", self.parent, "link", "set", veth, "master", "br0", "up")
                _ip("-n", namespace, "addr", "add", f"{self.addresses[host]}/24", "dev", "eth0")
                _ip("-n", namespace, "link", "set", "eth0", "up")
                _ip("-n", namespace, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self._created.append(name)
        # IPv6 off before any interface exists or arrives (no-op on kernels without it)
        _ip("netns", "exec", name, sys.executable, "-c", _NO_IPV6)

    # -- processes --------------------------------------------------------------------

    def command(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` as run on ``host``: its network namespace and hostname."""
        return [
            "ip",
            "netns",
            "exec",
            self.namespaces[host],
            "unshare",
            "--uts",
            sys.executable,
            "-c",
            _AS_HOST,
            host,
            *argv,
        ]

    def popen(self, host: str, argv: Sequence[str], **popen: Any) -> subprocess.Popen:
        """Start ``argv`` on ``host`` (its pid is the command's own: every step execs)."""
        if self._closed:
            raise RuntimeError("these hosts are closed")
        popen.setdefault("stdin", subprocess.DEVNULL)
        proc = subprocess.Popen(self.command(host, argv), start_new_session=True, **popen)
        self._processes.append(proc)
        return proc

    def run(
        self, host: str, argv: Sequence[str], timeout: float = 30.0, **popen: Any
    ) -> subprocess.CompletedProcess:
        """Run ``argv`` on ``host`` to completion; its process group is killed and
        ``TimeoutExpired`` raised after ``timeout`` seconds."""
        if popen.pop("capture_output", False):
            popen["stdout"] = popen["stderr"] = subprocess.PIPE
        proc = self.popen(host, argv, **popen)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    # -- observation ------------------------------------------------------------------

    def counters(self) -> dict[str, dict[str, int]]:
        """Bytes each host sent (``"sent"``) and received (``"received"``) over its link,
        read on the bridge's side of its veth (so its ``rx`` is what the host sent)."""
        links = json.loads(_ip("-n", self.parent, "-j", "-s", "link", "show"))
        by_name = {link["ifname"]: link for link in links}
        out = {}
        for host, veth in self._veths.items():
            stats = by_name[veth].get("stats64") or by_name[veth]["stats"]
            out[host] = {"sent": stats["rx"]["bytes"], "received": stats["tx"]["bytes"]}
        return out

    # -- teardown ---------------------------------------------------------------------

    def close(self) -> None:
        """Kill what was started here (process groups), delete the hosts, then the parent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        running = [proc for proc in self._processes if proc.poll() is None]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for proc in running:
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + GRACE
            for proc in running:
                try:
                    proc.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            running = [proc for proc in running if proc.poll() is None]
            if not running:
                break
        for proc in self._processes:  # their pipes, so no ResourceWarning
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        for name in sorted(self._created, key=lambda name: name == self.parent):
            _delete(name)
        self._created.clear()

    def leftovers(self) -> list[str]:
        """Namespaces of these hosts that still exist (none after ``close``)."""
        ours = {self.parent, *self.namespaces.values()}
        return [name for name in _namespaces() if name in ours]
