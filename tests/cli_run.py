"""Run the ``hexflow`` command line in-process, as a test does."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from gateway.cli import main


def run_cli(argv: Sequence[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``hexflow *argv``: its exit code (an argparse usage error's too) and what it wrote to stdout and stderr."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err
