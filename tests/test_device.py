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
