"""Where the repository and its files are."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


CONFIG_PATH = REPO_ROOT / "config" / "model_config.yaml"
DEMO_DIR = REPO_ROOT / "models" / "demo"
