"""Software reaching the workers (``environment=``): what it costs, phase by phase.

    python benchmarks/bench_software.py pack               # the caller's side
    python benchmarks/bench_software.py start [--workers 2] # a node: cold, then warm
    python benchmarks/bench_software.py fanout [--fetchers 20 200] [--mb 16]
    python benchmarks/bench_software.py overhead [--tasks 2000] [--rounds 5]
    python benchmarks/bench_software.py --smoke            # each, tiny: does it still run?

Run it with the interpreter of the environment to measure (the Coffea venv, say): that
environment is what ``"local"`` packs.

- ``pack``: ``environment_of("local")`` into a fresh cache (the first pack), again in
  this process and in a new one (the cache hits), and the code archive of a directory of
  modules, unchanged and after one module changed.
- ``start``: a fresh node (an empty software cache) and workers of the small install
  (daskvine_py and the ``worker`` extra only, so they must use the shipped environment):
  the archive's size, its fetch from the manager's archive server, its unpack and check,
  the first library start, and the whole cold start from the worker's launch to the
  first task's result; then the warm start of a worker on the node that has it.
- ``fanout``: ``N`` fetchers, each with an archive server of its own as a worker has,
  fetch one archive at once from the manager's archive server (real sockets, CurveZMQ):
  the bytes the manager's host sent, against the archive's size.
- ``overhead``: a run of tiny tasks on local workers sharing the caller's environment,
  without ``environment`` (the default) and with ``environment="local"`` (packed, shipped
  and unpacked before the first run, then cached), alternating; and Dask's sync
  scheduler and dask.distributed on the same cores, the peers.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # ``nodes``: the small install


def pack(smoke: bool) -> None:
    from daskvine_py.software import code, pack

    with tempfile.TemporaryDirectory(prefix="bench-pack-") as cache:
        began = time.perf_counter()
        env, path = pack.environment_of("local", cache)
        first = time.perf_counter() - began
        assert path is not None
        pack._LOCAL_PACKS.clear()
        began = time.perf_counter()
        again, _ = pack.environment_of("local", cache)
        sidecar = time.perf_counter() - began
        began = time.perf_counter()
        pack.environment_of("local", cache)
        memo = time.perf_counter() - began
        assert again.key == env.key
        files, content = _archive_counts(path)
        print(f"environment 'local' of {sys.prefix}")
        print(f"  archive            {env.size / 2**20:10.1f} MiB ({content / 2**20:.1f} MiB, "
              f"{files} files unpacked)")  # fmt: skip
        print(f"  first pack         {first:10.3f} s")
        print(f"  unchanged (sidecar, as a new process){sidecar * 1000:8.2f} ms")
        print(f"  unchanged (same process)         {memo * 1000:8.2f} ms")

        modules = Path(cache) / "user"
        modules.mkdir()
        count = 5 if smoke else 100
        for i in range(count):
            (modules / f"user_module_{i}.py").write_text(f"VALUE = {i}\n" + "# pad\n" * 200)
        sys.path.insert(0, str(modules))
        try:
            for i in range(count):
                __import__(f"user_module_{i}")
            roots = code.default_roots()
            found = code.code_archive(roots, cache)
            assert found is not None
            times = []
            for _ in range(5):
                began = time.perf_counter()
                code.code_archive(roots, cache)
                times.append(time.perf_counter() - began)
            target = modules / "user_module_0.py"
            target.write_text("VALUE = -1\n")
            later = time.time() + 2
            os.utime(target, (later, later))
            began = time.perf_counter()
            changed = code.code_archive(roots, cache)
            rebuilt = time.perf_counter() - began
            assert changed is not None and changed[0].key != found[0].key
        finally:
            sys.path.remove(str(modules))
        print(f"code archive of {len(found[0].modules)} modules ({found[0].size / 1024:.0f} KiB)")
        print(f"  unchanged          {statistics.median(times) * 1000:10.2f} ms")
        print(f"  one module changed {rebuilt * 1000:10.2f} ms")


def _archive_counts(path: str) -> tuple[int, int]:
    import tarfile

    files = content = 0
    with tarfile.open(path) as tar:
        for member in tar:
            if member.isfile():
                files += 1
                content += member.size
    return files, content


def start(workers: int, smoke: bool) -> None:
    import dask

    import nodes
    from daskvine_py import Manager, RunOptions
    from daskvine_py.software import node_cache, transfer

    with tempfile.TemporaryDirectory(prefix="bench-start-") as scratch:
        root = Path(scratch)
        python = nodes.worker_only_install(root / "install")
        with Manager(environment="local") as manager:
            shipping = manager._shipping
            software = shipping.resolve(RunOptions(), manager.options).software
            assert software is not None and software.environment is not None
            env = software.environment
            print(f"environment {env.size / 2**20:.1f} MiB, code "
                  f"{(software.code.size if software.code else 0) / 1024:.0f} KiB")  # fmt: skip

            # the phases, one by one, with the worker's own functions
            fetched = root / "fetched"
            began = time.perf_counter()
            transfer.fetch(env.key, env.size, str(fetched), software.sources, manager._keys, None)
            fetch_s = time.perf_counter() - began

            def local_copy(key: str, size: int, dest: str) -> None:
                shutil.copyfile(fetched if key == env.key else shipping.archives[key], dest)

            began = time.perf_counter()
            with node_cache.NodeCache(str(root / "phases")) as cache:
                prepared = cache.prepare(software, local_copy)
            unpack_s = time.perf_counter() - began
            began = time.perf_counter()
            subprocess.run(
                [prepared.python, "-c", "import daskvine_py.plan.graph"],
                env={**os.environ, **prepared.env, "PYTHONPATH": str(HERE.parent / "src")},
                check=True,
            )
            library_s = time.perf_counter() - began
            print(f"  fetch from the manager's archive server {fetch_s:8.2f} s")
            print(f"  unpack and check                        {unpack_s:8.2f} s")
            print(f"  a library's interpreter and dask import {library_s:8.2f} s")

            node = root / "node"
            server = shipping.server
            assert server is not None
            before = server.bytes_served  # (the phases' own fetch)
            for label in ("cold", "warm"):
                procs = []
                began = time.perf_counter()
                for i in range(workers):
                    procs.append(
                        nodes.start_node_worker(
                            python,
                            manager.connection_file,
                            [],
                            node / "software",
                            f"{label}-{i}",
                            root / f"{label}-{i}.log",
                        )
                    )
                try:
                    parts = [dask.delayed(abs)(-i) for i in range(4 * workers)]
                    (total,) = dask.compute(dask.delayed(sum)(parts), scheduler=manager.get)
                    assert total == sum(range(4 * workers))
                    took = time.perf_counter() - began
                finally:
                    for proc in procs:
                        nodes.stop(proc)
                print(f"  {label} start of {workers} workers on one node: launch to first "
                      f"results {took:8.2f} s")  # fmt: skip
            archives = env.size + (software.code.size if software.code else 0)
            sent = server.bytes_served - before
            print(f"  bytes the manager's host sent to the node: {sent / 2**20:.1f} MiB (the "
                  f"archives: {archives / 2**20:.1f} MiB)")  # fmt: skip


def fanout(counts: list[int], mb: int) -> None:
    import resource

    from daskvine_py.software import transfer
    from daskvine_py.wire import security

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    keys = security.Keys.generate()
    with tempfile.TemporaryDirectory(prefix="bench-fanout-") as scratch:
        archive = Path(scratch) / "archive"
        data = os.urandom(mb * 2**20)
        archive.write_bytes(data)
        import hashlib

        key = hashlib.sha256(data).hexdigest()
        for count in counts:
            manager = transfer.ArchiveServer({key: str(archive)}.get, keys, manager=True)
            servers, errors = [], []
            dests = [Path(scratch) / f"w{count}-{i}" for i in range(count)]
            for dest in dests:
                servers.append(
                    transfer.ArchiveServer(
                        lambda k, d=dest: str(d) if k == key and d.exists() else None,
                        keys.for_workers(),
                    )
                )

            began = time.perf_counter()
            threads = [
                threading.Thread(
                    target=_fetch_one,
                    args=(key, len(data), dests[i], manager.address, keys, servers[i], errors),
                )
                for i in range(count)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            took = time.perf_counter() - began
            sent = manager.bytes_served
            for server in servers:
                server.close()
            manager.close()
            for dest in dests:
                dest.unlink(missing_ok=True)
            print(f"{count:5d} workers, archive {mb} MiB: the manager's host sent "
                  f"{sent / len(data):.2f}x the archive ({sent / 2**20:.0f} MiB), peers the "
                  f"rest; {took:.1f} s; errors {len(errors)}")  # fmt: skip
            if errors:
                raise SystemExit(f"fetches failed: {errors[:3]}")


def _fetch_one(
    key: str, size: int, dest: Path, source: str, keys: Any, server: Any, errors: list[Exception]
) -> None:
    """One worker's fetch, as its preparation thread makes it."""
    from daskvine_py.software import transfer

    try:
        transfer.fetch(key, size, str(dest), (source,), keys.for_workers(), server.address)
    except Exception as exc:  # counted and printed
        errors.append(exc)


def overhead(tasks: int, rounds: int) -> None:
    import dask
    from distributed import Client, LocalCluster

    from daskvine_py import Manager

    def graph() -> dict:
        dsk = {("x", i): (abs, -i) for i in range(tasks)}
        dsk["total"] = (sum, [("x", i) for i in range(tasks)])
        return dsk

    want = dask.get(graph(), "total")
    rows: dict[str, list[float]] = {"off": [], "local": [], "sync": [], "distributed": []}
    with Manager() as manager:
        manager.start_workers(2, cores=1)
        manager.get(graph(), "total")
        manager.get(graph(), "total", environment="local")  # packed, shipped, unpacked once
        manager.get(graph(), "total")
        for r in range(rounds):
            order = ("off", "local") if r % 2 == 0 else ("local", "off")
            for label in order:
                kwargs = {"environment": "local"} if label == "local" else {}
                began = time.perf_counter()
                assert manager.get(graph(), "total", **kwargs) == want
                rows[label].append(time.perf_counter() - began)
    for _ in range(rounds):
        began = time.perf_counter()
        assert dask.get(graph(), "total") == want
        rows["sync"].append(time.perf_counter() - began)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True) as cluster:
        with Client(cluster) as client:
            client.get(graph(), "total")
            for _ in range(rounds):
                began = time.perf_counter()
                assert client.get(graph(), "total") == want
                rows["distributed"].append(time.perf_counter() - began)
    print(f"{tasks} tiny tasks, median of {rounds}")
    for label, values in rows.items():
        print(f"  {label:12s} {statistics.median(values):8.3f} s")
    off, local = statistics.median(rows["off"]), statistics.median(rows["local"])
    print(f"  local/off {local / off:.2f}   distributed/off "
          f"{statistics.median(rows['distributed']) / off:.2f}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", nargs="?", choices=("pack", "start", "fanout", "overhead"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--fetchers", type=int, nargs="+", default=[20, 200])
    parser.add_argument("--mb", type=int, default=16)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="each, tiny: does it still run?")
    args = parser.parse_args()
    if args.smoke:
        fanout([4], 2)
        return 0
    if args.what is None:
        parser.error("say what to measure: pack, start, fanout or overhead (or --smoke)")
    if args.what == "pack":
        pack(False)
    elif args.what == "start":
        start(args.workers, False)
    elif args.what == "fanout":
        fanout(args.fetchers, args.mb)
    else:
        overhead(args.tasks, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
