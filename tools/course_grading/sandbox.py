"""Run learner code in a bubblewrap sandbox (https://github.com/containers/bubblewrap).

Inside (backend "bwrap") the file system holds only what the run needs, every part
read-only: the system's programs and libraries (/usr and its links /bin, /lib, ...), a few
files of /etc (the loader's cache, the time zone, fonts; a one-line passwd and group of its
own), /sys, the Python environment (a virtual environment appears at ``VENV_MOUNT``, so no
instructor path is needed to reach it), the course library and these tools (at
``LIB_MOUNT``); a fresh tmpfs at /tmp; one writable working folder (the submission's own,
empty but for what the run needs). Nothing else of the machine exists inside: not the
repository, the instructor's home, the submissions, the assignments, any results folder or
earlier grades, nor other users' files (folders given in ``hide`` that lie under one of
the bound ones are emptied too). No network (own network namespace: only its own
loopback); own PID namespace (it sees only its own processes, and all of them die with the
run: ``--die-with-parent``); no capabilities; a clean environment whose PATH names only the
sandbox's own folders; a memory limit per process (``prlimit --as``). bwrap reads its
arguments from a file descriptor (``--args``), so its command line, which a submission can
read as /proc/1/cmdline, is ``bwrap --args 3`` and names no path. The time limit is the
caller's (``grade._run_limited`` kills the whole process group).

Backend "none" runs the same command unconfined except for the memory limit; "auto"
picks bwrap when it works here and otherwise refuses (``SandboxUnavailable``).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

BACKENDS = ("auto", "bwrap", "none")
LIB_MOUNT = "/tmp/.course-lib"  # where the library and these tools appear inside
VENV_MOUNT = "/tmp/.course-venv"  # where a virtual environment appears inside
# The system's folders bound as they are (or, when a link such as /bin -> usr/bin, linked).
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/sys")
# The files of /etc that programs read to start (the rest of /etc stays outside).
ETC = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/nsswitch.conf",
    "/etc/alternatives",
    "/etc/fonts",
    "/etc/mime.types",
    "/etc/hosts",
)
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
        """A clean environment: nothing of the instructor's variables but the locale,
        the thread counts and ``TRANSFORMER_COURSE_LANG`` (the language of the self-check
        feedback: ``TRANSFORMER_COURSE_LANG=zh make grade`` gives Chinese feedback), and
        PATH (under bwrap, one of the sandbox's own folders instead).
        HOME is ``work/home``, empty (so what the learner's code writes to ~ is seen and
        flagged, and never reaches the instructor's home)."""
        packages = _packages()
        pythonpath = (
            LIB_MOUNT
            if self.backend == "bwrap"
            else os.pathsep.join(sorted({str(p.parent) for p in packages.values()}))
        )
        env = {k: v for k, v in os.environ.items() if k in PASSED_THROUGH}
        if self.backend == "bwrap":  # the instructor's PATH would name their folders
            env["PATH"] = os.pathsep.join(
                [str(Path(self.inside(sys.executable)).parent), "/usr/local/bin"]
                + ["/usr/bin", "/bin"]
            )
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

    def _venv(self) -> Path | None:
        """The virtual environment this Python runs in (None outside one)."""
        prefix = Path(sys.prefix)
        return prefix if sys.prefix != sys.base_prefix else None

    def inside(self, path: str) -> str:
        """Where ``path`` (of this Python's environment) is inside the sandbox."""
        venv = self._venv()
        if self.backend == "bwrap" and venv is not None and _under(Path(path), venv):
            return str(Path(VENV_MOUNT) / Path(path).relative_to(venv))
        return path

    def command(self, cmd: list[str], work: Path) -> list[str]:
        """``cmd`` wrapped: run with cwd ``work`` (writable) under this sandbox. For
        bwrap its arguments go into a file beside ``work`` (outside the sandbox), read
        through ``--args``."""
        limit = []
        if shutil.which("prlimit"):
            limit = ["prlimit", f"--as={self.memory_mb * 2**20}", "--core=0", "--"]
        if self.backend == "none":
            return limit + cmd
        work = work.resolve()
        args = ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
        bound: list[Path] = []
        for name in SYSTEM:
            path = Path(name)
            if path.is_symlink():
                args += ["--symlink", os.readlink(path), name]
            elif path.is_dir():
                args += ["--ro-bind", name, name]
                bound.append(path)
        for name in ETC:
            if os.path.lexists(name):
                args += ["--ro-bind", name, name]
        private = work.parent / f".sandbox-{work.name}"  # never visible inside
        private.mkdir(exist_ok=True)
        (private / "passwd").write_text(
            f"learner:x:{os.getuid()}:{os.getgid()}:learner:{work / HOME}:/bin/sh\n"
        )
        (private / "group").write_text(f"learner:x:{os.getgid()}:\n")
        args += ["--ro-bind", str(private / "passwd"), "/etc/passwd"]
        args += ["--ro-bind", str(private / "group"), "/etc/group"]
        venv = self._venv()
        python = {Path(sys.base_prefix), Path(sys.executable).resolve().parent}
        for p in sorted(python, key=lambda p: len(p.parts)):
            real = p.resolve()
            if any(_under(real, b) for b in bound) or not real.is_dir():
                continue
            if len(real.parts) < 3:  # "/" or "/opt" whole would bind others' files
                raise SandboxUnavailable(
                    f"Python lives in {real}: bind a folder of its own instead"
                )
            args += ["--ro-bind", str(real), str(real)]
            bound.append(real)
        if venv is not None:
            args += ["--ro-bind", str(venv.resolve()), VENV_MOUNT]
        hidden = sorted(
            {Path(h).resolve() for h in self.hide} | {Path.home().resolve()},
            key=lambda p: len(p.parts),
        )
        for h in hidden:  # a folder of the instructor's that lies in a bound one
            inside = (
                h.is_dir() and len(h.parts) > 1 and any(_under(h, b) for b in bound)
            )
            if inside and not any(_under(b, h) for b in bound if b != h):
                args += ["--tmpfs", str(h), "--remount-ro", str(h)]
        for name, path in _packages().items():
            args += ["--ro-bind", str(path), f"{LIB_MOUNT}/{name}"]
        args += ["--bind", str(work), str(work), "--remount-ro", "/"]
        args += ["--remount-ro", "/tmp"]
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
        inner = [self.inside(cmd[0]), *cmd[1:]] if cmd else cmd
        (private / "args").write_bytes(b"".join(a.encode() + b"\0" for a in args))
        bwrap = shutil.which("bwrap") or "bwrap"
        # the options (with every path) come from the file; the command line shows only
        # the command, which names paths inside the sandbox
        script = f'exec "$0" --args 3 "$@" 3<{shlex.quote(str(private / "args"))}'
        return ["/bin/sh", "-c", script, bwrap, "--", *limit, *inner]
