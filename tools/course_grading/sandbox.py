"""Run learner code in a bubblewrap sandbox (https://github.com/containers/bubblewrap).

Inside (backend "bwrap"): the whole filesystem read-only; the repository, the instructor's
home, /tmp, the submissions, the assignments and the results folder replaced by empty
read-only folders; one writable working folder (the submission's own, empty but for what
the run needs); the Python environment, the course library and these tools read-only; no
network (own network namespace: only its own loopback); own PID namespace (it sees only
its own processes, and all of them die with the run: ``--die-with-parent``); no
capabilities; a clean environment; a memory limit per process (``prlimit --as``). The
time limit is the caller's (``grade._run_limited`` kills the whole process group).

Backend "none" runs the same command unconfined except for the memory limit; "auto"
picks bwrap when it works here and otherwise refuses (``SandboxUnavailable``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

BACKENDS = ("auto", "bwrap", "none")
LIB_MOUNT = "/tmp/.course-lib"  # where the library and these tools appear inside
HOME = "home"  # ~ inside: an empty scratch folder in the working folder (writes are flagged)
INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: `sudo apt-get install bubblewrap`, "
    "Fedora: `sudo dnf install bubblewrap`), or pass `--sandbox none` to grade "
    "without a sandbox (only for submissions you trust)"
)


class SandboxUnavailable(RuntimeError):
    """No sandbox backend can run here (the message says why and what to install)."""


def bwrap_problem() -> str | None:
    """Why bubblewrap cannot run here, or None when it can."""
    exe = shutil.which("bwrap")
    if exe is None:
        return "bwrap is not installed"
    probe = subprocess.run(
        [
            exe,
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--unshare-net",
            "--unshare-pid",
            "--die-with-parent",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if probe.returncode != 0:
        return f"bwrap is installed but cannot create namespaces here: {probe.stderr.strip()}"
    return None


def choose(requested: str) -> str:
    """The backend to use for ``--sandbox requested``; raises ``SandboxUnavailable``."""
    if requested not in BACKENDS:
        raise ValueError(
            f"--sandbox must be one of {', '.join(BACKENDS)}, got {requested!r}"
        )
    if requested == "none":
        return "none"
    problem = bwrap_problem()
    if problem is None:
        return "bwrap"
    raise SandboxUnavailable(
        f"no sandbox for untrusted code: {problem}; {INSTALL_HINT}"
    )


def _packages() -> dict[str, Path]:
    import transformer_course

    return {
        "transformer_course": Path(transformer_course.__file__).resolve().parent,
        "course_grading": Path(__file__).resolve().parent,
    }


def _under(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


# The only variables of the instructor's environment that learner code sees.
PASSED_THROUGH = (
    "PATH",
    "LANG",
    "LC_ALL",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "TRANSFORMER_COURSE_LANG",
)


@dataclass
class Sandbox:
    """How to run one command of learner code; JSON-serialisable (``to_json``)."""

    backend: str  # "bwrap" or "none"
    hide: list[str] = field(default_factory=list)  # folders that appear empty inside
    memory_mb: int = 4096  # address-space limit of each process (RLIMIT_AS)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Sandbox:
        return cls(**json.loads(text))

    def env(self, work: Path) -> dict[str, str]:
        """A clean environment: nothing of the instructor's variables but PATH, the locale,
        the thread counts and ``TRANSFORMER_COURSE_LANG`` (the language of the self-check
        feedback: ``TRANSFORMER_COURSE_LANG=zh make grade`` gives Chinese feedback).
        HOME is ``work/home``, empty (so what the learner's code writes to ~ is seen and
        flagged, and never reaches the instructor's home)."""
        packages = _packages()
        pythonpath = (
            LIB_MOUNT
            if self.backend == "bwrap"
            else os.pathsep.join(sorted({str(p.parent) for p in packages.values()}))
        )
        env = {k: v for k, v in os.environ.items() if k in PASSED_THROUGH}
        env.update(
            HOME=str(work / HOME),
            TMPDIR=str(work / ".tmp"),
            MPLCONFIGDIR=str(work / ".mpl"),
            PYTHONPATH=pythonpath,
            PYTHONDONTWRITEBYTECODE="1",
            MPLBACKEND="Agg",
        )
        (work / ".tmp").mkdir(exist_ok=True)
        (work / HOME).mkdir(exist_ok=True)
        return env

    def command(self, cmd: list[str], work: Path) -> list[str]:
        """``cmd`` wrapped: run with cwd ``work`` (writable) under this sandbox."""
        limit = []
        if shutil.which("prlimit"):
            limit = ["prlimit", f"--as={self.memory_mb * 2**20}", "--core=0", "--"]
        if self.backend == "none":
            return limit + cmd
        work = work.resolve()
        hidden = sorted(
            {Path(h).resolve() for h in self.hide} | {Path.home().resolve()},
            key=lambda p: len(p.parts),
        )
        hidden = [
            h
            for h in hidden
            if h.is_dir() and len(h.parts) > 1 and not _under(h, Path("/tmp"))
        ]
        args = [
            "bwrap",
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--tmpfs",
            "/tmp",
        ]
        for h in hidden:
            args += ["--tmpfs", str(h)]
        python = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).parent}
        for p in sorted(python, key=lambda p: len(p.parts)):
            if any(_under(p, h) for h in [*hidden, Path("/tmp")]):
                args += ["--ro-bind", str(p.resolve()), str(p)]
        for name, path in _packages().items():
            args += ["--ro-bind", str(path), f"{LIB_MOUNT}/{name}"]
        args += ["--bind", str(work), str(work)]
        for h in [Path("/tmp"), *hidden]:
            args += ["--remount-ro", str(h)]
        args += [
            "--unshare-net",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--die-with-parent",
            "--new-session",
            "--chdir",
            str(work),
        ]
        if os.geteuid() == 0:
            args += ["--cap-drop", "ALL"]
        args += ["--clearenv"]
        for key, value in self.env(work).items():
            args += ["--setenv", key, value]
        return args + ["--"] + limit + cmd
