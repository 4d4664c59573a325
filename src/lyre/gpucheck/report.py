"""The acceptance run's report: one file a person can read and attach to an issue (``REPORT.md``),
the same as JSON (``report.json``), beside the files the stages write (the scaling benchmark's
JSON and plot)."""

from __future__ import annotations

import datetime
import json
import platform
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lyre import __version__

PASS, FAIL, NOT_RUN = "pass", "FAIL", "not run"


class StageFailed(Exception):
    """A stage's own verdict: ``summary`` says why in one line, ``details`` show the evidence."""

    def __init__(self, summary: str, details: list[str] | None = None, data: dict[str, Any] | None = None):
        super().__init__(summary)
        self.summary, self.details, self.data = summary, details or [], data or {}


@dataclass
class StageResult:
    name: str
    proves: str  # what a pass shows, in one sentence
    status: str = NOT_RUN
    seconds: float = 0.0
    summary: str = ""
    details: list[str] = field(default_factory=list)  # Markdown lines
    data: dict[str, Any] = field(default_factory=dict)


def git_commit(repo: Path) -> str:
    try:
        out = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10)
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain"], capture_output=True, text=True,
                               timeout=10).stdout.strip()
        return out.stdout.strip() + (" (with uncommitted changes)" if dirty else "") if out.returncode == 0 else "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


@dataclass
class Report:
    out_dir: Path
    command: str
    backend: str
    stages: list[StageResult] = field(default_factory=list)
    started: str = field(default_factory=lambda: datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"))

    @property
    def passed(self) -> bool:
        return bool(self.stages) and all(s.status == PASS for s in self.stages)

    def write(self) -> Path:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / "REPORT.md"
        path.write_text(self.markdown())
        meta = {"lyre": __version__, "commit": git_commit(Path(__file__).resolve().parents[3]),
                "host": platform.node(), "python": platform.python_version(), "command": self.command,
                "backend": self.backend, "started": self.started, "passed": self.passed}
        (self.out_dir / "report.json").write_text(json.dumps(
            {**meta, "stages": [asdict(s) for s in self.stages]}, indent=2, default=str) + "\n")
        return path

    def markdown(self) -> str:
        verdict = "PASSED" if self.passed else next(
            (f"FAILED at stage {i + 1} ({s.name})" for i, s in enumerate(self.stages) if s.status == FAIL), "INCOMPLETE")
        lines = [
            f"# Lyre GPU acceptance run: {verdict}",
            "",
            f"- command: `{self.command}`",
            f"- backend: {self.backend}",
            f"- started: {self.started}; host {platform.node()}; Python {platform.python_version()}",
            f"- Lyre {__version__}, commit {git_commit(Path(__file__).resolve().parents[3])}",
            "",
            "| # | stage | result | seconds | summary |",
            "| --- | --- | --- | --- | --- |",
        ]
        for i, s in enumerate(self.stages, 1):
            lines.append(f"| {i} | {s.name} | {s.status} | {s.seconds:.1f} | {s.summary.replace('|', '/')} |")
        for i, s in enumerate(self.stages, 1):
            lines += ["", f"## {i}. {s.name}: {s.status}", "", f"What a pass proves: {s.proves}", ""]
            if s.summary:
                lines.append(s.summary)
            if s.details:
                lines += ["", *s.details]
        return "\n".join(lines) + "\n"
