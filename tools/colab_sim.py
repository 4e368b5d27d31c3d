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
"""

from __future__ import annotations

import argparse
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


@functools.cache  # one class (and one shared context) per process
def _manager_class():
    """A kernel manager whose clients share one zmq context, made once in this process
    and never terminated. jupyter_client's own client terminates the context it made
    when its channels stop, and that ``Context.term()`` now and then waits forever
    (jupyter/jupyter_client#771, "occasional client hangs on shutdown"; seen here: a
    run of chapter 3 stuck 15 minutes in nbclient's clean-up after its last cell). The
    channels still close their sockets (linger 0) when they stop. nbclient makes the
    manager from this class, so it still shuts the kernel down after the notebook."""
    import zmq.asyncio
    from jupyter_client.asynchronous.client import AsyncKernelClient
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import default

    shared = zmq.asyncio.Context()

    class SharedContextClient(AsyncKernelClient):
        @default("context")
        def _shared_context(self):
            return shared  # _created_context stays False: stop_channels keeps it

    class SharedContextManager(AsyncKernelManager):
        @default("client_factory")
        def _shared_context_client(self):
            return SharedContextClient

    return SharedContextManager


def run_notebook(
    notebook: Path, venv: Path, repo_snapshot: Path, *, timeout: int = 900
) -> Result:
    """Execute ``notebook`` alone in an empty temporary folder with the kernel of
    ``venv`` (restored to its base state first)."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    restore(venv)
    with tempfile.TemporaryDirectory(prefix="colab-sim-") as tmp:
        tmp = Path(tmp)
        work, home, kernels = tmp / "content", tmp / "home", tmp / "jupyter" / "kernels"
        for d in (work, home, kernels / KERNEL):
            d.mkdir(parents=True)
        (kernels / KERNEL / "kernel.json").write_text(
            json.dumps(
                {
                    "argv": [
                        str(venv / "bin" / "python"),
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
        target = work / notebook.name
        shutil.copy2(notebook, target)
        nb = nbformat.read(target, as_version=4)
        old_path = os.environ.get("JUPYTER_PATH")
        os.environ["JUPYTER_PATH"] = str(tmp / "jupyter")
        client = NotebookClient(
            nb,
            kernel_manager_class=_manager_class(),
            timeout=timeout,
            kernel_name=KERNEL,
            resources={"metadata": {"path": str(work)}},
        )
        start = time.perf_counter()
        try:
            client.execute(env=kernel_env(venv, home, repo_snapshot))
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
        except Exception as err:  # noqa: BLE001 (timeouts, dead kernel: report them)
            return Result(
                notebook.name,
                False,
                time.perf_counter() - start,
                f"{type(err).__name__}: {err}"[-3000:],
            )
        finally:
            if old_path is None:
                os.environ.pop("JUPYTER_PATH", None)
            else:
                os.environ["JUPYTER_PATH"] = old_path


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
    args = parser.parse_args(argv)
    names = args.chapters or toc_chapters()
    start = time.perf_counter()
    sim = Simulation()
    print(f"colab-sim: {sim.wheel.name} built, environment {sim.venv}", flush=True)
    failed = []
    try:
        for name in names:
            result = sim.run(ROOT / "notebooks" / f"{name}.ipynb", timeout=args.timeout)
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
