"""Which engine the reference trainer picks: the simulation only where torch is not installed.

Why: a torch job whose rank fell back to the simulation (torch failing to load, or a SIGTERM while it
loaded) wrote simulation checkpoints beside torch's, and every later resume of the job refused them.
"""

from __future__ import annotations

import importlib
from dataclasses import replace
from pathlib import Path

import pytest
from reference_trainer import engines
from reference_trainer.config import Terminated

from tests.trainer.test_advanced_example_settings import example_config


def importing_raises(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    def import_module(name: str) -> object:
        assert name == "torch"
        raise error

    monkeypatch.setattr(importlib, "import_module", import_module)


def test_torch_not_installed_is_the_simulation_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    importing_raises(monkeypatch, ModuleNotFoundError("No module named 'torch'", name="torch"))
    reason = engines.why_simulate(example_config(tmp_path))
    assert "torch is not importable" in str(reason)
    assert isinstance(engines.make_engine(example_config(tmp_path)), engines.SimulationEngine)


@pytest.mark.parametrize(
    "error",
    [
        OSError("libtorch_cpu.so: failed to map segment from shared object"),
        ModuleNotFoundError("No module named 'numpy'", name="numpy"),  # a dependency of torch
        ImportError("libgomp.so.1: cannot open shared object file"),
    ],
)
def test_torch_installed_but_not_loading_fails_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    importing_raises(monkeypatch, error)
    with pytest.raises(
        engines.TorchBroken, match=f"torch is installed but failed to import: {type(error).__name__}"
    ):
        engines.make_engine(example_config(tmp_path))


def test_a_sigterm_while_torch_loads_ends_the_run_as_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    importing_raises(monkeypatch, Terminated("SIGTERM"))
    with pytest.raises(Terminated):
        engines.make_engine(example_config(tmp_path))


def test_train_simulate_needs_no_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    importing_raises(monkeypatch, AssertionError("torch must not be imported"))
    config = replace(example_config(tmp_path), simulate=True)
    assert isinstance(engines.make_engine(config), engines.SimulationEngine)
