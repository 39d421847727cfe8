"""The ``daskvine_py`` section of ``dask.config``: defaults for every option of ``get`` and
every manager setting, read the ways Dask reads its own config; arguments win."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import dask
import dask.array as da
import pytest
import yaml

from daskvine_py import Manager, config
from daskvine_py.options import ManagerOptions, RunOptions

pytestmark = pytest.mark.timeout(120)

DOCS = Path(__file__).parent.parent / "docs" / "options.md"


@pytest.fixture
def dask_config():
    """Dask's config re-read from nowhere but the given paths and environment, and restored
    (as Dask read it at start) afterwards."""

    def read(paths=(), env=None):
        dask.config.refresh(paths=[str(p) for p in paths], env=env or {})

    yield read
    dask.config.refresh()


def write_yaml(directory: Path, text: str) -> Path:
    directory.mkdir(exist_ok=True)
    (directory / "daskvine.yaml").write_text(text)
    return directory


def test_the_shipped_yaml_holds_every_option_and_setting_with_its_default():
    shipped = yaml.safe_load(config.DEFAULTS_FILE.read_text())["daskvine_py"]
    for name, record in (("get", RunOptions), ("manager", ManagerOptions)):
        built_in = {f.name: getattr(record(), f.name) for f in dataclasses.fields(record)}
        from_yaml = dataclasses.asdict(record(**shipped[name]))
        assert from_yaml == built_in, name
        assert list(shipped[name]) == list(built_in), name


def test_the_docs_show_the_shipped_yaml():
    blocks = re.findall(r"```yaml\n(.*?)```", DOCS.read_text(), re.S)
    assert config.DEFAULTS_FILE.read_text() in blocks


def test_precedence_argument_over_config_set_over_yaml_over_built_in(
    shared_manager, dask_config, tmp_path
):
    x = da.arange(12, chunks=4).sum()
    expected = dask.compute(x, scheduler="sync")

    def retries(**options):
        assert dask.compute(x, scheduler=shared_manager.get, **options) == expected
        return shared_manager.last_run.options["retries"]

    dask_config()
    assert retries() == 3  # built in
    dask_config([write_yaml(tmp_path / "a", "daskvine_py:\n  get:\n    retries: 5\n")])
    assert retries() == 5  # a YAML file
    with dask.config.set({"daskvine_py.get.retries": 6}):
        assert retries() == 6  # dask.config.set over the file
        assert retries(retries=7) == 7  # the argument over everything
    assert retries() == 5


def test_environment_variables_override_yaml_files(shared_manager, dask_config, tmp_path):
    directory = write_yaml(tmp_path, "daskvine_py:\n  get:\n    retries: 5\n    replicas: 1\n")
    dask_config([directory], {"DASK_DASKVINE_PY__GET__RETRIES": "4"})
    x = dask.delayed(sum)([1, 2, 3])
    assert dask.compute(x, scheduler=shared_manager.get) == (6,)
    assert shared_manager.last_run.options["retries"] == 4


@pytest.mark.integration
def test_dask_reads_yaml_and_environment_at_import_as_for_its_own_config(tmp_path):
    write_yaml(tmp_path, "daskvine_py:\n  get:\n    reduction-arity: 4\n    task_sandbox: true\n")
    env = {
        **os.environ,
        "DASK_CONFIG": str(tmp_path),
        "DASK_DASKVINE_PY__GET__IMPORT_MODULES": '["json"]',
        "DASK_DASKVINE_PY__MANAGER__WORKER_TIMEOUT": "12.5",
    }
    code = (
        "from daskvine_py import config\n"
        "o = config.run_options({'retries': 1})\n"
        "m = config.manager_options(None, None, {})\n"
        "print(o.reduction_arity, o.task_sandbox, o.import_modules, o.retries, m.worker_timeout)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["4", "True", "('json',)", "1", "12.5"]


@pytest.mark.integration
def test_manager_settings_come_from_dask_config_and_arguments_win(dask_config):
    dask_config()
    settings = {
        "daskvine_py.manager.worker_timeout": 12.0,
        "daskvine_py.manager.heartbeat_interval": 2.0,
        "daskvine_py.manager.security": False,
    }
    with dask.config.set(settings):
        with Manager(heartbeat_interval=0.5) as manager:
            assert manager.options.worker_timeout == 12.0
            assert manager.options.heartbeat_interval == 0.5
            assert not manager.options.security
            manager.start_workers(1)
            assert dask.compute(dask.delayed(sum)([1, 2]), scheduler=manager.get) == (3,)


def test_a_config_key_that_is_no_option_is_an_error_naming_it(dask_config):
    dask_config()
    with dask.config.set({"daskvine_py.get.retrys": 5}):
        with pytest.raises(ValueError, match=r"'daskvine_py\.get\.retrys' is not a setting"):
            config.run_options({})
    with dask.config.set({"daskvine_py.retries": 5}):
        with pytest.raises(ValueError, match=r"'daskvine_py\.get\.retries'\?"):
            config.run_options({})
    with dask.config.set({"daskvine_py.get.retries": -2}):
        with pytest.raises(ValueError, match=r"dask\.config 'daskvine_py\.get'.*retries"):
            config.run_options({})
    with dask.config.set({"daskvine_py.manager.worker_timeout": 0.5}):
        with pytest.raises(ValueError, match=r"worker_timeout.*dask\.config"):
            config.manager_options(None, None, {"heartbeat_interval": 1.0})


def test_unknown_arguments_are_still_type_errors(dask_config):
    dask_config()
    with dask.config.set({"daskvine_py.get.retries": 2}):
        with pytest.raises(TypeError, match="unknown option"):
            config.run_options({"retires": 1})
    with pytest.raises(TypeError, match="unknown setting"):
        Manager(heartbeats=3)


def test_scheduler_set_in_dask_config_runs_on_the_manager_across_threads(shared_manager):
    x = da.arange(100, chunks=10).sum()
    (expected,) = dask.compute(x, scheduler="sync")
    before = shared_manager.last_run
    results: list = []
    with dask.config.set({"scheduler": shared_manager.get, "daskvine_py.get.retries": 2}):
        assert x.compute() == expected
        assert shared_manager.last_run is not before
        threads = [threading.Thread(target=lambda: results.append(x.compute())) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert results == [expected] * 4
    assert shared_manager.last_run.options["retries"] == 2
