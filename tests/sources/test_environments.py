"""The two tested environments agree with what the package declares: requirements.txt pins
the torch of every tier, requirements-torch-floor.txt the lowest torch that
pyproject.toml admits (``make test-floor`` runs the fast tier on it), so the declared
floor is the tested one."""

from __future__ import annotations

import re
from pathlib import Path

from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PIN = re.compile(r"([A-Za-z0-9_.-]+)==([^\s#]+)")


def pins(text: str) -> dict[str, str]:
    """{name: version} of a requirements file's ``name==version`` lines."""
    found = {}
    for line in text.splitlines():
        match = PIN.match(line.strip())
        if match:
            found[match.group(1).lower()] = match.group(2)
    return found


def floor_problems(pyproject: str, floor: str, requirements: str) -> list[str]:
    """What makes the floor environment not the declared floor: pyproject's
    ``torch>=X`` must be the floor file's ``torch==X``, and every other pin there
    either replaces one of requirements.txt or is a dependency torch names."""
    problems = []
    declared = re.search(r'"torch>=([^"]+)"', pyproject)
    floor_pins, full = pins(floor), pins(requirements)
    if declared is None:
        problems.append("pyproject.toml declares no torch>=X")
    elif Version(floor_pins.get("torch", "0")) != Version(declared.group(1)):
        problems.append(
            f"pyproject.toml declares torch>={declared.group(1)}, "
            f"requirements-torch-floor.txt pins torch=={floor_pins.get('torch')}"
        )
    if full.get("torch") == floor_pins.get("torch"):
        problems.append("the floor pins the same torch as requirements.txt")
    for name in floor_pins:
        if name not in full and name not in ("torch", "triton", "sympy"):
            problems.append(f"{name}: pinned for the floor, not in requirements.txt")
    return problems


def test_the_floor_environment_is_the_declared_floor():
    texts = [
        (ROOT / name).read_text()
        for name in (
            "pyproject.toml",
            "requirements-torch-floor.txt",
            "requirements.txt",
        )
    ]
    assert floor_problems(*texts) == []


def test_a_floor_that_is_not_the_declared_one_is_rejected():
    pyproject = '"torch>=2.5",'
    requirements = "torch==2.13.0\nnumpy==2.4.6\n"
    assert floor_problems(pyproject, "torch==2.6.0\n", requirements) == [
        "pyproject.toml declares torch>=2.5, "
        + "requirements-torch-floor.txt pins torch==2.6.0"
    ]
    assert floor_problems(
        '"torch>=2.6",', "torch==2.6.0\nnumpi==1.0\n", requirements
    ) == ["numpi: pinned for the floor, not in requirements.txt"]
    assert floor_problems('"torch>=2.13.0",', "torch==2.13.0\n", requirements) == [
        "the floor pins the same torch as requirements.txt"
    ]
    assert floor_problems("", "torch==2.6.0\n", requirements) == [
        "pyproject.toml declares no torch>=X"
    ]
