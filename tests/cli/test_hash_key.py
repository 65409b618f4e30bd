"""``hexflow tenants hash-key``: the key as an argument, or kept out of the shell's history (standard input,
or typed twice without echo on a terminal)."""

from __future__ import annotations

import getpass
import io
import sys

import pytest

from gateway.cli import main
from gateway.config.tenants import hash_key

KEY = "s3cret-key"


class _Terminal(io.StringIO):
    """Standard input that is a terminal (``getpass`` reads it, patched below)."""

    def isatty(self) -> bool:
        return True


def _typed(monkeypatch: pytest.MonkeyPatch, *answers: str) -> list[str]:
    """A terminal on standard input whose ``getpass`` prompts get ``answers`` in turn; returns the prompts."""
    prompts: list[str] = []
    left = list(answers)

    def fake_getpass(prompt: str = "Password: ", stream: object = None) -> str:
        prompts.append(prompt)
        return left.pop(0)

    monkeypatch.setattr(sys, "stdin", _Terminal())
    monkeypatch.setattr(getpass, "getpass", fake_getpass)
    return prompts


def test_the_key_as_an_argument_still_works(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tenants", "hash-key", KEY]) == 0
    assert capsys.readouterr().out == f"{hash_key(KEY)}\n"


@pytest.mark.parametrize("argv", [[], ["-"]])
def test_without_the_argument_the_key_is_read_from_standard_input(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"  {KEY}\nnext line\n"))
    assert main(["tenants", "hash-key", *argv]) == 0
    assert capsys.readouterr().out == f"{hash_key(KEY)}\n"


@pytest.mark.parametrize("argv", [[], ["-"]])
def test_on_a_terminal_the_key_is_typed_twice_without_echo(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = _typed(monkeypatch, KEY, KEY)
    assert main(["tenants", "hash-key", *argv]) == 0
    out, err = capsys.readouterr()
    assert out == f"{hash_key(KEY)}\n" and KEY not in err
    assert len(prompts) == 2


def test_two_different_keys_typed_print_nothing_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _typed(monkeypatch, KEY, KEY + "x")
    assert main(["tenants", "hash-key"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == "hexflow tenants hash-key: error: the two keys typed differ; nothing printed\n"


@pytest.mark.parametrize("stdin", ["", "\n", "   \n"])
def test_an_empty_key_is_refused(
    stdin: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    assert main(["tenants", "hash-key"]) == 2
    assert capsys.readouterr().err == "hexflow tenants hash-key: error: the key is empty\n"
