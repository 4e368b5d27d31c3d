"""Set-up steps only CI knew (issue 12, item 6; issue 28, item 11): on a machine without
chromium or bubblewrap, the README's `make test` installs them (root or passwordless
sudo) or stops at once with one line saying what to install. tools/ensure_browser.sh and
tools/ensure_sandbox.sh are run here with a PATH of stub commands (id, sudo, apt-get), so
nothing is installed or removed for real."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "ensure_browser.sh"
SANDBOX_SCRIPT = ROOT / "tools" / "ensure_sandbox.sh"
BASH = "/bin/bash"


def _stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!{BASH}\n{body}\n")
    path.chmod(0o755)


def _machine(
    tmp_path: Path,
    *,
    uid: int,
    sudo: str | None,
    apt: bool,
    chromium: bool = False,
    font: bool = False,
):
    """A fake machine: stub commands on PATH; apt-get logs its arguments and, on
    install, creates the chromium and font files (DejaVu and Noto CJK)."""
    bin_dir, log = tmp_path / "bin", tmp_path / "apt.log"
    bin_dir.mkdir(parents=True)
    chrome, font_file = tmp_path / "usr-bin-chromium", tmp_path / "DejaVuSans.ttf"
    cjk_file = tmp_path / "NotoSansCJK-Regular.ttc"
    _stub(bin_dir, "id", f'[ "$1" = -u ] && echo {uid}')
    if apt:
        _stub(
            bin_dir,
            "apt-get",
            f'echo "$@" >> {log}\n'
            f'if [ "$1" = install ] || [ "$2" = install ]; then\n'
            f"  echo > {font_file}; echo > {cjk_file}; echo > {chrome}; "
            f"/bin/chmod +x {chrome}\nfi",
        )
    if sudo == "passwordless":
        _stub(bin_dir, "sudo", '[ "$1" = -n ] && shift\n"$@"')
    elif sudo == "asks":
        _stub(bin_dir, "sudo", "exit 1")
    if chromium:
        chrome.write_text("")
        chrome.chmod(0o755)
    if font:
        font_file.write_text("")
        cjk_file.write_text("")
    env = {
        "PATH": str(bin_dir),
        "CHROMIUM": str(chrome),
        "FONT": str(font_file),
        "CJK_FONT": str(cjk_file),
    }
    return env, log, chrome


def _run(env, script=SCRIPT):
    return subprocess.run(
        [BASH, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.parametrize(
    "sudo, apt",
    [(None, True), ("asks", True), (None, False)],
    ids=["no-sudo", "sudo-asks-password", "no-apt-get"],
)
def test_setup_without_rights_stops_at_once_saying_what_to_install(tmp_path, sudo, apt):
    env, log, chrome = _machine(tmp_path, uid=1000, sudo=sudo, apt=apt)
    result = _run(env)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "chromium" in lines[0] and "install" in lines[0], lines
    assert "fonts-dejavu-core" in lines[0] or "DejaVu" in lines[0]
    assert not log.exists(), "apt-get ran without the right to install"
    assert not chrome.exists()


@pytest.mark.parametrize(
    "uid, sudo", [(0, None), (1000, "passwordless")], ids=["root", "passwordless-sudo"]
)
def test_setup_installs_chromium_and_fonts_when_it_may(tmp_path, uid, sudo):
    env, log, chrome = _machine(tmp_path, uid=uid, sudo=sudo, apt=True)
    result = _run(env)
    assert result.returncode == 0, result.stderr
    calls = log.read_text().splitlines()
    assert calls[0].startswith("update")
    assert calls[1].startswith("install") and calls[1].endswith(
        "chromium fonts-dejavu-core fonts-noto-cjk"
    )
    assert chrome.exists()


def test_setup_does_nothing_when_chromium_is_there(tmp_path):
    env, log, _ = _machine(
        tmp_path, uid=0, sudo=None, apt=True, chromium=True, font=True
    )
    result = _run(env)
    assert result.returncode == 0 and result.stdout == result.stderr == ""
    assert not log.exists()
    # known wrong: with the font missing it is not "there"
    env, log, _ = _machine(
        tmp_path / "nofont", uid=0, sudo=None, apt=True, chromium=True
    )
    assert _run(env).returncode == 0 and log.exists()
    # nor with only the CJK font missing (the Chinese pages would render as boxes)
    env, log, _ = _machine(
        tmp_path / "nocjk", uid=0, sudo=None, apt=True, chromium=True, font=True
    )
    Path(env["CJK_FONT"]).unlink()
    assert _run(env).returncode == 0 and "fonts-noto-cjk" in log.read_text()


def _sandbox_machine(tmp_path: Path, *, uid: int, sudo: str | None, apt: bool):
    """A fake machine without bwrap; apt-get install puts a bwrap stub on PATH."""
    env, log, _ = _machine(tmp_path, uid=uid, sudo=sudo, apt=apt)
    bin_dir = Path(env["PATH"])
    if apt:
        _stub(
            bin_dir,
            "apt-get",
            f'echo "$@" >> {log}\n'
            f'if [ "$1" = install ] || [ "$2" = install ]; then\n'
            f'  echo "#!{BASH}" > {bin_dir}/bwrap; /bin/chmod +x {bin_dir}/bwrap\nfi',
        )
    return env, log, bin_dir / "bwrap"


@pytest.mark.parametrize(
    "sudo, apt",
    [(None, True), ("asks", True), (None, False)],
    ids=["no-sudo", "sudo-asks-password", "no-apt-get"],
)
def test_sandbox_setup_without_rights_stops_at_once_saying_what_to_install(
    tmp_path, sudo, apt
):
    env, log, bwrap = _sandbox_machine(tmp_path, uid=1000, sudo=sudo, apt=apt)
    result = _run(env, SANDBOX_SCRIPT)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "bubblewrap" in lines[0] and "install" in lines[0]
    assert not log.exists(), "apt-get ran without the right to install"
    assert not bwrap.exists()


@pytest.mark.parametrize(
    "uid, sudo", [(0, None), (1000, "passwordless")], ids=["root", "passwordless-sudo"]
)
def test_make_test_installs_bubblewrap_when_it_may(tmp_path, uid, sudo):
    """A fresh machine with chromium but no bubblewrap ended `make test` with a grading
    test failing; now the set-up installs it as it installs chromium."""
    env, log, bwrap = _sandbox_machine(tmp_path, uid=uid, sudo=sudo, apt=True)
    result = _run(env, SANDBOX_SCRIPT)
    assert result.returncode == 0, result.stderr
    calls = log.read_text().splitlines()
    assert calls[0].startswith("update")
    assert calls[1].startswith("install") and calls[1].endswith("bubblewrap")
    assert bwrap.exists()
    # known right: with bwrap there, nothing runs
    log.unlink()
    again = _run(env, SANDBOX_SCRIPT)
    assert again.returncode == 0 and again.stdout == again.stderr == ""
    assert not log.exists()


def test_make_test_sets_up_the_browser_before_the_long_build():
    plan = subprocess.run(
        ["make", "-n", "test"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    ).stdout
    build = plan.find("tools/build_book.py")  # jupyter-book build, on every core
    assert build != -1, "make test does not build the book"
    for script, what in (
        ("tools/ensure_browser.sh", "chromium"),
        ("tools/ensure_sandbox.sh", "bubblewrap"),
    ):
        setup = plan.find(script)
        assert setup != -1, f"make test does not set up {what}"
        assert setup < build
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert "apt-get" not in ci, ".ci/run installs what make test should set up itself"
