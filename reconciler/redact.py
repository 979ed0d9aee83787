"""Redaction of secrets from text that leaves the daemon (status branch, notes, logs, web pages).

Pure: no I/O. Compiled once per :class:`Redactor`; every status write goes through it, so each
pattern runs as its own pass (a single alternation of all of them is ~4x slower in ``re``: it loses
the literal-prefix search) and passes whose marker is absent from the text are skipped. ``***``
is inert for every later pass. What becomes ``***``:

- the values of the daemon's own secrets (given at construction; values shorter than
  :data:`MIN_SECRET_LEN` are ignored, so that a secret "1" does not blank every digit);
- credentials in URLs (``https://user:token@host`` -> ``https://***@host``);
- values assigned to names that look secret (``HF_TOKEN=...``, ``password: ...``, ``?access_token=...``,
  ``--api-key ...``), ``Authorization:`` header values and ``Bearer ...``;
- well-known token shapes: Hugging Face ``hf_...``, OpenAI-style ``sk-...``, AWS ``AKIA...``, GitHub
  ``ghp_...``/``github_pat_...``, GitLab ``glpat-...``, and PEM private key blocks.

Redaction errs towards hiding: a value that merely looks like a credential is hidden too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MASK = "***"
MIN_SECRET_LEN = 6

# Name segments that make an assignment's value secret. ``KEY`` must be a whole segment
# (``API_KEY``, ``key``), so ``monkey=3`` or ``max_tokens: 8`` are left alone.
_SECRET_WORDS = r"(?:token|secret|password|passwd|passphrase|key|apikey|credentials?|private[_.-]?key)"
# The name starts where an identifier starts (lookbehind, not \b: ``.`` and ``-`` would make every
# segment a start and the scan quadratic); bounded segment counts keep backtracking linear.
_NAME = r"(?<![A-Za-z0-9_.-])(?:[A-Za-z0-9]+[_.-]){0,8}" + _SECRET_WORDS + r"(?:[_.-][A-Za-z0-9]+){0,8}+"
_VALUE = r"""(?:"[^"\n]*"|'[^'\n]*'|[^\s"',;&<>]+)"""

# (marker, pattern): a pass runs only when its marker (lower case) occurs in the lower-cased text.
_PASSES: tuple[tuple[str, str], ...] = (
    # A PEM private key block, also when the log cut it before its END line.
    ("-----begin", r"(?P<pem>-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----(?:.*?-----END [A-Z0-9 ]*PRIVATE KEY-----|.*\Z))"),
    # The body of a key block whose BEGIN line was cut off (a log tail, a followed chunk): the
    # base64 lines before a lone END line.
    (
        "-----end",
        r"(?P<pemtail>(?:^[ \t]*[A-Za-z0-9+/=]{16,}[ \t]*\r?\n)*^[^\n]*?-----END [A-Z0-9 ]*PRIVATE KEY-----)",
    ),
    # URL credentials: ``scheme://userinfo@``.
    ("://", r"(?P<url>(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^\s/@?#\"'<>]+)@"),
    # ``Authorization: Bearer x`` / ``authorization=token x``: the whole credential goes.
    (
        "authorization",
        r"(?P<auth>(?<![A-Za-z0-9_-])(?:proxy-)?authorization[\"']?[ \t]*[:=][ \t]*[\"']?"
        r"(?:(?:bearer|basic|token|bot|digest)[ \t]+)?)" + _VALUE,
    ),
    ("bearer", r"(?P<bearer>(?<![A-Za-z0-9_-])bearer[ \t]+)[A-Za-z0-9._~+/=-]{8,}"),
    # ``--api-key VALUE`` / ``--token=VALUE`` on a command line.
    (
        "--",
        r"(?P<flag>(?<![A-Za-z0-9_-])--(?:[a-z0-9]+-){0,4}" + _SECRET_WORDS + r"(?:-[a-z0-9]+){0,4}+(?:=|[ \t]+))"
        r"(?!-)" + _VALUE,
    ),
    # ``NAME=value``, ``name: value``, ``"name": "value"``, ``?name=value``.
    ("", r"(?P<assign>" + _NAME + r"[\"']?[ \t]*[=:][ \t]*)(?P<value>" + _VALUE + r")"),
    # Token shapes, wherever they stand.
    (
        "",
        r"(?P<token>(?<![A-Za-z0-9_-])(?:"
        r"hf_[A-Za-z0-9]{20,}"
        r"|sk-(?:proj-|ant-|live-|test-)?[A-Za-z0-9_-]{20,}"
        r"|(?:AKIA|ASIA)[0-9A-Z]{16}"
        r"|gh[pousr]_[A-Za-z0-9]{30,}"
        r"|github_pat_[A-Za-z0-9_]{20,}"
        r"|glpat-[A-Za-z0-9_-]{20,}"
        r"|xox[abprs]-[A-Za-z0-9-]{10,}"
        r"))",
    ),
)
_COMPILED = tuple(
    (marker, re.compile(pattern, re.IGNORECASE | re.DOTALL | re.MULTILINE)) for marker, pattern in _PASSES
)


def _percent_encoded(value: str) -> str:
    """``value`` as it appears inside a URL (RFC 3986 unreserved characters kept)."""
    out = []
    for ch in value:
        if ch.isascii() and (ch.isalnum() or ch in "-._~"):
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode())
    return "".join(out)


class Redactor:
    """Replace secrets in text with ``***``. Build once; call for every text (thread-safe, no state).

    ``secrets``: the literal values to hide (for example the values of WANDB_API_KEY or HF_TOKEN
    passed to jobs, the webhook secret, git credentials). Empty and short values are ignored.
    """

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        literals: set[str] = set()
        for secret in secrets:
            # The exact value, and without surrounding blanks (how it shows when printed in a line).
            for value in {secret or "", (secret or "").strip()}:
                if len(value) >= MIN_SECRET_LEN and value.strip():
                    literals.add(value)
                    literals.add(_percent_encoded(value))
        # Longest first, so that a secret containing another is hidden whole. Case-sensitive: a
        # secret is an exact value, and IGNORECASE would make the alternation ~40x slower.
        alternatives = [re.escape(s) for s in sorted(literals, key=lambda s: (-len(s), s))]
        self.secret_count = len(literals)
        literal_pass = [("", re.compile("(?P<literal>" + "|".join(alternatives) + ")"))] if alternatives else []
        # The PEM passes go first: a key block is hidden whole before other passes cut it up.
        self._passes = _COMPILED[:2] + tuple(literal_pass) + _COMPILED[2:]

    def __call__(self, text: str) -> str:
        """Return ``text`` with every secret replaced by ``***``."""
        if not text:
            return text
        lowered = text.lower()
        for marker, regex in self._passes:
            if marker in lowered:
                text = regex.sub(_replace, text)
        return text


def _replace(m: re.Match[str]) -> str:
    groups = m.groupdict()
    if groups.get("url") is not None:
        # ``ssh://git@host`` names the conventional user, not a credential.
        return m.group(0) if groups["userinfo"] == "git" else groups["url"] + MASK + "@"
    if groups.get("assign") is not None:
        value = groups["value"]
        if value == MASK or value.strip("\"'") == MASK:
            return m.group(0)
        quote = value[0] if value[0] in "\"'" and len(value) > 1 and value[-1] == value[0] else ""
        return groups["assign"] + quote + MASK + quote
    for prefix in ("auth", "bearer", "flag"):
        if groups.get(prefix) is not None:
            return groups[prefix] + MASK
    return MASK


_PATTERN_ONLY = Redactor()


def redact(text: str) -> str:
    """Redact credential patterns and URL credentials (no known secret values) from ``text``."""
    return _PATTERN_ONLY(text)


def redact_url(url: str) -> str:
    """Return ``url`` with its credentials hidden: ``https://user:token@host/x`` -> ``https://***@host/x``."""
    return _PATTERN_ONLY(url)
