"""Configuration helpers: ``config-reference`` (the reference generated from the pydantic models) and
``tenants hash-key`` (the hash that ``config/tenants.yaml`` stores for an API key)."""

from __future__ import annotations

import argparse
import sys

from gateway.cli.common import Command, UsageError, opt

__all__ = ["CONFIG_REFERENCE", "TENANTS"]


def cmd_config_reference(args: argparse.Namespace) -> int:
    """Print the configuration reference generated from the pydantic models."""
    from gateway.config.reference import reference

    sys.stdout.write(reference())
    return 0


def cmd_hash_key(args: argparse.Namespace) -> int:
    """Print the hash of an API key for ``api_key_sha256`` in tenants.yaml: the argument, else (none, or ``-``)
    the key typed twice without echo on a terminal, or the first line of standard input."""
    from gateway.config.tenants import hash_key

    key = args.key if args.key not in (None, "-") else _secret_key()
    if not key:
        raise UsageError("the key is empty")
    print(hash_key(key))
    return 0


def _secret_key() -> str:
    """The key, kept out of the shell's history: asked for twice without echo on a terminal (``UsageError`` when
    the two differ), else the first line of standard input. Surrounding whitespace is dropped, as the gateway
    drops it from an ``Authorization`` header."""
    import getpass

    if not sys.stdin.isatty():
        return sys.stdin.readline().strip()
    key = getpass.getpass("API key (not echoed): ").strip()
    if key and getpass.getpass("the same key again: ").strip() != key:
        raise UsageError("the two keys typed differ; nothing printed")
    return key


CONFIG_REFERENCE = Command(
    "config-reference",
    cmd_config_reference,
    "print the configuration reference (docs/configuration.md)",
    "Print the reference of every configuration key (gateway.yaml, tenants.yaml, databases, cluster files, "
    "gpus.yaml), generated from the models that validate them: docs/configuration.md is this output.",
)
HASH_KEY = Command(
    "hash-key",
    cmd_hash_key,
    "print the SHA-256 hash of an API key (what tenants.yaml stores)",
    "Print the SHA-256 digest of an API key: what a tenant's api_key_sha256 (tenants.yaml) and "
    "admin.api_key_sha256 (gateway.yaml) hold. To keep the key out of the shell's history, leave it out (or give "
    "-): it is asked for twice without echo on a terminal, else read from the first line of standard input "
    "(hexflow tenants hash-key < key.txt).",
    (
        opt(
            "key",
            str,
            None,
            "the API key; leave it out, or give -, to type it without echo or pipe it on standard input",
            nargs="?",
        ),
    ),
)
TENANTS = Command(
    "tenants",
    None,
    "tenant helpers (hash an API key for config/tenants.yaml)",
    "Helpers for the tenants file (config/tenants.yaml), which stores API keys only as hashes.",
    subs=(HASH_KEY,),
)
