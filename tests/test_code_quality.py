"""The code stays lint-clean, formatted and type-checked (ruff and mypy, configured in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ["rtc_omni", "tests", "benchmarks"]


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_lint_and_format() -> None:
    lint = run("ruff", "check", *SOURCES)
    assert lint.returncode == 0, lint.stdout
    formatting = run("ruff", "format", "--check", *SOURCES)
    assert formatting.returncode == 0, formatting.stdout


def test_mypy() -> None:
    checked = run("mypy", "rtc_omni")
    assert checked.returncode == 0, checked.stdout
