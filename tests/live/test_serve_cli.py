"""``hexflow serve`` refuses a bad configuration with one line and exit status 2, before serving."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gateway.cli import main
from tests.live.harness import write_config


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda t: t.replace("policy: hexgen", "policy: nope"), "policy: unknown policy 'nope'"),
        (lambda t: t.replace("gpu: A100", "gpu: A1000"), "unknown GPU 'A1000'"),
        (lambda t: t.replace("url: http://127.0.0.1:1", "url: ftp://x"), "cluster.workers.0.url"),
        (
            lambda t: t.replace("tenants_file: tenants.yaml", "tenants_file: missing.yaml"),
            "gateway.yaml: tenants_file: file not found: 'missing.yaml' is ",
        ),
        (lambda t: t + "bogus: 1\n", "bogus"),
        (lambda t: t.replace("    gpu: A100", "    gpu: A100\n    role: prefill"), "cluster.workers.0.role"),
        (lambda t: t.replace("tenants_reload_s: 0.1", "tenants_reload_s: -1"), "tenants_reload_s"),
    ],
)
def test_bad_config_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mutate: object, needle: str
) -> None:
    cfg = write_config(tmp_path, ["http://127.0.0.1:1"], ["A100"])
    assert callable(mutate)
    cfg.write_text(mutate(cfg.read_text()))
    assert main(["serve", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hexflow serve: error:") and needle in err and "\n" not in err, err


def test_a_port_in_use_is_one_line_and_exit_2_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As ``hexflow emulate-cluster`` does: no server log lines, no gateway started, exit 2."""
    cfg = write_config(tmp_path, ["http://127.0.0.1:1"], ["A100"])
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"hexflow serve: error: cannot listen on 127.0.0.1:{port}: "), err
    assert err.count("\n") == 1, err


def test_a_missing_tenants_file_names_the_config_key_and_the_path_it_resolved_to(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative ``tenants_file`` is resolved against the config file's folder, not the working directory:
    the error says so, with the path it looked at."""
    cfg = write_config(tmp_path, ["http://127.0.0.1:1"], ["A100"])
    cfg.write_text(cfg.read_text().replace("tenants_file: tenants.yaml", "tenants_file: conf/tenants.yaml"))
    monkeypatch.chdir(tmp_path.parent)
    assert main(["serve", "--config", f"{tmp_path.name}/gateway.yaml"]) == 2
    looked = tmp_path.absolute() / "conf" / "tenants.yaml"
    assert capsys.readouterr().err == (
        f"hexflow serve: error: {tmp_path.name}/gateway.yaml: tenants_file: file not found: 'conf/tenants.yaml' "
        f"is {looked} (resolved against the config file's folder)\n"
    )


def test_missing_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml: file not found" in capsys.readouterr().err


def test_bad_tenants_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path, ["http://127.0.0.1:1"], ["A100"])
    (tmp_path / "tenants.yaml").write_text("tenants:\n  - name: x\n    api_key_sha256: [plaintext-key]\n")
    assert main(["serve", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "tenants.yaml" in err and "hash-key" in err


def test_tenants_hash_key_matches_the_store(capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.live.tenants import TenantStore

    assert main(["tenants", "hash-key", "demo-batch-key"]) == 0
    digest = capsys.readouterr().out.strip()
    store = TenantStore.load(Path(__file__).resolve().parents[2] / "config" / "tenants.yaml")
    tenant = store.authenticate("demo-batch-key")
    assert tenant is not None and tenant.name == "batch" and len(digest) == 64
    assert digest in (Path(__file__).resolve().parents[2] / "config" / "tenants.yaml").read_text()


def test_overhead_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["overhead", "--duration", "0"])
    assert info.value.code == 2
    assert "hexflow overhead: error: argument --duration: expected a positive number" in capsys.readouterr().err
