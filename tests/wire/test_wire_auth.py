"""Cluster token handling and the handshake MAC."""

from __future__ import annotations

import os
import stat

import pytest

from aiorl.wire import TokenError, generate_token, load_token, write_token_file
from aiorl.wire.auth import TOKEN_ENV, mac, new_nonce


@pytest.fixture(autouse=True)
def no_env_token(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)


def test_generated_tokens_are_long_random_and_ascii():
    a, b = generate_token(), generate_token()
    assert a != b and len(a) == 64 and a.isascii()


def test_write_token_file_is_owner_only_and_loads_back(tmp_path):
    path = tmp_path / "run" / "token"
    token = generate_token()
    write_token_file(path, token)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_token(path) == token


def test_write_token_file_tightens_an_existing_file(tmp_path):
    path = tmp_path / "token"
    path.write_text("old")
    os.chmod(path, 0o644)
    write_token_file(path, generate_token())
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o666])
def test_a_token_file_others_can_read_is_refused(tmp_path, mode):
    path = tmp_path / "token"
    write_token_file(path, generate_token())
    os.chmod(path, mode)
    with pytest.raises(TokenError, match=f"mode {mode:04o}; it must be 0600.*chmod 600"):
        load_token(path)


def test_read_only_owner_file_is_fine(tmp_path):
    path = tmp_path / "token"
    token = generate_token()
    write_token_file(path, token)
    os.chmod(path, 0o400)
    assert load_token(path) == token


def test_environment_wins_over_the_file(tmp_path, monkeypatch):
    path = tmp_path / "token"
    write_token_file(path, generate_token())
    monkeypatch.setenv(TOKEN_ENV, "  from-the-environment-0123456789abcdef\n")
    assert load_token(path) == b"from-the-environment-0123456789abcdef"
    assert load_token() == b"from-the-environment-0123456789abcdef"


def test_missing_short_or_absent_tokens_are_clear_errors(tmp_path):
    with pytest.raises(TokenError, match="set \\$AIORL_TOKEN or give a token file"):
        load_token()
    with pytest.raises(TokenError, match="does not exist"):
        load_token(tmp_path / "nope")
    short = tmp_path / "short"
    short.write_bytes(b"abc\n")
    os.chmod(short, 0o600)
    with pytest.raises(TokenError, match="is 3 characters; a cluster token needs at least 32"):
        load_token(short)
    with pytest.raises(TokenError, match="not a regular file"):
        load_token(tmp_path)


def test_errors_never_contain_the_token(tmp_path, monkeypatch):
    token = generate_token()
    path = tmp_path / "token"
    write_token_file(path, token)
    os.chmod(path, 0o644)
    with pytest.raises(TokenError) as info:
        load_token(path)
    assert token.decode() not in str(info.value)


def test_mac_binds_direction_nonces_names_and_version():
    token, cn, sn = generate_token(), new_nonce(), new_nonce()
    base = mac(token, b"client", 1, cn, sn, "actor-0", "memory-0")
    assert len(base) == 32
    assert base == mac(token, b"client", 1, cn, sn, "actor-0", "memory-0")
    variants = [
        mac(token, b"server", 1, cn, sn, "actor-0", "memory-0"),
        mac(token, b"client", 2, cn, sn, "actor-0", "memory-0"),
        mac(token, b"client", 1, sn, cn, "actor-0", "memory-0"),
        mac(token, b"client", 1, new_nonce(), sn, "actor-0", "memory-0"),
        mac(token, b"client", 1, cn, sn, "actor-1", "memory-0"),
        mac(token, b"client", 1, cn, sn, "actor-0m", "emory-0"),  # name boundaries are length-prefixed
        mac(generate_token(), b"client", 1, cn, sn, "actor-0", "memory-0"),
    ]
    assert base not in variants and len(set(variants)) == len(variants)


def test_tokens_shorter_than_32_characters_are_refused_with_the_requirement(tmp_path, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, "x" * 31)
    with pytest.raises(TokenError) as info:
        load_token()
    message = str(info.value)
    assert "31 characters" in message and "at least 32" in message and "\n" not in message
    monkeypatch.setenv(TOKEN_ENV, "x" * 32)
    assert load_token() == b"x" * 32
    with pytest.raises(TokenError, match="at least 32"):
        write_token_file(tmp_path / "token", b"y" * 31)


def test_write_token_file_never_writes_through_a_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    link = tmp_path / "token"
    link.symlink_to(victim)
    with pytest.raises(TokenError, match="symbolic link"):
        write_token_file(link, generate_token())
    assert victim.read_text() == "precious\n" and link.is_symlink()
    # A dangling link is refused too (O_CREAT would otherwise create its target).
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(TokenError, match="symbolic link"):
        write_token_file(dangling, generate_token())
    assert not (tmp_path / "nowhere").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
