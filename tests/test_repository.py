"""The repository's contract with a newcomer: README commands, .ci/run, setup.sh's refusals."""

from __future__ import annotations

import os
import re
import subprocess

from tests.support.paths import REPO_ROOT


def readme_test_command() -> str:
    readme = (REPO_ROOT / "README.md").read_text()
    block = re.search(r"Run the tests.*?```bash\n(.*?)\n```", readme, re.S)
    assert block, "README has no test command block"
    return block.group(1).strip()


def test_readme_first_command_sets_up_and_starts_the_server():
    readme = (REPO_ROOT / "README.md").read_text()
    block = re.search(r"Set up and start the server.*?```bash\n(.*?)\n```", readme, re.S)
    assert block and block.group(1).startswith("./setup.sh && ") and "production_server.py" in block.group(1)


def test_ci_runs_the_readme_test_command_verbatim_and_fails_on_no_tests():
    command = readme_test_command()
    assert "setup.sh" in command and "pytest" in command
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert command in ci.splitlines()
    assert re.search(r'if \[ "\$rc" -eq 5 \]; then.*?exit 1', ci, re.S)


def test_setup_refuses_a_missing_or_unsupported_python(tmp_path):
    missing = subprocess.run(["bash", "setup.sh"], cwd=REPO_ROOT, capture_output=True, text=True,
                             env={"PATH": "/usr/bin:/bin", "PYTHON": str(tmp_path / "no-python")})
    assert missing.returncode != 0 and "not found" in missing.stderr

    old = tmp_path / "python3.9"
    old.write_text("#!/bin/sh\necho 3.9\n")
    old.chmod(0o755)
    unsupported = subprocess.run(["bash", "setup.sh"], cwd=REPO_ROOT, capture_output=True, text=True,
                                 env={"PATH": "/usr/bin:/bin", "PYTHON": str(old)})
    assert unsupported.returncode != 0
    assert "Python 3.9 is not supported (3.10-3.12)" in unsupported.stderr


def test_generated_artifacts_are_ignored_by_git():
    ignored = subprocess.run(
        ["git", "check-ignore", ".venv/x", "models/demo/llama/model.safetensors", "engines/orpheus/rank0.engine",
         "src/lyre/x_pb2.py"],
        cwd=REPO_ROOT, capture_output=True, text=True,
    )
    assert len(ignored.stdout.split()) == 4
    kept = subprocess.run(["git", "check-ignore", "engines/README.md"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert kept.stdout == ""


def test_code_passes_ruff():
    lint = subprocess.run([str(REPO_ROOT / ".venv" / "bin" / "ruff"), "check", "src", "tests", *map(str, REPO_ROOT.glob("*.py"))], cwd=REPO_ROOT,
                          capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout


def test_setup_refuses_an_unknown_option_and_explains_the_one_it_has():
    unknown = subprocess.run(["bash", "setup.sh", "--with-tests"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert unknown.returncode != 0 and "unknown option --with-tests" in unknown.stderr
    assert "--with-test-services" in unknown.stderr
    usage = subprocess.run(["bash", "setup.sh", "--help"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert usage.returncode == 0 and "--with-test-services" in usage.stdout and "postgresql" in usage.stdout


def test_the_test_command_leaves_out_the_slow_tests_and_the_second_command_runs_only_them(tmp_path):
    """pyproject.toml's addopts deselect ``slow``; a ``-m`` on the command line comes after them and
    wins (checked on a two-test project with this repository's pytest settings)."""
    readme = (REPO_ROOT / "README.md").read_text()
    assert ".venv/bin/python -m pytest -m slow" in readme
    (tmp_path / "pyproject.toml").write_text((REPO_ROOT / "pyproject.toml").read_text())
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_two.py").write_text(
        "import pytest\n\n\n@pytest.mark.slow\ndef test_heavy():\n    pass\n\n\ndef test_light():\n    pass\n")

    def collected(*args: str) -> list[str]:
        run = subprocess.run([str(REPO_ROOT / ".venv" / "bin" / "python"), "-m", "pytest", "-p", "no:cacheprovider",
                              "-W", "ignore::pytest.PytestConfigWarning", "-q", "--collect-only", *args], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120,
                             env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})  # (seconds of plugin imports)
        assert run.returncode == 0, run.stdout + run.stderr
        return [line.split("::")[1] for line in run.stdout.splitlines() if "::" in line]

    assert collected() == ["test_light"]
    assert collected("-m", "slow") == ["test_heavy"]
