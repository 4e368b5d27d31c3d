"""get_device / set_seed."""

import random

import pytest
import torch

from transformer_course import get_device, set_seed
from transformer_course.device import ENV_VAR


def test_cpu_when_nothing_else(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert get_device() == torch.device("cpu")


def test_cuda_preferred_when_available(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert get_device() == torch.device("cuda")


def test_environment_overrides(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv(ENV_VAR, "cpu")
    assert get_device() == torch.device("cpu")
    assert get_device("cuda") == torch.device("cpu")


def test_unknown_and_unavailable_devices(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    with pytest.raises(ValueError, match="tpu"):
        get_device("tpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="cuda"):
        get_device("cuda")


def test_set_seed_repeats_every_generator():
    set_seed(7)
    a = (random.random(), torch.rand(3))
    set_seed(7)
    b = (random.random(), torch.rand(3))
    assert a[0] == b[0] and torch.equal(a[1], b[1])
    set_seed(8)
    assert not torch.equal(torch.rand(3), a[1])
    with pytest.raises(TypeError, match="seed"):
        set_seed(1.5)


def test_set_cpu_threads_order(monkeypatch):
    from transformer_course import set_cpu_threads
    from transformer_course.device import cpu_cores

    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        choice = set_cpu_threads()
        assert choice == (1, cpu_cores(), "OMP_NUM_THREADS")
        assert torch.get_num_threads() == 1
        assert set_cpu_threads(2).reason == "argument"  # an argument wins
        assert torch.get_num_threads() == 2
        monkeypatch.delenv("OMP_NUM_THREADS")
        monkeypatch.setattr("os.getloadavg", lambda: (1e6, 0.0, 0.0))
        assert set_cpu_threads() == (1, cpu_cores(), "busy")
        assert "busy" in str(set_cpu_threads())
        monkeypatch.setattr("os.getloadavg", lambda: (0.0, 0.0, 0.0))
        assert set_cpu_threads() == (cpu_cores(), cpu_cores(), "cores")
        assert "busy" not in str(set_cpu_threads())
    finally:
        torch.set_num_threads(before)


def test_set_cpu_threads_rejects_bad_input(monkeypatch):
    from transformer_course import set_cpu_threads

    before = torch.get_num_threads()
    with pytest.raises(TypeError, match="threads"):
        set_cpu_threads(1.5)
    with pytest.raises(ValueError, match="threads"):
        set_cpu_threads(0)
    monkeypatch.setenv("OMP_NUM_THREADS", "two")
    with pytest.raises(ValueError, match="OMP_NUM_THREADS"):
        set_cpu_threads()
    assert torch.get_num_threads() == before  # nothing set on bad input
