"""API keys name accounts: server.api_keys, the single server.api_key, and no keys at all."""

from __future__ import annotations

import pytest

from lyre.accounts import DEFAULT_ACCOUNT, Accounts
from lyre.config import ConfigError, ServerConfig, load_config


def test_without_keys_everyone_is_the_default_account():
    accounts = Accounts(ServerConfig())
    assert not accounts.required
    assert accounts.account(None) == accounts.account("Bearer anything") == DEFAULT_ACCOUNT


def test_keys_map_to_their_accounts_and_anything_else_to_none():
    accounts = Accounts(ServerConfig(api_key="legacy", api_keys={"k-alice": "alice", "k-bob": "bob"}))
    assert accounts.required
    assert accounts.account("Bearer k-alice") == "alice" and accounts.account("Bearer k-bob") == "bob"
    assert accounts.account("Bearer legacy") == DEFAULT_ACCOUNT  # the single key keeps working, as one account
    for wrong in (None, "", "k-alice", "Bearer k-alic", "Bearer k-alice ", "bearer k-alice", "Bearer \udcff"):
        assert accounts.account(wrong) is None, wrong


def test_api_keys_come_from_the_config_and_empty_ones_are_refused():
    cfg = load_config(None, ["server.api_keys={k1: alice, k2: alice}"])
    assert Accounts(cfg.server).account("Bearer k2") == "alice"
    with pytest.raises(ConfigError, match="server.api_keys"):
        load_config(None, ["server.api_keys={k1: ' '}"])
