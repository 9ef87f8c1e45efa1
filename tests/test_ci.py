"""The CI workflow for a public host runs the same commands as .ci/run and the README."""

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def readme_command(marker: str) -> str:
    (line,) = [line for line in README.splitlines() if line.startswith("pip install") and marker in line]
    return line.split("  #")[0].strip()


def test_workflow_runs_ci_run_and_builds_the_site_with_the_readme_command():
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yml").read_text(encoding="utf-8"))
    steps = {job: [step.get("run", "") for step in spec["steps"]] for job, spec in workflow["jobs"].items()}
    assert any(run.strip() == ".ci/run" for run in steps["test"]), steps["test"]
    build = readme_command("tools/i18n.py build")
    assert any(build in run for run in steps["publish"]), f"the publish job must run the README's build command: {build}"
    assert "jupyter-book build . -W -n --keep-going" in readme_command("jupyter-book build")
    assert workflow["jobs"]["publish"]["needs"] == "test"
    ci_run = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert readme_command("python -m pytest") in ci_run, ".ci/run must run the README's test command verbatim"
