"""Redaction of secrets from text written to the status branch, notes, logs and pages (reconciler/redact.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.redact import MASK, Redactor, redact, redact_url

SECRETS = ["wandb-0123456789abcdef", "hf_SECRETVALUEFROMENV000000000000", "whsec-webhook-9f8e7d", "p@ss word/1"]

# (line, expected) — lines as jobs, git and HTTP clients print them.
CORPUS = [
    # URL credentials
    ("cannot clone https://alice:ghtoken123@github.com/org/cfg.git", "cannot clone https://***@github.com/org/cfg.git"),
    ("fetch https://x-access-token:abc@git.example/c.git failed", "fetch https://***@git.example/c.git failed"),
    ("remote: https://oauth2:glpat@gitlab.com/a/b", "remote: https://***@gitlab.com/a/b"),
    ("git+https://tok@host/x", "git+https://***@host/x"),
    ("ssh://git@host:2222/srv/cfg.git", "ssh://git@host:2222/srv/cfg.git"),
    ("git@github.com:org/cfg.git", "git@github.com:org/cfg.git"),
    ("https://github.com/org/cfg.git", "https://github.com/org/cfg.git"),
    ("mail alice@example.com", "mail alice@example.com"),
    ("GET /download?token=abc123&name=x", "GET /download?token=***&name=x"),
    ("https://h/cb?code=1&access_token=ya29.abc-def#frag", "https://h/cb?code=1&access_token=***"),
    # environment dumps
    ("WANDB_API_KEY=0123456789abcdef0123", "WANDB_API_KEY=***"),
    ("HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz1234", "HF_TOKEN=***"),
    ("AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCY", "AWS_SECRET_ACCESS_KEY=***"),
    ("export GITHUB_TOKEN='abc def'", "export GITHUB_TOKEN='***'"),
    ("DB_PASSWORD=hunter2 DB_USER=bob", "DB_PASSWORD=*** DB_USER=bob"),
    ("client_secret: shhh", "client_secret: ***"),
    ('{"api_key": "abcdef", "model": "m"}', '{"api_key": "***", "model": "m"}'),
    ("{'password': 'pw', 'user': 'u'}", "{'password': '***', 'user': 'u'}"),
    ("private_key = xyz", "private_key = ***"),
    ("credentials=aaa;other=b", "credentials=***;other=b"),
    ("serve --api-key sekrit --port 8000", "serve --api-key *** --port 8000"),
    ("run --token=abc --flag", "run --token=*** --flag"),
    # headers
    ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.sig", "Authorization: Bearer ***"),
    ('curl -H "authorization: token ghp_x"', 'curl -H "authorization: token ***"'),
    ("Authorization: Basic dXNlcjpwYXNz", "Authorization: Basic ***"),
    ("sent bearer abcdefghijkl to the API", "sent bearer *** to the API"),
    # token shapes anywhere
    ("using hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ012345 from cache", "using *** from cache"),
    ("key sk-proj-abcdefghijklmnopqrstuvwx1234", "key ***"),
    ("id AKIAIOSFODNN7EXAMPLE in us-east-1", "id *** in us-east-1"),
    ("ghp_abcdefghijklmnopqrstuvwxyz0123456789", MASK),
    ("pat github_pat_11ABCDEFG0abcdefghijkl_mnopqrstuvwxyz", "pat ***"),
    ("glpat-abcdefghij0123456789", MASK),
    # PEM blocks, also cut off
    ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3Bl\nbnNz\n-----END OPENSSH PRIVATE KEY-----\nnext", "***\nnext"),
    ("start\n-----BEGIN PRIVATE KEY-----\nMIIEv\nQIBADA", "start\n***"),
    ("-----BEGIN PUBLIC KEY-----\nMIIB", "-----BEGIN PUBLIC KEY-----\nMIIB"),
    # things that only look similar stay
    ("max_tokens: 256", "max_tokens: 256"),
    ("tokenizer: /models/llama", "tokenizer: /models/llama"),
    ("monkey=3 turkey: 4", "monkey=3 turkey: 4"),
    ("PWD=/tmp/ray/session_1", "PWD=/tmp/ray/session_1"),
    ("Epoch 3: loss=0.41 grad_norm=1.2", "Epoch 3: loss=0.41 grad_norm=1.2"),
    ("sha256=0123abcd", "sha256=0123abcd"),
    ("KEY=***", "KEY=***"),
    ("", ""),
]


@pytest.mark.parametrize(("line", "expected"), CORPUS)
def test_corpus(line: str, expected: str) -> None:
    assert Redactor(SECRETS)(line) == expected
    assert redact(line) == expected


def test_secret_values_are_hidden_wherever_they_stand() -> None:
    r = Redactor(SECRETS)
    text = "env: MYVAR=wandb-0123456789abcdef; echo whsec-webhook-9f8e7dXYZ; url=https://h/?q=p%40ss%20word%2F1"
    out = r(text)
    assert "wandb-0123" not in out and "whsec" not in out and "p%40ss" not in out
    assert out == "env: MYVAR=***; echo ***XYZ; url=https://h/?q=***"


def test_short_and_empty_secrets_are_ignored() -> None:
    r = Redactor(["1", "", None, "abc", "  "])
    assert r.secret_count == 0
    assert r("step 1 of 10: abc") == "step 1 of 10: abc"


def test_longer_secret_wins_over_its_prefix() -> None:
    r = Redactor(["abcdef", "abcdefghij"])
    assert r("x abcdefghij y") == "x *** y"


def test_redact_url() -> None:
    assert redact_url("https://user:pw@host/repo.git") == "https://***@host/repo.git"
    assert redact_url("https://token@host/repo.git") == "https://***@host/repo.git"
    assert redact_url("/srv/git/cfg.git") == "/srv/git/cfg.git"
    assert redact_url("file:///srv/git/cfg.git") == "file:///srv/git/cfg.git"


def test_idempotent_on_corpus() -> None:
    r = Redactor(SECRETS)
    for line, _ in CORPUS:
        once = r(line)
        assert r(once) == once


@settings(max_examples=300, deadline=None)
@given(
    secret=st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=0x2FF), min_size=6, max_size=40),
    before=st.text(max_size=40),
    after=st.text(max_size=40),
)
def test_a_known_secret_never_survives(secret: str, before: str, after: str) -> None:
    out = Redactor([secret])(before + secret + after)
    assert secret not in out


def test_fast_on_large_and_pathological_text() -> None:
    r = Redactor(SECRETS + [f"secret-number-{i:04d}" for i in range(50)])
    log = ("step 12 loss=0.31 lr=1e-5 tokens/s=8123 url=https://h/x?a=b " * 20 + "\n") * 1000  # ~1.2 MB
    hostile = "a." * 200_000 + "token.key-" * 20_000 + "https://" * 20_000 + "-----BEGIN X PRIVATE KEY-----"
    for text in (log, hostile):
        start = time.perf_counter()
        r(text)
        assert time.perf_counter() - start < 2.0


def test_clone_error_hides_url_credentials(tmp_path: Path) -> None:
    from reconciler.errors import SourceUnavailable
    from reconciler.source.remote import open_source

    # Port 9 (discard) on loopback: nothing listens, the real git clone fails at once.
    with pytest.raises(SourceUnavailable) as info:
        open_source("http://alice:tok-SECRET-123@127.0.0.1:9/cfg.git", str(tmp_path))
    assert "tok-SECRET" not in str(info.value)
    assert "http://***@127.0.0.1:9/cfg.git" in str(info.value)


def test_cli_errors_hide_url_credentials(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from reconciler.cli import main

    url = "https://alice:tok-SECRET-456@127.0.0.1:9/cfg.git"  # nothing listens: the real clone fails
    assert main(["status", "--repo", url, "--cache-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "tok-SECRET" not in err and "https://***@127.0.0.1:9/cfg.git" in err
