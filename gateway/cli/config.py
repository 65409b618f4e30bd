"""Configuration helpers: ``config-reference`` (the reference generated from the pydantic models) and
``tenants hash-key`` (the hash that ``config/tenants.yaml`` stores for an API key)."""

from __future__ import annotations

import argparse
import sys

from gateway.cli.common import Subparsers, UsageError

__all__ = ["add_config_reference", "add_tenants"]


def add_config_reference(sub: Subparsers) -> None:
    """``hexflow config-reference``."""
    p = sub.add_parser("config-reference", help="print the configuration reference (docs/configuration.md)")
    p.set_defaults(func=cmd_config_reference)


def add_tenants(sub: Subparsers) -> None:
    """``hexflow tenants hash-key``."""
    p = sub.add_parser("tenants", help="tenant helpers (hash an API key for config/tenants.yaml)")
    tsub = p.add_subparsers(dest="tenants_command", required=True)
    q = tsub.add_parser("hash-key", help="print the SHA-256 hash of an API key (what tenants.yaml stores)")
    q.add_argument("key", help="the API key (use '-' to read it from stdin, keeping it out of shell history)")
    q.set_defaults(func=cmd_hash_key)


def cmd_config_reference(args: argparse.Namespace) -> int:
    """Print the configuration reference generated from the pydantic models."""
    from gateway.config.reference import reference

    sys.stdout.write(reference())
    return 0


def cmd_hash_key(args: argparse.Namespace) -> int:
    """Print the hash of an API key for ``api_key_sha256`` in tenants.yaml."""
    from gateway.config.tenants import hash_key

    key = sys.stdin.readline().strip() if args.key == "-" else args.key
    if not key:
        raise UsageError("the key is empty")
    print(hash_key(key))
    return 0
