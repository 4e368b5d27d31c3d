"""Run the Colab notebooks the way a learner meets them, without Colab and without the
repository.

    python tools/colab_sim.py                       # every chapter notebook in _toc.yml
    python tools/colab_sim.py 01_qkv 03_multi_head  # some of them

For each notebook in notebooks/ this

1. snapshots the working tree (tracked and untracked, not ignored files) into a fresh
   git repository on the branch named in _config.yml, and builds a wheel of the package
   from it, checking that every module of src/transformer_course is inside;
2. uses a virtual environment with only what Colab preinstalls that the course or its
   dependencies use (torch, numpy, matplotlib, seaborn, ipywidgets, scikit-learn,
   transformers, ...: PREINSTALLED, and ipykernel to run a kernel), at
   the versions pinned in requirements.txt; it is created once and cached under
   ~/.cache/transformer_course/colab-sim/ keyed on those pins (override the folder with
   $TRANSFORMER_COURSE_COLAB_CACHE), and put back to that state before every notebook;
3. copies the notebook alone into an empty temporary folder outside the repository and
   executes it there with nbclient in that environment, with a fresh HOME. The notebook's
   first cell runs unchanged: its ``pip install "transformer_course @ git+URL@branch"``
   clones the snapshot instead of GitHub because git's ``url.<base>.insteadOf`` is set
   through the GIT_CONFIG_* environment variables of the kernel. (pip cannot be pointed
   at a prebuilt wheel for a direct-URL requirement: --find-links and constraints do not
   replace it, pip still runs ``git clone``; so pip builds the same wheel from the
   snapshot, as it does from GitHub in Colab.)

Prints one line per notebook with its time and exits 1 if any notebook failed, naming
the cell. No GPU, no kernel of this repository's venv, no path into the repository.

A cell that stops making progress (the kernel idle and no message for ``--stall``
seconds while its reply is awaited) fails at once with the notebook, the cell and the
last messages received, instead of waiting out the cell timeout: ``CellStalled``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "transformer_course"
# What Colab preinstalls that the course uses, plus the kernel itself; then what the
# library's dependencies pull in that Colab's image holds too (googlecolab/backend-info,
# pip-freeze.txt), so that a notebook's install cell installs, as in Colab, only what
# Colab lacks (the package itself, sacrebleu, num2words, gguf, the MiniLM checkpoint):
# chapter 2's install cell took 71 s with these installed by it, 17 s without.
PREINSTALLED = [
    *["torch", "numpy", "matplotlib", "seaborn", "ipywidgets", "ipykernel"],
    *["scikit-learn", "scipy", "tqdm", "babel", "graphviz", "tokenizers"],
    *["safetensors", "transformers", "sentence-transformers", "huggingface_hub"],
    *["lxml", "regex", "tabulate", "pyyaml", "requests"],
]
KERNEL = "colab-sim"
# A cell whose kernel has been idle this long, with no message received, while its reply
# is awaited has stalled: a kernel sends "busy" as it takes a request, and a cell here
# runs at most about 100 s, every second of it busy.
STALL_SECONDS = 60
RECENT = 12  # messages a channel remembers for a stall's report
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # colours in IPython tracebacks


def cache_root() -> Path:
    default = Path.home() / ".cache" / PACKAGE / "colab-sim"
    return Path(os.environ.get("TRANSFORMER_COURSE_COLAB_CACHE", default))


def pins() -> list[str]:
    """Exact pins of PREINSTALLED from requirements.txt (name==version)."""
    found = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==([^\s;#]+)", line.strip())
        if m and m[1].lower() in PREINSTALLED:
            found[m[1].lower()] = f"{m[1]}=={m[2]}"
    missing = [p for p in PREINSTALLED if p not in found]
    if missing:
        raise SystemExit(f"requirements.txt: no exact pin for {missing}")
    return [found[p] for p in PREINSTALLED]


def toc_chapters() -> list[str]:
    return re.findall(r"file: book/(\d\d_\w+)", (ROOT / "_toc.yml").read_text())


def repository() -> tuple[str, str]:
    repo = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]
    return repo["url"].rstrip("/"), repo["branch"]


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


# -- 1. the package: a snapshot repository and a wheel ------------------------------------


def snapshot(dest: Path) -> Path:
    """Copy the working tree's tracked and untracked (not ignored) files into a new git
    repository at ``dest`` with one commit on the configured branch."""
    files = _run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT
    ).stdout
    for rel in filter(None, files.split("\0")):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    _, branch = repository()
    git = ["git", "-c", "user.name=colab-sim", "-c", "user.email=colab-sim@localhost"]
    _run([*git, "init", "-q", "-b", branch], cwd=dest)
    _run([*git, "add", "-A"], cwd=dest)
    _run([*git, "commit", "-q", "-m", "snapshot"], cwd=dest)
    return dest


def build_wheel(source: Path, dist: Path) -> Path:
    """Build the package's wheel from ``source`` into ``dist`` and check that it holds
    every module of src/transformer_course. Returns the wheel's path."""
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "-w",
            str(dist),
            str(source),
        ]
    )
    (wheel,) = dist.glob(f"{PACKAGE}-*.whl")
    inside = set(zipfile.ZipFile(wheel).namelist())
    wanted = {
        p.relative_to(source / "src").as_posix()
        for p in (source / "src" / PACKAGE).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    missing = sorted(wanted - inside)
    if missing:
        raise RuntimeError(f"{wheel.name} lacks files of src/{PACKAGE}: {missing}")
    return wheel


# -- 2. the Colab-like environment -----------------------------------------------------


def _freeze(python: Path) -> dict[str, str]:
    out = _run([str(python), "-m", "pip", "list", "--format=json"]).stdout
    return {p["name"].lower(): p["version"] for p in json.loads(out)}


def _pip_install(python: Path, *args: str) -> None:
    """``pip install --no-compile``: Python compiles a module when it is first imported,
    which a notebook does for the few it uses; compiling all of torch, transformers,
    scipy and scikit-learn at install time was most of the environment's build (34 s of
    torch's 35 s here)."""
    _run([str(python), "-m", "pip", "install", "-q", "--no-compile", *args])


def base_venv() -> Path:
    """The cached environment with only PREINSTALLED; created on first use."""
    spec = "\n".join([sys.version.split()[0], *pins()])
    key = hashlib.sha256(spec.encode()).hexdigest()[:12]
    venv = cache_root() / f"venv-{key}"
    python = venv / "bin" / "python"
    if not (venv / "base.json").exists():
        shutil.rmtree(venv, ignore_errors=True)
        print(f"colab-sim: creating {venv} ({', '.join(pins())})", flush=True)
        _run([sys.executable, "-m", "venv", str(venv)])
        _pip_install(python, *pins())
        (venv / "base.json").write_text(json.dumps(_freeze(python), indent=1))
    return venv


def restore(venv: Path) -> None:
    """Put ``venv`` back to its cached state: remove what a notebook installed."""
    python = venv / "bin" / "python"
    base = json.loads((venv / "base.json").read_text())
    now = _freeze(python)
    extra = sorted(n for n in now if n not in base)
    if extra:
        _run([str(python), "-m", "pip", "uninstall", "-q", "-y", *extra])
    changed = [f"{n}=={base[n]}" for n in base if now.get(n) not in (None, base[n])]
    if changed:
        _pip_install(python, "--no-deps", *changed)


# -- 3. one notebook, alone in an empty folder ----------------------------------------------


@dataclass
class Result:
    notebook: str
    ok: bool
    seconds: float
    error: str = ""
    printed: str = ""  # what the cells printed (their stream outputs), in order
    cells: list[tuple[int, float]] = field(default_factory=list)  # cell_seconds


def cell_seconds(nb) -> list[tuple[int, float]]:
    """(index, seconds) of each executed code cell of ``nb``, from the timing nbclient
    records in its metadata (from the kernel taking the code to its reply); the run's
    other seconds went to starting and stopping the kernel."""
    found = []
    for i, cell in enumerate(nb.cells):
        timing = cell.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" in timing and "shell.execute_reply" in timing:
            start = datetime.fromisoformat(timing["iopub.execute_input"])
            end = datetime.fromisoformat(timing["shell.execute_reply"])
            found.append((i, (end - start).total_seconds()))
    return found


def printed_text(nb) -> str:
    """The text every code cell of an executed notebook printed, in order."""
    return "".join(
        output.get("text", "")
        for cell in nb.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.get("output_type") == "stream"
    )


def kernel_env(venv: Path, home: Path, repo_snapshot: Path) -> dict[str, str]:
    url, _ = repository()
    env = {
        "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "VIRTUAL_ENV": str(venv),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_CACHE_DIR": str(cache_root() / "pip"),
        # git clone <url> reads the snapshot instead (the cell's text is unchanged).
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": f"url.{repo_snapshot.as_uri()}.insteadOf",
        "GIT_CONFIG_VALUE_0": url,
    }
    for name in ("TMPDIR", "OMP_NUM_THREADS", "SSL_CERT_FILE"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


class CellStalled(RuntimeError):
    """A cell made no progress: its kernel idle, no message received, its reply awaited."""


class _AsyncSend:
    """What ``Session.send`` sends through: the asyncio socket's own send.

    Given a ``zmq.asyncio.Socket``, ``Session.send`` sends on a blocking shadow of it
    (jupyter_client/session.py), behind pyzmq's back. libzmq signals a socket's events
    on one edge-triggered file descriptor that any send or receive on the socket drains;
    pyzmq's asyncio socket re-reads the events after its own sends, never after the
    shadow's. So a send on the shell channel while nbclient awaits the reply on it (the
    Output widget nbclient mimics sends one comm_msg for every output a live
    ``interactive`` view displays into it) can drain the edge that the reply, arrived a
    moment before, raised: the reply waits unread until the poll times out, the cell
    timeout, 900 s (jupyter/nbclient#312; the same fault on the kernel's side was
    ipython/ipykernel#1554, fixed by sending through the stream). This sends through
    the asyncio socket, which re-arms its waiting poll when it sends."""

    def __init__(self, socket):
        self.socket = socket

    def send_multipart(self, parts, **kwargs):
        sent = self.socket.send_multipart(parts, **kwargs)
        if sent.done() and sent.exception() is not None:
            raise sent.exception()  # as the blocking send would (queued sends: later)
        return sent


@functools.cache
def _channel_class():
    """The kernel client's channel: sends through the asyncio socket (``_AsyncSend``)
    and remembers the last ``RECENT`` messages it received, with their times."""
    from jupyter_client.channels import AsyncZMQSocketChannel

    class Channel(AsyncZMQSocketChannel):
        def __init__(self, socket, session, loop=None):
            super().__init__(socket, session, loop)
            self.received = collections.deque(maxlen=RECENT)  # (monotonic s, msg)

        def send(self, msg):
            self.session.send(_AsyncSend(self.socket), msg)

        async def _recv(self, **kwargs):
            msg = await super()._recv(**kwargs)
            self.received.append((time.monotonic(), _summary(msg)))
            return msg

    return Channel


def _summary(msg) -> dict:
    content = msg.get("content") or {}
    parent = msg.get("parent_header") or {}
    return {
        "msg_type": msg.get("msg_type") or msg.get("header", {}).get("msg_type"),
        "state": content.get("execution_state"),
        "parent": parent.get("msg_type"),
        "parent_id": parent.get("msg_id"),
    }


@functools.cache
def _client_class():
    """nbclient's NotebookClient with a watchdog beside each cell: when the kernel has
    been idle (its last status message said so) and no message has come on the shell or
    IOPub channel for ``stall_timeout`` seconds while the cell's reply is awaited, the
    cell fails with ``CellStalled``, naming the notebook, the cell and the last messages
    received. A busy kernel is never stalled, however long its cell runs (the cell
    timeout is for that). The watchdog replaces nbclient's own check that the kernel is
    alive, which nbclient runs beside each cell every second and cancels once the reply
    has come, and stops the cell the way a dead kernel does."""
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError
    from traitlets import Float, Unicode

    class WatchedNotebookClient(NotebookClient):
        stall_timeout = Float(
            STALL_SECONDS,
            allow_none=True,
            help="seconds of an idle kernel and no message before a cell has stalled "
            "(None: no watchdog)",
        ).tag(config=True)
        notebook_name = Unicode("", help="the notebook's name, for a stall's report")

        _pending = None  # (cell, index, monotonic time its request was sent)
        _stall = None  # the CellStalled of the cell being run

        async def async_execute_cell(self, cell, cell_index, *args, **kwargs):
            self._pending, self._stall = (cell, cell_index, time.monotonic()), None
            try:
                return await super().async_execute_cell(
                    cell, cell_index, *args, **kwargs
                )
            except DeadKernelError:
                if self._stall is not None:
                    raise self._stall from None
                raise
            finally:
                self._pending = None

        async def _async_poll_kernel_alive(self):
            while True:
                await asyncio.sleep(1)
                try:
                    await self._async_check_alive()
                    self._stall = self._stalled()
                except DeadKernelError:
                    pass
                else:
                    if self._stall is None:
                        continue
                self.task_poll_for_reply.cancel()  # nbclient: DeadKernelError
                return

        def _stalled(self) -> CellStalled | None:
            if self.stall_timeout is None or self._pending is None:
                return None
            cell, index, sent = self._pending
            channels = {"shell": self.kc.shell_channel, "iopub": self.kc.iopub_channel}
            heard = sorted(
                (
                    (t, name, m)
                    for name, ch in channels.items()
                    for t, m in getattr(ch, "received", ())  # a stock channel: none
                ),
                key=lambda heard: heard[0],
            )
            states = [m["state"] for _, name, m in heard if m["msg_type"] == "status"]
            state = states[-1] if states else "unknown"
            now = time.monotonic()
            quiet = now - max([sent, *(t for t, _, _ in heard)])
            if state == "busy" or quiet < self.stall_timeout:
                return None
            import zmq

            waiting = self.kc.shell_channel.socket.get(zmq.EVENTS) & zmq.POLLIN
            head = "\n".join(cell.source.splitlines()[:3])
            lines = [
                f"{self.notebook_name or 'notebook'}: cell {index} made no progress for "
                f"{quiet:.0f} s: the kernel's last status {state}, no message came "
                "while its reply was awaited; "
                + (
                    "a message waits unread on the shell socket (the client was not "
                    "woken for it)"
                    if waiting
                    else "none waits on the shell socket (the kernel did not answer)"
                ),
                "cell source:",
                *(f"    {line}" for line in head.splitlines()),
                (
                    f"last messages received ({len(heard[-RECENT:])}; s before now, "
                    "channel, type, state, parent):"
                ),
                *(
                    f"    {now - t:7.1f} {name:5} {m['msg_type']} {m['state'] or ''} "
                    f"<- {m['parent']} {(m['parent_id'] or '')[-8:]}"
                    for t, name, m in heard[-RECENT:]
                ),
            ]
            return CellStalled("\n".join(lines))

    return WatchedNotebookClient


@functools.cache  # one class (and one shared context) per process
def _manager_class():
    """A kernel manager whose clients share one zmq context, made once in this process
    and never terminated. jupyter_client's own client terminates the context it made
    when its channels stop, and that ``Context.term()`` now and then waits forever
    (jupyter/jupyter_client#771, "occasional client hangs on shutdown"; seen here: a
    run of chapter 3 stuck 15 minutes in nbclient's clean-up after its last cell). The
    channels still close their sockets (linger 0) when they stop; they are
    ``_channel_class()``'s (sends that keep a waiting poll awake, recent messages for a
    stall's report). nbclient makes the manager from this class, so it still shuts the
    kernel down after the notebook."""
    import zmq.asyncio
    from jupyter_client.asynchronous.client import AsyncKernelClient
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import Type, default

    shared = zmq.asyncio.Context()

    class SharedContextClient(AsyncKernelClient):
        shell_channel_class = Type(_channel_class())
        iopub_channel_class = Type(_channel_class())
        control_channel_class = Type(_channel_class())

        @default("context")
        def _shared_context(self):
            return shared  # _created_context stays False: stop_channels keeps it

    class SharedContextManager(AsyncKernelManager):
        @default("client_factory")
        def _shared_context_client(self):
            return SharedContextClient

    return SharedContextManager


def execute_notebook(
    nb,
    python: Path,
    work: Path,
    env: dict[str, str],
    *,
    timeout: int = 900,
    stall: float | None = STALL_SECONDS,
    name: str = "",
):
    """Execute ``nb`` (in place) in ``work`` with a kernel of the interpreter ``python``
    started with the environment ``env``, each cell under the ``stall`` watchdog
    (``_client_class``; None: none) and the cell ``timeout`` (seconds).

    Raises:
        CellStalled: a cell made no progress for ``stall`` seconds, its kernel idle.
        nbclient.exceptions.CellExecutionError: a cell raised.
        nbclient.exceptions.CellTimeoutError: a cell ran past ``timeout``.
    """
    with tempfile.TemporaryDirectory(prefix="colab-sim-kernel-") as specs:
        spec = Path(specs) / "kernels" / KERNEL
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(
            json.dumps(
                {
                    "argv": [
                        str(python),
                        "-m",
                        "ipykernel_launcher",
                        "-f",
                        "{connection_file}",
                    ],
                    "display_name": "Colab simulation",
                    "language": "python",
                }
            )
        )
        old_path = os.environ.get("JUPYTER_PATH")
        os.environ["JUPYTER_PATH"] = specs
        try:
            client = _client_class()(
                nb,
                kernel_manager_class=_manager_class(),
                timeout=timeout,
                stall_timeout=stall,
                notebook_name=name,
                kernel_name=KERNEL,
                resources={"metadata": {"path": str(work)}},
            )
            client.execute(env=env)
        finally:
            if old_path is None:
                os.environ.pop("JUPYTER_PATH", None)
            else:
                os.environ["JUPYTER_PATH"] = old_path
    return nb


def run_notebook(
    notebook: Path,
    venv: Path,
    repo_snapshot: Path,
    *,
    timeout: int = 900,
    stall: float | None = STALL_SECONDS,
) -> Result:
    """Execute ``notebook`` alone in an empty temporary folder with the kernel of
    ``venv`` (restored to its base state first)."""
    from nbclient.exceptions import CellExecutionError

    restore(venv)
    with tempfile.TemporaryDirectory(prefix="colab-sim-") as tmp:
        tmp = Path(tmp)
        work, home = tmp / "content", tmp / "home"
        for d in (work, home):
            d.mkdir(parents=True)
        target = work / notebook.name
        shutil.copy2(notebook, target)
        nb = nbformat.read(target, as_version=4)
        start = time.perf_counter()
        try:
            execute_notebook(
                nb,
                venv / "bin" / "python",
                work,
                kernel_env(venv, home, repo_snapshot),
                timeout=timeout,
                stall=stall,
                name=notebook.name,
            )
            seconds = time.perf_counter() - start
            return Result(
                notebook.name,
                True,
                seconds,
                printed=printed_text(nb),
                cells=cell_seconds(nb),
            )
        except CellExecutionError as err:
            text = _ANSI.sub("", str(err))
            return Result(
                notebook.name, False, time.perf_counter() - start, text[-3000:]
            )
        except Exception as err:  # noqa: BLE001 (timeouts, stalls, dead kernel: report them)
            return Result(
                notebook.name,
                False,
                time.perf_counter() - start,
                f"{type(err).__name__}: {err}"[-3000:],
            )


class Simulation:
    """The snapshot repository, its wheel and the base environment, made once."""

    def __init__(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="colab-sim-repo-")
        tmp = Path(self._tmp.name)
        self.repo = snapshot(tmp / "repo")
        self.wheel = build_wheel(self.repo, tmp / "dist")
        self.venv = base_venv()

    def run(self, notebook: Path, **kw) -> Result:
        return run_notebook(notebook, self.venv, self.repo, **kw)

    def close(self):
        self._tmp.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("chapters", nargs="*", help="e.g. 01_qkv (default: the toc's)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    parser.add_argument(
        "--stall",
        type=float,
        default=STALL_SECONDS,
        help="seconds of an idle kernel and no message before a cell has stalled",
    )
    args = parser.parse_args(argv)
    names = args.chapters or toc_chapters()
    start = time.perf_counter()
    sim = Simulation()
    print(f"colab-sim: {sim.wheel.name} built, environment {sim.venv}", flush=True)
    failed = []
    try:
        for name in names:
            result = sim.run(
                ROOT / "notebooks" / f"{name}.ipynb",
                timeout=args.timeout,
                stall=args.stall,
            )
            print(
                f"{name}: {'ok' if result.ok else 'FAILED'} in {result.seconds:.0f} s",
                flush=True,
            )
            if not result.ok:
                failed.append(name)
                print(result.error, file=sys.stderr)
    finally:
        sim.close()
    print(
        f"colab-sim: {len(names) - len(failed)}/{len(names)} notebooks ran in "
        f"{time.perf_counter() - start:.0f} s"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
