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

Before any pattern runs, terminal escape sequences (ANSI CSI such as colours, OSC such as
window titles and clipboard writes, DCS/PM/APC strings) and the other C0/C1 control
characters except tab, newline and carriage return are removed, so that ``\x1b[32mghp_...``
is seen (and hidden) as ``ghp_...``, and nothing redacted can drive a terminal.

Every pass is linear in the length of the text: private key blocks are found by a scan that
visits each line a bounded number of times, and the regular-expression passes are written so
that each match attempt stops at the next character outside its class (no nested unbounded
repetition). Texts longer than :data:`MAX_TEXT_CHARS` are cut before redaction: the first
and the last half of the budget are kept, cut at line ends, and redacted separately, with a
``[argus: N characters cut]`` line between them (see :func:`cut`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

MASK = "***"
MIN_SECRET_LEN = 6

# Name segments that make an assignment's value secret. ``KEY`` must be a whole segment
# (``API_KEY``, ``key``), so ``monkey=3`` or ``max_tokens: 8`` are left alone.
_SECRET_WORDS = r"(?:token|secret|password|passwd|passphrase|key|apikey|credentials?|private[_.-]?key)"
# The name starts where an identifier starts (lookbehind, not \b: ``.`` and ``-`` would make every
# segment a start and the scan quadratic); bounded segment counts keep backtracking linear.
_NAME = r"(?<![A-Za-z0-9_.-])(?:[A-Za-z0-9]+[_.-]){0,8}" + _SECRET_WORDS + r"(?:[_.-][A-Za-z0-9]+){0,8}+"
_VALUE = r"""(?:"[^"\n]*"|'[^'\n]*'|[^\s"',;&<>]+)"""

# Markers: a pass runs only when, for each group, one of its strings (lower case) occurs in the
# lower-cased text, so that a short identifier costs a few substring searches, not regex passes.
_WORDS = ("token", "secret", "passw", "passphrase", "key", "credential")  # covers _SECRET_WORDS
Markers = tuple[tuple[str, ...], ...]

# (markers, pattern). Private key blocks are not here: :func:`_hide_key_blocks` finds them in
# one linear scan.
_PASSES: tuple[tuple[Markers, str], ...] = (
    # URL credentials: ``scheme://userinfo@``.
    ((("://",),), r"(?P<url>(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^\s/@?#\"'<>]+)@"),
    # ``Authorization: Bearer x`` / ``authorization=token x``: the whole credential goes.
    (
        (("authorization",),),
        r"(?P<auth>(?<![A-Za-z0-9_-])(?:proxy-)?authorization[\"']?[ \t]*[:=][ \t]*[\"']?"
        r"(?:(?:bearer|basic|token|bot|digest)[ \t]+)?)" + _VALUE,
    ),
    ((("bearer",),), r"(?P<bearer>(?<![A-Za-z0-9_-])bearer[ \t]+)[A-Za-z0-9._~+/=-]{8,}"),
    # ``--api-key VALUE`` / ``--token=VALUE`` on a command line.
    (
        (("--",), _WORDS),
        r"(?P<flag>(?<![A-Za-z0-9_-])--(?:[a-z0-9]+-){0,4}" + _SECRET_WORDS + r"(?:-[a-z0-9]+){0,4}+(?:=|[ \t]+))"
        r"(?!-)" + _VALUE,
    ),
    # ``NAME=value``, ``name: value``, ``"name": "value"``, ``?name=value``.
    ((("=", ":"), _WORDS), r"(?P<assign>" + _NAME + r"[\"']?[ \t]*[=:][ \t]*)(?P<value>" + _VALUE + r")"),
    # Token shapes, wherever they stand: also right after a colour code written out as text
    # (``\033[31m``, ``\u001b[1;32m`` in a command or a JSON log; real escapes are removed first).
    (
        (("hf_", "sk-", "akia", "asia", "gh", "glpat-", "xox"),),
        r"(?P<token>(?:(?<![A-Za-z0-9_-])|(?<=\[m)|(?<=[\[;]\dm)|(?<=[\[;]\d\dm))(?:"
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
    (markers, re.compile(pattern, re.IGNORECASE | re.DOTALL | re.MULTILINE)) for markers, pattern in _PASSES
)

MAX_TEXT_CHARS = 1 << 20
"""The longest text redacted whole (characters); a longer one is cut first (:func:`cut`)."""
# Texts up to MEMO_CHARS are remembered, at most MEMO_ENTRIES of them (then the memo starts over):
# a status write redacts the same keys, states and names for every object.
MEMO_CHARS = 80
MEMO_ENTRIES = 8192

# Terminal control sequences, removed before redaction. Each alternative's classes are disjoint
# from what follows them, so a match never backtracks; an unterminated string (OSC, DCS, ...)
# ends at the next ESC, BEL, ST or line end, as far as the scan has to look.
_SEQUENCES = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"  # CSI: colours, cursor moves, screen clears
    r"|(?:\x1b[\]P^_X]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c\n]*(?:\x07|\x1b\\|\x9c)?"  # OSC, DCS, SOS, PM, APC
    r"|\x1b[ -/]*[0-~]?"  # other escapes (charset selection, keypad modes, a lone ESC)
    r"|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]"  # every other control but tab, newline, CR
)

# Private key blocks. ``[A-Z0-9 ]*`` stops at ``-``, so attempts from different markers never
# rescan the same characters.
_KEY_BEGIN = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----", re.IGNORECASE)
_KEY_END = re.compile(r"-----END [A-Z0-9 ]*PRIVATE KEY-----", re.IGNORECASE)
_KEY_BODY_LINE = re.compile(r"[ \t]*[A-Za-z0-9+/=]{16,}[ \t]*\r?")


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")  # where every sequence starts
# A lone surrogate (a name that is not UTF-8, decoded with surrogateescape) cannot be encoded into
# the UTF-8 of a document, README, commit message or page: it is shown as its escape instead.
SURROGATE = re.compile("[\ud800-\udfff]")


def strip_controls(text: str) -> str:
    """Return ``text`` without terminal escape sequences and control characters (tab, newline
    and carriage return are kept). Linear in ``len(text)``."""
    return _SEQUENCES.sub("", text)


def cut(text: str, limit: int = MAX_TEXT_CHARS) -> tuple[str, str | None, str]:
    """Split a text longer than ``limit`` into (head, marker, tail) to redact separately; a text
    within it is returned as ``(text, None, "")``.

    Head and tail hold about ``limit // 2`` characters each, cut at a line end when the part has
    one; otherwise the word split by the cut is dropped (so that no fragment of a secret value
    is kept where the literal pass could not recognise it). The marker is a line that says how
    many characters were left out. A key block cut in two stays hidden: its head part has a
    BEGIN line without an END (hidden to the end of the part), its tail part body lines before
    an END line."""
    if len(text) <= limit:
        return text, None, ""
    half = max(limit // 2, 1)
    head, tail = text[:half], text[len(text) - half :]
    newline = head.rfind("\n")
    head = head[: (newline if newline >= 0 else max(head.rfind(c) for c in " \t\r\f\v")) + 1]
    newline = tail.find("\n")
    first = _BLANK.search(tail) if newline < 0 else None
    tail = tail[newline + 1 :] if newline >= 0 else tail[first.end() :] if first is not None else ""
    dropped = len(text) - len(head) - len(tail)
    return head, ("" if head.endswith("\n") else "\n") + f"[argus: {dropped} characters cut]\n", tail


_BLANK = re.compile(r"\s")


def _hide_key_blocks(text: str) -> str:
    """Hide private key blocks: from a BEGIN line to its END line (or to the end of the text
    when the log cut it off), and, for an END line whose BEGIN line was cut off (a log tail, a
    followed chunk), that line up to its END marker with the base64 body lines just above it.

    Linear in ``len(text)``: the searches move forward only, and the walk back from a lone END
    line stops at the previous END line (which is not a body line)."""
    if "-----" not in text:
        return text
    spans: list[tuple[int, int]] = []  # what to hide, in order of start
    pos = 0
    while (begin := _KEY_BEGIN.search(text, pos)) is not None:
        end = _KEY_END.search(text, begin.end())
        spans.append((begin.start(), len(text) if end is None else end.end()))
        if end is None:
            break
        pos = end.end()
    blocks = spans.copy()
    index = 0  # the first block that does not end before the END marker at hand
    line_start, scanned = 0, 0  # the start of the line holding ``scanned``, once blocks are hidden
    for end in _KEY_END.finditer(text):
        while index < len(blocks) and blocks[index][1] <= end.start():
            index += 1
        if index < len(blocks) and blocks[index][0] <= end.start():
            continue  # a block's own END line
        # The last line end before the marker outside hidden blocks (a hidden block is one
        # line), searched back to the previous marker only.
        hi, j = end.start(), index - 1
        while True:
            lo = max(scanned, blocks[j][1]) if j >= 0 else scanned
            newline = text.rfind("\n", lo, hi)
            if newline >= 0 or j < 0 or blocks[j][1] <= scanned:
                break
            hi, j = blocks[j][0], j - 1
        line_start, scanned = (newline + 1 if newline >= 0 else line_start), end.end()
        start = line_start
        while start > 0:  # the body lines right above
            above = text.rfind("\n", 0, start - 1) + 1
            if not _KEY_BODY_LINE.fullmatch(text, above, start - 1):
                break
            start = above
        spans.append((start, end.end()))
    spans.sort()
    out: list[str] = []
    pos = 0
    for start, stop in spans:
        if stop <= pos:
            continue
        if start >= pos:
            out += [text[pos:start], MASK]
        pos = stop
    out.append(text[pos:])
    return "".join(out)


def _percent_encoded(value: str) -> str:
    """``value`` as it appears inside a URL (RFC 3986 unreserved characters kept)."""
    out = []
    for ch in value:
        if ch.isascii() and (ch.isalnum() or ch in "-._~"):
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8", "surrogateescape"))  # os.environ decodes so
    return "".join(out)


class Redactor:
    """Replace secrets in text with ``***``. Build once; call for every text (thread-safe; the only
    state is a bounded memo of short texts).

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
                    visible = strip_controls(value)  # how it reads once control sequences are removed
                    if len(visible) >= MIN_SECRET_LEN:
                        literals.add(visible)
        # Longest first, so that a secret containing another is hidden whole. Case-sensitive: a
        # secret is an exact value, and IGNORECASE would make the alternation ~40x slower.
        alternatives = [re.escape(s) for s in sorted(literals, key=lambda s: (-len(s), s))]
        self.secret_count = len(literals)
        literal = re.compile("(?P<literal>" + "|".join(alternatives) + ")")
        self._literal = literal if alternatives else None
        literal_pass: list[tuple[Markers, re.Pattern[str]]] = [((), literal)] if alternatives else []
        self._passes = tuple(literal_pass) + _COMPILED
        self._memo: dict[str, str] = {}  # short text -> redacted; cleared at MEMO_ENTRIES

    def __call__(self, text: str) -> str:
        """Return ``text`` with every secret replaced by ``***`` and control sequences removed.

        A text longer than :data:`MAX_TEXT_CHARS` is cut first (:func:`cut`): its middle is
        replaced by a ``[argus: N characters cut]`` line. Linear in ``len(text)``."""
        if not text:
            return text
        if len(text) <= MEMO_CHARS:  # ids, names, states, keys: the same few strings again and again
            done = self._memo.get(text)
            if done is None:
                if len(self._memo) >= MEMO_ENTRIES:
                    self._memo.clear()
                done = self._memo[text] = self._redact(text)
            return done
        head, marker, tail = cut(text)
        if marker is None:
            return self._redact(head)
        return self._redact(head) + marker + self._redact(tail)

    def _redact(self, text: str) -> str:
        # Fast path: a printable text has no control character; most others only newlines and tabs.
        printable = text.isprintable()
        if not printable and _CONTROL.search(text) is not None:
            if self._literal is not None:  # a secret right after an escape's start is hidden whole
                text = self._literal.sub(MASK, text)
            text = strip_controls(text)
        text = _hide_key_blocks(text)  # key blocks first: hidden whole, not cut up
        lowered = text.lower()
        for markers, regex in self._passes:
            for group in markers:
                for marker in group:
                    if marker in lowered:
                        break
                else:
                    break  # no string of this group occurs: the pass cannot match
            else:
                text = regex.sub(_replace, text)
        # Last: the escape ends in hex letters, which would hide a secret after it from the passes.
        if not printable and SURROGATE.search(text) is not None:
            text = SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
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


_SECRET_NAME = re.compile(_NAME, re.IGNORECASE)
# Values that stand for a secret without being one: the mask, and what a resolved spec shows for
# a variable the daemon fills in (reconciler.builders.resolved.FROM_DAEMON).
PLACEHOLDERS = frozenset({"", MASK, "(from the daemon's environment)"})


def redact_tree(value: Any, redact: Callable[[str], str] = redact) -> Any:
    """Return a copy of ``value`` (JSON-like: mappings, lists, scalars) with every string and
    mapping key passed through ``redact``, and the string value of every key that names a secret
    (``HF_TOKEN``, ``api_key``, ``password``: the rule of ``NAME=value``) replaced by ``***``.
    Tuples become lists; other scalars are kept."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            name = str(k)
            secret = isinstance(v, str) and v not in PLACEHOLDERS and _SECRET_NAME.fullmatch(name) is not None
            out[redact(name)] = MASK if secret else redact_tree(v, redact)
        return out
    if isinstance(value, (list, tuple)):
        return [redact_tree(v, redact) for v in value]
    return value


def redact_url(url: str) -> str:
    """Return ``url`` with its credentials hidden: ``https://user:token@host/x`` -> ``https://***@host/x``."""
    return _PATTERN_ONLY(url)


class RedactingFormatter(logging.Formatter):
    """A log formatter whose every formatted record (message, arguments and traceback together)
    passes through ``redact``: the choke point of what the daemon logs. ``redact`` may be
    replaced later (by a Redactor that knows the daemon's secret values once they are read)."""

    def __init__(self, redact: Callable[[str], str] = redact, fmt: str = "%(message)s") -> None:
        super().__init__(fmt)
        self.redact = redact

    def format(self, record: logging.LogRecord) -> str:
        """Returns the record formatted as usual, then redacted."""
        return self.redact(super().format(record))
