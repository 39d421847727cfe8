"""GPUs on this GPU-less machine: devices a worker declares (``--gpus``, or found in
``CUDA_VISIBLE_DEVICES`` and ``nvidia-smi -L``), what each task's library sees of them,
and the placement of tasks that ask for some; results compared with Dask's synchronous
scheduler."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import dask
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beacon import Beacon, ping
from daskvine_py import Manager
from daskvine_py.errors import TaskFailed
from daskvine_py.plan.annotations import Placement, RunSettings
from daskvine_py.scheduler.constraints import Constraints
from daskvine_py.scheduler.messages import NewTask, RunFailed
from daskvine_py.scheduler.records import RunRecord, TaskRecord, WorkerRecord
from daskvine_py.wire import protocol as p
from daskvine_py.wire import security
from daskvine_py.wire.serialize import dumps, loads
from daskvine_py.worker import gpus, pipe
from daskvine_py.worker.args import parse_args
from daskvine_py.worker.messages import (
    Boot,
    EventFailed,
    FromLibrary,
    KillLibrary,
    LibraryDied,
    StartLibrary,
    ToLibrary,
)
from daskvine_py.worker.state import WorkerState
from daskvine_py.worker.store import Store
from parts import context

HERE = os.path.dirname(os.path.abspath(__file__))
ADDRESS = "tcp://127.0.0.1:5999"


# -- which devices a worker offers ------------------------------------------------------------


def test_cuda_visible_devices_names_the_devices_and_gpus_takes_the_first():
    assert gpus.detect(None, {"CUDA_VISIBLE_DEVICES": "3,5"}) == ("3", "5")
    assert gpus.detect(1, {"CUDA_VISIBLE_DEVICES": "3,5"}) == ("3",)
    assert gpus.detect(None, {"CUDA_VISIBLE_DEVICES": "GPU-a1, GPU-b2"}) == ("GPU-a1", "GPU-b2")
    assert gpus.detect(None, {"CUDA_VISIBLE_DEVICES": ""}) == ()
    assert gpus.detect(None, {"CUDA_VISIBLE_DEVICES": "-1"}) == ()
    assert gpus.detect(None, {"CUDA_VISIBLE_DEVICES": "2,-1,4"}) == ("2",)  # as CUDA reads it
    assert gpus.detect(2, {}) == ("0", "1")
    assert gpus.detect(0, {"CUDA_VISIBLE_DEVICES": "3,5"}) == ()
    with pytest.raises(ValueError, match=r"--gpus 3: CUDA_VISIBLE_DEVICES='3,5' names only 2"):
        gpus.detect(3, {"CUDA_VISIBLE_DEVICES": "3,5"})


@pytest.mark.integration
def test_without_cuda_visible_devices_the_default_is_what_nvidia_smi_lists(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpus.detect(None) == ()  # no nvidia-smi: no GPU
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'echo "GPU 0: Tesla T4 (UUID: GPU-1111)"\n'
        'echo "GPU 1: Tesla T4 (UUID: GPU-2222)"\n'
    )
    smi.chmod(0o755)
    assert gpus.detect(None) == ("0", "1")
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    assert gpus.detect(None) == ()


def test_the_command_line_reads_gpus_and_the_environment(monkeypatch, capsys):
    monkeypatch.delenv(security.CONNECTION_FILE_ENV, raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", "")  # no nvidia-smi
    assert parse_args([ADDRESS]).gpus == ()
    assert parse_args([ADDRESS, "--gpus", "2"]).gpus == ("0", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert parse_args([ADDRESS]).gpus == ("3", "5")
    assert parse_args([ADDRESS, "--gpus", "1"]).gpus == ("3",)
    for bad, words in ((["--gpus", "3"], "names only 2 devices"), (["--gpus", "-1"], "0 to")):
        with pytest.raises(SystemExit) as info:
            parse_args([ADDRESS, *bad])
        assert info.value.code == 2
        assert words in capsys.readouterr().err


# -- which worker a GPU task goes to (the scheduler's constraints) --------------------------


def placing(gpus_by_worker: dict[str, int], placements: dict[str, Placement]):
    """``Constraints`` over workers of 4 cores and these GPUs, and a run of these tasks
    (all ready): what it moved where, and what it said."""
    workers = [
        WorkerRecord(name.encode(), name, 4, f"tcp://{name}:1", memory=2**30, gpus=n)
        for name, n in gpus_by_worker.items()
    ]
    moves: list = []

    def transition(task, finish, worker=None):
        moves.append((task.key, worker and worker.name))
        task.state, task.worker = finish, worker
        worker.processing[task] = None

    ctx = context(
        transition,
        tuple(workers),
        failures={"drop_run": lambda run: None, "abort": lambda *a: None},
    )
    constraints = Constraints(ctx)
    runs, out = ctx.runs, ctx.out
    settings = RunSettings({}, placements, {p: k for k, p in placements.items()})
    run = runs[1] = RunRecord(1, 3, (), settings=settings)
    added = []
    for i, key in enumerate(placements):
        task = run.tasks[key] = TaskRecord(i + 1, key, run, b"", (), i, key)
        added.append((NewTask(key, b"", (), (), i), task))
    constraints.mark(run, added)
    for _, task in added:
        task.state = "ready"
        constraints.push(task, placements[task.key])
    return constraints, ctx.workers, run, moves, out


def test_gpu_tasks_go_where_gpus_are_free_and_hold_them_while_there():
    one = Placement(gpus=1)
    constraints, workers, run, moves, out = placing(
        {"cpu": 0, "gpu": 2}, {"a": one, "b": one, "c": one, "plain": Placement(cores=2)}
    )
    constraints.dispatch()
    assert sorted(moves) == [("a", "gpu"), ("b", "gpu"), ("plain", "cpu")] and not out
    assert constraints.reserved == {run.tasks["c"]: workers[b"gpu"]}  # both GPUs are held
    a = run.tasks["a"]
    a.state, a.worker = "memory", None  # done: its GPU is free again
    del workers[b"gpu"].processing[a]
    moves.clear()
    constraints.dispatch()
    assert moves == [("c", "gpu")]


def test_a_run_asking_for_more_gpus_than_any_worker_has_fails_as_it_starts():
    constraints, workers, run, moves, out = placing(
        {"cpu": 0, "gpu": 2}, {"fine": Placement(gpus=2), "huge": Placement(gpus=3)}
    )
    constraints.dispatch()
    (failed,) = out
    assert type(failed) is RunFailed and failed.key == "huge"
    assert "1 core, 3 GPUs, which no connected worker can hold" in failed.message
    assert "cpu (4 cores, 1024 MB), gpu (4 cores, 1024 MB, 2 GPUs)" in failed.message


# -- which library a task runs in (the worker's state, Execute records built here) -------------


class GpuWorker:
    """A ``WorkerState`` with declared devices and one-slot libraries, and a shell for it:
    a library killed (``KillLibrary``, a restart) dies at once, one started
    (``StartLibrary``) is ready at once, and libraries answer exports at once."""

    def __init__(self, libraries: int, devices: tuple[str, ...] = ("0", "1")) -> None:
        self.state = WorkerState(Store(), name="w", peer_address="tcp://me:1", gpus=devices)
        self.pool = self.state.dispatch.gpus
        self.pending: list[object] = []
        self.reports: list[p.ToManager] = []
        #: libraries started again for the devices, by the last ``start``; whether it
        #: wrote anything else to libraries (an export, a forget: the next pass may move)
        self.restarted: list[int] = []
        self.moved = False
        self.last_started = 0
        #: exports the libraries were asked for, answered at once unless ``hold``
        self.exports: list[tuple[int, pipe.Export]] = []
        self.hold = False
        register = p.Register(p.PROTOCOL_VERSION, "w", libraries, 0, "h", "tcp://me:1", 1)
        self.pending.append(Boot(register, libraries))
        self.start()
        self.reports.clear()

    def run(self, task_id: int, gpus_: int = 0, *deps: p.DepLocation) -> None:
        self.pending.append(
            p.Execute(task_id, f"k{task_id}", b"payload", deps, False, 0, True, gpus=gpus_)
        )

    def start(self) -> dict[int, tuple[str | None, list[pipe.Call]]]:
        """Hand the worker what happened; the task ids it sent, by library: what its
        CUDA_VISIBLE_DEVICES says, and the calls (the restarts' too, carried out)."""
        sent: dict[int, tuple[str | None, list[pipe.Call]]] = {}
        self.restarted = []
        self.moved = False
        while True:  # at least one pass, as the shell's loop makes
            events, self.pending = self.pending, []
            for instruction in self.state.handle(events, 0.0):
                self._carry(instruction, sent)
            if not self.pending:
                return sent

    def _carry(self, instruction: object, sent: dict) -> None:
        kind = type(instruction)
        if kind is ToLibrary:
            library_id, request = instruction  # type: ignore[misc]
            if type(request) is pipe.Run:
                sent[library_id] = (self.pool.env(library_id), list(request.calls))
                return
            self.moved = True
            if type(request) is pipe.Export:
                self.exports.append((library_id, request))
                if not self.hold:
                    self.answer_exports()
        elif kind is KillLibrary:
            lib = self.state.dispatch.libraries[instruction.library_id]  # type: ignore[attr-defined]
            assert not lib.sent  # only idle libraries start again
            self.restarted.append(lib.id)
            self.pending.append(LibraryDied(lib.id, "killed by signal SIGKILL", ()))
        elif kind is StartLibrary:
            self.last_started = instruction.library_id  # type: ignore[attr-defined]
            self.pending.append(FromLibrary(self.last_started, pipe.Ready(), 0.0))
        elif kind in p.TO_MANAGER:
            self.reports.append(instruction)  # type: ignore[arg-type]

    def answer_exports(self) -> None:
        for library_id, request in self.exports:
            for task_id in request.task_ids:
                exported = pipe.Exported(task_id, dumps(task_id), 0.0, "")
                self.pending.append(FromLibrary(library_id, exported, 0.0))
        self.exports.clear()

    def finish(self, library_id: int, task_id: int, live: bool = False) -> None:
        value = None if live else dumps(task_id)
        nbytes = 100 if live else value.nbytes  # type: ignore[union-attr]
        done = pipe.Done(task_id, value, 0.01, nbytes, live)
        self.pending.append(FromLibrary(library_id, done, 0.0))

    def die(self, library_id: int) -> None:
        self.pending.append(LibraryDied(library_id, "killed by signal SIGKILL"))

    def reported(self) -> list[str]:
        out = [type(m).__name__ for m in self.reports if not isinstance(m, p.Started)]
        self.reports.clear()
        return out


def devices_of_running(worker: GpuWorker) -> list[str]:
    """Devices of the libraries running a task: never one twice."""
    libraries = worker.state.dispatch.libraries
    running = [lib.id for lib in libraries.values() if lib.sent]
    return [d for i in running for d in (worker.pool.env(i) or "").split(",") if d]


def _ids(sent: dict) -> list[tuple[str | None, list[int]]]:
    return sorted((env, [c.task_id for c in calls]) for env, calls in sent.values())


def test_gpu_tasks_get_libraries_started_with_free_devices_of_their_own():
    worker = GpuWorker(3)
    worker.run(1)  # no GPU
    worker.run(2, 1)
    worker.run(3, 1)
    worker.run(4, 1)
    sent = worker.start()
    # two idle libraries were started again, one device each; the GPU tasks go there
    assert len(worker.restarted) == 2
    assert _ids(sent) == [("", [1]), ("0", [2]), ("1", [3])]
    gpu_calls = [call for env, calls in sent.values() if env for call in calls]
    assert all(not call.keep and call.send for call in gpu_calls)
    assert sorted(devices_of_running(worker)) == ["0", "1"]
    assert worker.start() == {}  # task 4 waits: both devices are held, no library is idle
    (lib_of_2,) = [lib for lib, (_, calls) in sent.items() if calls[0].task_id == 2]
    worker.finish(lib_of_2, 2)
    assert worker.start() == {lib_of_2: ("0", [pipe.Call(4, "k4", b"payload", [], False, True)])}
    assert worker.reported() == ["TaskDone"]
    assert not worker.pool.restarts and not worker.reports


def test_a_task_without_gpus_never_runs_in_a_gpu_library_and_one_is_started_again_for_it():
    worker = GpuWorker(1, devices=("7",))
    worker.run(1, 1)
    ((env, calls),) = worker.start().values()  # its one library started again with device 7
    assert env == "7" and calls[0].task_id == 1 and len(worker.restarted) == 1
    worker.run(2)  # waits: the GPU library is busy
    assert worker.start() == {}
    worker.finish(worker.last_started, 1)
    ((env, calls),) = worker.start().values()  # the idle GPU library starts again, without
    assert env == "" and calls[0].task_id == 2  # devices


def test_a_gpu_librarys_death_frees_its_devices_and_crashes_only_its_task():
    worker = GpuWorker(2, devices=("0",))
    worker.run(1, 1)
    worker.run(2, 1)
    (gpu_lib,) = [i for i, (env, calls) in worker.start().items() if env == "0"]
    assert worker.start() == {}  # task 2 waits for the device
    worker.die(gpu_lib)  # a plain replacement starts, as after any crash
    ((env, calls),) = worker.start().values()  # the device is free: an idle library starts
    assert env == "0" and calls[0].task_id == 2  # again with it
    assert worker.reported() == ["TaskCrashed"]


def test_an_idle_library_keeping_live_results_exports_them_before_it_starts_again():
    worker = GpuWorker(1)
    worker.run(1)
    ((lib_id, _),) = worker.start().items()
    worker.finish(lib_id, 1, live=True)
    worker.run(2, 1)
    worker.hold = True  # the library has not answered the export yet
    assert worker.start() == {} and not worker.restarted
    assert worker.exports == [(lib_id, pipe.Export([1], True))]
    worker.answer_exports()
    ((env, calls),) = worker.start().values()  # now it starts again: nothing is lost
    assert env == "0" and calls[0].task_id == 2 and worker.restarted == [lib_id]
    assert worker.reported() == ["TaskDone"] and 1 in worker.state.store


def test_a_gpu_task_reads_a_live_input_from_the_store_after_its_export():
    worker = GpuWorker(2, devices=("0",))
    worker.run(1)
    ((lib_id, _),) = worker.start().items()
    worker.finish(lib_id, 1, live=True)
    worker.run(2, 1, p.DepLocation(1, "k1", ()))
    worker.hold = True
    assert worker.start() == {}
    assert worker.exports == [(lib_id, pipe.Export([1], False))]
    worker.answer_exports()
    # the other library, idle and empty, starts again with the device
    ((env, calls),) = worker.start().values()
    ((key, dep_id, value),) = calls[0].inputs
    assert env == "0" and (key, dep_id) == ("k1", 1) and value is not None and loads(value) == 1


def test_a_task_asking_for_more_gpus_than_the_worker_has_is_refused_not_kept_waiting():
    worker = GpuWorker(1)
    message = p.Execute(1, "k1", b"payload", (), False, 0, True, gpus=3)
    (failed, crashed) = worker.state.handle([message], 0.0)
    assert type(failed) is EventFailed and "asks for 3 GPUs; this worker has 2" in str(failed.error)
    assert type(crashed) is p.TaskCrashed and not worker.state.tasks


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    libraries=st.integers(1, 3),
    graph=st.lists(st.tuples(st.sampled_from((0, 0, 1, 2)), st.integers(0, 20)), max_size=12),
    data=st.data(),
)
def test_random_gpu_and_plain_tasks_all_run_and_never_share_a_device(libraries, graph, data):
    """Tasks of 0 to 2 GPUs on two devices, some reading an earlier task's live result:
    finished in a random order, every one runs in a library of its own kind, no device
    is held twice, and no task waits for good."""
    worker = GpuWorker(libraries)
    state = worker.state
    for i, (gpus_, dep) in enumerate(graph, start=1):
        deps = (p.DepLocation(dep, f"k{dep}", None),) if 0 < dep < i else ()
        worker.run(i, gpus_, *deps)
    done: set[int] = set()
    for _ in range(10 * len(graph) + 10):
        sent = worker.start()
        for env, calls in sent.values():
            for call in calls:
                assert len([d for d in (env or "").split(",") if d]) == graph[call.task_id - 1][0]
        held = devices_of_running(worker)
        assert len(held) == len(set(held)), held
        running = [(lib.id, lib.sent[0]) for lib in state.dispatch.libraries.values() if lib.sent]
        if not running:
            if not sent and not worker.restarted and not worker.moved:
                break
            continue
        library_id, task_id = data.draw(st.sampled_from(running))
        live = library_id not in worker.pool.bound  # a GPU library keeps nothing live
        worker.finish(library_id, task_id, live=live)
        done.add(task_id)
    assert done == set(range(1, len(graph) + 1)), (done, state.tasks)
    assert worker.reported().count("TaskDone") == len(graph)
    assert not state.tasks and not worker.pool.queue


# -- on real workers --------------------------------------------------------------------------


def visible(address=None, _after=None):
    """The devices this task's process sees; with ``address``, once a beacon there lets it
    go (so two such tasks provably run at once)."""
    if address is not None:
        ping(address, b"running", hold=True)
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def add(*parts):
    return sum(parts)


def _worker(connection_file: str, log, *args: str, env_visible: str | None = None):
    import daskvine_py

    src = os.path.dirname(os.path.dirname(daskvine_py.__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join((src, HERE)))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if env_visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = env_visible
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "daskvine_py.worker",
            "--connection-file",
            connection_file,
            "--log-level",
            "WARNING",
            *args,
        ],
        env=env,
        stdin=subprocess.DEVNULL,
        stderr=log,
    )


@pytest.fixture
def gpu_manager(tmp_path):
    """A manager with one worker of 4 cores and 2 declared GPUs (ids 0 and 1), which must
    say nothing (no result lost, no library crashed) while libraries start again."""
    path = tmp_path / "worker.log"
    with Manager() as manager, open(path, "w") as log:
        proc = _worker(
            manager.connection_file, log, "--cores", "4", "--gpus", "2", "--name", "gpu-0"
        )
        try:
            manager.wait_for_workers(1, processes=[proc])
            assert manager.workers["gpu-0"]["gpus"] == 2
            yield manager
        finally:
            manager.close()
            proc.kill()
            proc.wait()
    assert path.read_text() == ""


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_each_gpu_task_sees_only_devices_of_its_own(gpu_manager):
    manager = gpu_manager
    with Beacon() as beacon:
        with dask.annotate(resources={"gpus": 1}):
            one = dask.delayed(visible)(beacon.address, dask_key_name="one")
            two = dask.delayed(visible)(beacon.address, dask_key_name="two")
        with dask.annotate(resources={"gpus": 2}):
            both = dask.delayed(visible)(None, [one, two], dask_key_name="both")
        plain = dask.delayed(visible)(None, both, dask_key_name="plain")
        numbers = [dask.delayed(add)(i, i, dask_key_name=f"n{i}") for i in range(6)]
        total = dask.delayed(add)(*numbers, dask_key_name="total")
        out: dict = {}
        run = threading.Thread(
            target=lambda: out.update(
                result=dask.compute(one, two, both, plain, total, scheduler=manager.get)
            )
        )
        run.start()
        try:
            # Both one-GPU tasks are running at once: each holds its beacon connection open.
            held = [beacon.accept(120) for _ in range(2)]
            for _, conn in held:
                conn.close()
        finally:
            run.join(150)
    seen_one, seen_two, seen_both, seen_plain, seen_total = out["result"]
    assert {seen_one, seen_two} == {"0", "1"}  # different devices, one each
    assert seen_both in ("0,1", "1,0")
    assert seen_plain == ""  # a task without GPUs sees none
    assert seen_total == dask.compute(total, scheduler=dask.get)[0]


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_in_task_mode_tasks_a_gpu_task_sees_its_devices_and_a_task_process_none(gpu_manager):
    with dask.annotate(resources={"gpus": 1}):
        gpu = dask.delayed(visible)(None, dask_key_name="gpu")
    plain = dask.delayed(visible)(None, gpu, dask_key_name="plain")
    numbers = dask.delayed(add)(gpu is not None, 2, dask_key_name="numbers")
    seen = dask.compute(gpu, plain, numbers, scheduler=gpu_manager.get, task_mode="tasks")
    assert seen[0] in ("0", "1") and seen[1] == ""
    assert seen[2] == dask.compute(numbers, scheduler=dask.get)[0]


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_task_asking_for_more_gpus_than_any_worker_has_fails_the_run_naming_it(gpu_manager):
    with dask.annotate(resources={"gpus": 3}):
        x = dask.delayed(visible)(None, dask_key_name="greedy-gpu")
    y = dask.delayed(visible)(None, x, dask_key_name="after")
    with pytest.raises(TaskFailed, match=r"'greedy-gpu'.*3 GPUs.*gpu-0 \(4 cores, .* 2 GPUs\)"):
        dask.compute(y, scheduler=gpu_manager.get)
    # the manager and its worker go on
    assert dask.compute(dask.delayed(add)(1, 2), scheduler=gpu_manager.get) == (3,)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_devices_named_in_cuda_visible_devices_are_the_ones_tasks_see(tmp_path):
    with Manager() as manager, open(tmp_path / "worker.log", "w") as log:
        proc = _worker(
            manager.connection_file, log, "--cores", "2", "--name", "gpu-env", env_visible="3,5"
        )
        try:
            manager.wait_for_workers(1, processes=[proc])
            assert manager.workers["gpu-env"]["gpus"] == 2
            with dask.annotate(resources={"gpus": 2}):
                x = dask.delayed(visible)(None, dask_key_name="x")
            with dask.annotate(resources={"gpus": 1}):
                y = dask.delayed(visible)(None, x, dask_key_name="y")
            z = dask.delayed(visible)(None, y, dask_key_name="z")
            seen = dask.compute(x, y, z, scheduler=manager.get)
            assert seen[0] in ("3,5", "5,3") and seen[1] in ("3", "5") and seen[2] == ""
        finally:
            manager.close()
            proc.kill()
            proc.wait()
