"""API keys name accounts: server.api_keys, the single server.api_key, and no keys at all."""

from __future__ import annotations

import pytest

from lyre.config import ConfigError, ServerConfig, load_config
from lyre.trust.accounts import DEFAULT_ACCOUNT, Accounts


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


def test_behind_a_trusted_balancer_the_client_is_the_last_untrusted_forwarded_hop():
    from lyre.api.common import ClientAddress

    address = ClientAddress(("10.0.0.0/8", "127.0.0.1"))
    assert address("10.1.2.3", "203.0.113.7") == "203.0.113.7"
    assert address("10.1.2.3", "198.51.100.1, 203.0.113.7, 10.9.9.9") == "203.0.113.7"  # spoofed first hop ignored
    assert address("192.0.2.5", "203.0.113.7") == "192.0.2.5"  # an untrusted peer's header means nothing
    assert address("10.1.2.3", None) == "10.1.2.3" and address("10.1.2.3", "not-an-ip") == "10.1.2.3"
    assert ClientAddress()("10.1.2.3", "203.0.113.7") == "10.1.2.3"  # none trusted: the peer
    with pytest.raises(ConfigError, match=r"server.trusted_proxies\[0\]"):
        load_config(None, ["server.trusted_proxies=[balancer]"])


def test_keys_can_be_given_hashed_from_a_file_and_from_the_environment(tmp_path, monkeypatch):
    import hashlib

    hashed = "sha256:" + hashlib.sha256(b"k-carol").hexdigest()
    keys_file = tmp_path / "keys"
    keys_file.write_text(f"# the office\n{hashed} carol\nk-dave dave  # a plain key works too\n")
    monkeypatch.setenv("LYRE_API_KEYS", "k-erin erin")
    accounts = Accounts(ServerConfig(api_keys={"sha256:" + hashlib.sha256(b"k-alice").hexdigest(): "alice"},
                                     api_keys_file=str(keys_file)))
    assert accounts.account("Bearer k-alice") == "alice"  # the config holds only the key's hash
    assert accounts.account("Bearer k-carol") == "carol" and accounts.account("Bearer k-dave") == "dave"
    assert accounts.account("Bearer k-erin") == "erin"
    assert accounts.account(f"Bearer {hashed}") is None  # the hash itself is not a key
    assert accounts.names == ("alice", "carol", "dave", "erin")


def test_a_bad_keys_file_is_refused_without_showing_a_key(tmp_path, monkeypatch):
    monkeypatch.delenv("LYRE_API_KEYS", raising=False)
    keys_file = tmp_path / "keys"
    keys_file.write_text("k-secret-one carol extra\n")
    with pytest.raises(ConfigError, match="line 1: expected '<key> <account>'") as refused:
        Accounts(ServerConfig(api_keys_file=str(keys_file)))
    assert "k-secret" not in str(refused.value)
    with pytest.raises(ConfigError, match="cannot be read"):
        Accounts(ServerConfig(api_keys_file=str(tmp_path / "missing")))
    keys_file.write_text("k-secret bad/name\n")
    with pytest.raises(ConfigError, match="account name 'bad/name' is not allowed"):
        Accounts(ServerConfig(api_keys_file=str(keys_file)))
