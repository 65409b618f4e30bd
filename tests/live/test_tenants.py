"""Tenants: the repo's demo file, one-line config errors, deadline ranges and hot reload."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest

from gateway.config import REPO_ROOT
from gateway.config.tenants import TenantsFile, hash_key
from gateway.errors import BadRequest, ConfigError
from gateway.live import tenants as tenants_module
from gateway.live.tenants import (
    DeadlineOutOfRange,
    Tenant,
    TenantStore,
    check_deadline,
)

REPO_TENANTS = REPO_ROOT / "config" / "tenants.yaml"
KEY_A = hash_key("key-a")
KEY_B = hash_key("key-b")


def tenant_yaml(name: str = "a", key: str = KEY_A, default: float = 60, lo: float = 5, hi: float = 600) -> str:
    return (
        f"  - name: {name}\n"
        f"    api_key_sha256: [{key}]\n"
        f"    default_deadline_s: {default}\n"
        f"    min_deadline_s: {lo}\n"
        f"    max_deadline_s: {hi}\n"
    )


def write(path: Path, text: str, mtime_ns: int) -> None:
    """Write ``text`` and set a distinct mtime, so a change is seen whatever the clock's granularity."""
    path.write_text(text, encoding="utf-8")
    os.utime(path, ns=(mtime_ns, mtime_ns))


def load_text(tmp_path: Path, text: str) -> TenantStore:
    p = tmp_path / "tenants.yaml"
    p.write_text(text, encoding="utf-8")
    return TenantStore.load(p)


def config_error(tmp_path: Path, text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_text(tmp_path, text)
    assert "\n" not in str(info.value)
    return info.value


# -------------------------------------------------------------------------------------------------- the file


def test_repo_demo_file_authenticates_both_demo_keys() -> None:
    store = TenantStore.load(REPO_TENANTS)
    interactive = store.authenticate("demo-interactive-key")
    batch = store.authenticate("demo-batch-key")
    assert interactive == Tenant("interactive", 120.0, 5.0, 600.0, 2.0, 64)
    assert batch == Tenant("batch", 600.0, 10.0, 3600.0, 1.0, 128, on_predicted_miss="best_effort")
    assert [t.name for t in store.tenants] == ["interactive", "batch"]
    assert store.get("batch") is batch and store.get("nobody") is None
    assert store.generation == 0 and store.last_error is None and store.reload_failures == 0
    # Only digests are stored (a plaintext key would not load).
    text = REPO_TENANTS.read_text(encoding="utf-8")
    assert hash_key("demo-interactive-key") in text and hash_key("demo-batch-key") in text


def test_wrong_or_empty_key_is_rejected() -> None:
    store = TenantStore.load(REPO_TENANTS)
    assert store.authenticate("demo-interactive-key ") is None
    assert store.authenticate("nope") is None
    assert store.authenticate("") is None
    assert store.authenticate(hash_key("demo-batch-key")) is None  # the digest is not a key


def test_hash_key_is_sha256_hex() -> None:
    assert hash_key("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_store_from_a_model_without_a_file() -> None:
    cfg = TenantsFile.model_validate(
        {"tenants": [{"name": "x", "api_key_sha256": [KEY_A], "default_deadline_s": 10, "max_deadline_s": 20}]}
    )
    store = TenantStore(cfg)
    t = store.authenticate("key-a")
    assert t is not None and t.min_deadline_s == 1.0 and t.priority_weight == 1.0
    assert t.max_concurrent_workflows == 64
    assert store.path is None and store.reload_if_changed() is False


def test_plaintext_key_is_rejected_without_echoing_it(tmp_path: Path) -> None:
    err = config_error(tmp_path, "tenants:\n" + tenant_yaml(key="my-secret-key"))
    assert err.field == "tenants.0.api_key_sha256.0"
    assert "hexflow tenants hash-key KEY" in err.problem
    assert "my-secret-key" not in str(err)


@pytest.mark.parametrize(
    ("key", "words"),
    [
        (KEY_A.upper(), "lowercase"),
        (KEY_A[:-1], "64 lowercase hex"),
        (KEY_A[:-1] + "g", "64 lowercase hex"),
        ("12345", "64 lowercase hex"),
    ],
)
def test_bad_key_hash_formats(tmp_path: Path, key: str, words: str) -> None:
    err = config_error(tmp_path, "tenants:\n" + tenant_yaml(key=key))
    assert err.field == "tenants.0.api_key_sha256.0"
    assert words in err.problem


def test_no_key_hash_at_all(tmp_path: Path) -> None:
    text = "tenants:\n  - name: a\n    api_key_sha256: []\n    default_deadline_s: 60\n    max_deadline_s: 600\n"
    assert config_error(tmp_path, text).field == "tenants.0.api_key_sha256"


def test_min_above_default(tmp_path: Path) -> None:
    err = config_error(tmp_path, "tenants:\n" + tenant_yaml(default=5, lo=10))
    assert err.field == "tenants.0"
    assert "min_deadline_s <= default_deadline_s <= max_deadline_s" in err.problem
    assert "'a'" in err.problem


def test_default_above_max(tmp_path: Path) -> None:
    err = config_error(tmp_path, "tenants:\n" + tenant_yaml(default=700))
    assert "700" in err.problem


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("    priority_weight: 0\n", "tenants.0.priority_weight"),
        ("    max_concurrent_workflows: 0\n", "tenants.0.max_concurrent_workflows"),
        ("    colour: red\n", "tenants.0.colour"),
        ("    quality: best\n", "tenants.0.quality"),
    ],
)
def test_bad_fields(tmp_path: Path, line: str, field: str) -> None:
    assert config_error(tmp_path, "tenants:\n" + tenant_yaml() + line).field == field


@pytest.mark.parametrize("mode", ["full", "adaptive", "fast"])
def test_quality_mode_is_read_per_tenant_and_defaults_to_full(tmp_path: Path, mode: str) -> None:
    store = load_text(tmp_path, "tenants:\n" + tenant_yaml() + f"    quality: {mode}\n" + tenant_yaml("b", KEY_B))
    tenant_a, tenant_b = store.authenticate("key-a"), store.authenticate("key-b")
    assert tenant_a is not None and tenant_b is not None
    assert tenant_a.quality == mode
    assert tenant_b.quality == "full"


@pytest.mark.parametrize("name", ["", "has space", "x" * 65, "é"])
def test_bad_names(tmp_path: Path, name: str) -> None:
    assert config_error(tmp_path, "tenants:\n" + tenant_yaml(name=f"'{name}'")).field == "tenants.0.name"


def test_no_tenants(tmp_path: Path) -> None:
    assert config_error(tmp_path, "tenants: []\n").field == "tenants"


def test_duplicate_names(tmp_path: Path) -> None:
    err = config_error(tmp_path, "tenants:\n" + tenant_yaml("a", KEY_A) + tenant_yaml("a", KEY_B))
    assert err.field == "tenants.1.name"
    assert "duplicate tenant name 'a'" in err.problem


def test_key_hash_shared_by_two_tenants(tmp_path: Path) -> None:
    err = config_error(tmp_path, "tenants:\n" + tenant_yaml("a", KEY_A) + tenant_yaml("b", KEY_A))
    assert err.field == "tenants.1.api_key_sha256.0"
    assert "'a'" in err.problem and "'b'" in err.problem


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        TenantStore.load(tmp_path / "absent.yaml")


# -------------------------------------------------------------------------------------------------- deadlines


def test_deadline_range() -> None:
    store = TenantStore.load(REPO_TENANTS)
    t = store.get("interactive")
    assert t is not None
    assert check_deadline(t, None) == 120.0
    assert check_deadline(t, 30) == 30.0
    assert check_deadline(t, 5) == 5.0 and check_deadline(t, 600) == 600.0
    with pytest.raises(DeadlineOutOfRange, match=r"deadline_s=4.5 is outside tenant interactive's range \[5, 600\]"):
        check_deadline(t, 4.5)
    with pytest.raises(DeadlineOutOfRange, match=r"deadline_s=601 is outside"):
        check_deadline(t, 601)
    for bad in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(DeadlineOutOfRange) as info:
            check_deadline(t, bad)
        assert isinstance(info.value, BadRequest) and isinstance(info.value, ValueError)
        assert info.value.tenant == "interactive" and info.value.max_deadline_s == 600.0


# -------------------------------------------------------------------------------------------------- hot reload


def errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "hexflow.tenants" and r.levelno >= logging.ERROR]


def test_hot_reload(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="hexflow.tenants")
    p = tmp_path / "tenants.yaml"
    t0 = 1_700_000_000_000_000_000
    write(p, "tenants:\n" + tenant_yaml(default=60), t0)
    store = TenantStore.load(p)
    old = store.authenticate("key-a")
    assert old is not None and old.default_deadline_s == 60.0
    assert store.reload_if_changed() is False  # nothing changed

    # Touching without changing the content does not reload.
    os.utime(p, ns=(t0 + 1, t0 + 1))
    assert store.reload_if_changed() is False and store.generation == 0

    # A changed deadline is swapped in.
    write(p, "tenants:\n" + tenant_yaml(default=90), t0 + 2)
    assert store.reload_if_changed() is True
    new = store.authenticate("key-a")
    assert new is not None and new.default_deadline_s == 90.0
    assert store.generation == 1 and store.last_error is None
    assert old.default_deadline_s == 60.0  # what a reader already holds does not change
    assert store.reload_if_changed() is False

    # Broken YAML: refused once, old state kept, logged once.
    write(p, "tenants: [\n", t0 + 3)
    assert store.reload_if_changed() is False
    assert store.authenticate("key-a") == new and store.generation == 1
    assert store.last_error is not None and "invalid YAML" in store.last_error and str(p) in store.last_error
    assert store.reload_failures == 1 and len(errors(caplog)) == 1
    assert store.reload_if_changed() is False
    os.utime(p, ns=(t0 + 4, t0 + 4))  # same broken content, new mtime: not parsed again
    assert store.reload_if_changed() is False
    assert store.reload_failures == 1 and len(errors(caplog)) == 1

    # A different invalid file is a second failure.
    write(p, "tenants:\n" + tenant_yaml(default=900), t0 + 5)
    assert store.reload_if_changed() is False
    assert store.reload_failures == 2 and len(errors(caplog)) == 2
    assert store.last_error is not None and "default_deadline_s" in store.last_error

    # Fixed: swapped in, error cleared.
    write(p, "tenants:\n" + tenant_yaml(default=120) + tenant_yaml("b", KEY_B), t0 + 6)
    assert store.reload_if_changed() is True
    assert store.generation == 2 and store.last_error is None
    assert [t.name for t in store.tenants] == ["a", "b"]
    b = store.authenticate("key-b")
    assert b is not None and b.name == "b"

    # Deleted: a failure (logged once), old state kept.
    p.unlink()
    assert store.reload_if_changed() is False
    assert store.reload_if_changed() is False
    assert store.reload_failures == 3 and len(errors(caplog)) == 3
    assert store.last_error is not None and "file not found" in store.last_error
    assert store.authenticate("key-b") == b and store.generation == 2

    # Back again with the same content: swapped in (the file was gone).
    write(p, "tenants:\n" + tenant_yaml(default=120) + tenant_yaml("b", KEY_B), t0 + 7)
    assert store.reload_if_changed() is True
    assert store.generation == 3 and store.last_error is None


async def test_watch_picks_up_a_change_and_stops(tmp_path: Path) -> None:
    p = tmp_path / "tenants.yaml"
    t0 = 1_700_000_000_000_000_000
    write(p, "tenants:\n" + tenant_yaml(default=60), t0)
    store = TenantStore.load(p)
    stop = asyncio.Event()
    task = asyncio.create_task(store.watch(0.01, stop))
    write(p, "tenants:\n" + tenant_yaml(default=75), t0 + 1)
    for _ in range(500):
        if store.generation == 1:
            break
        await asyncio.sleep(0.01)
    t = store.authenticate("key-a")
    assert store.generation == 1 and t is not None and t.default_deadline_s == 75.0
    stop.set()
    await asyncio.wait_for(task, timeout=5.0)
    assert task.done() and task.exception() is None


async def test_watch_rejects_a_bad_period() -> None:
    store = TenantStore.load(REPO_TENANTS)
    with pytest.raises(ValueError, match="period_s"):
        await store.watch(0.0, asyncio.Event())


# -------------------------------------------------------------------------------------------------- key cache


def test_a_valid_key_is_hashed_once_an_unknown_one_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    store = TenantStore.load(REPO_TENANTS)
    hashed: list[str] = []

    def counting(key: str) -> str:
        hashed.append(key)
        return hash_key(key)

    monkeypatch.setattr(tenants_module, "hash_key", counting)
    first = store.authenticate("demo-interactive-key")
    for _ in range(5):
        assert store.authenticate("demo-interactive-key") is first
    assert hashed == ["demo-interactive-key"]
    for _ in range(3):
        assert store.authenticate("made-up") is None
    assert hashed.count("made-up") == 3  # unknown keys are not remembered
    assert list(store._state.known_keys) == ["demo-interactive-key"]


def test_the_key_cache_is_bounded_least_recently_used_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tenants_module, "AUTH_CACHE_SIZE", 2)
    keys = [f"key-{i}" for i in range(3)]
    store = TenantStore(
        TenantsFile.model_validate(
            {
                "tenants": [
                    {
                        "name": "a",
                        "api_key_sha256": [hash_key(k) for k in keys],
                        "default_deadline_s": 60,
                        "min_deadline_s": 5,
                        "max_deadline_s": 600,
                    }
                ]
            }
        )
    )
    assert store.authenticate(keys[0]) is not None
    assert store.authenticate(keys[1]) is not None
    assert store.authenticate(keys[0]) is not None  # used again: key-1 is now the least recent
    assert store.authenticate(keys[2]) is not None
    assert list(store._state.known_keys) == [keys[0], keys[2]]
    assert store.authenticate(keys[1]) is not None  # forgotten, not refused: looked up by its digest again


def test_a_reload_forgets_the_keys_it_removed(tmp_path: Path) -> None:
    p = tmp_path / "tenants.yaml"
    t0 = 1_700_000_000_000_000_000
    write(p, "tenants:\n" + tenant_yaml("a", KEY_A) + tenant_yaml("b", KEY_B), t0)
    store = TenantStore.load(p)
    a = store.authenticate("key-a")
    assert a is not None and store.authenticate("key-b") is not None
    write(p, "tenants:\n" + tenant_yaml("b", KEY_B, default=90), t0 + 1)  # a is gone, b changed
    assert store.reload_if_changed() is True
    assert store.authenticate("key-a") is None
    b = store.authenticate("key-b")
    assert b is not None and b.default_deadline_s == 90.0
