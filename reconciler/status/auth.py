"""Authentication of argus's own records in git: status commits, notes and the lease. Pure.

Everything argus writes to the repository is readable and, on a remote without branch
protection (or a local bare repository without hooks), writable by every user. So a status
commit, a note or a lease is argus's only when it carries a MAC that verifies under the
*status key*, which is derived from the daemon's ownership key (never written to git nor
passed to jobs):

- a status commit ends with the trailer ``Argus-Auth: v1 <hex>``, an HMAC-SHA256 over its
  tree id, its parent ids and the rest of its message: whoever can make one has the key;
- a note ends with the same trailer, over the annotated commit and the note's text;
- a lease commit's JSON message carries ``"auth"``, over the holder and the expiry.

A tree id names the whole tree's content (git's object hashing, with SHA-1 collision
detection), so the MAC covers every document of the commit.
"""

from __future__ import annotations

import hashlib
import hmac
import re

TRAILER = "Argus-Auth"
_VERSION = "v1"
_KEY_CONTEXT = b"argus-status-key-v1"
_TRAILER_LINE = re.compile(rf"(?:\A|\n){TRAILER}: {_VERSION} ([0-9a-f]{{64}})\n*\Z")


def status_key(ownership_key: bytes) -> bytes:
    """The key that authenticates argus's git records, derived from the ownership key (a key
    of its own: a MAC over a status commit can never pass for a job's ownership proof)."""
    return hmac.new(ownership_key, _KEY_CONTEXT, hashlib.sha256).digest()


def _mac(key: bytes, *fields: bytes) -> str:
    # NUL-separated: no field (ids, holder names, texts argus wrote) ends in a NUL that could
    # shift the boundary; each kind of record has its own context.
    return hmac.new(key, b"\0".join(fields), hashlib.sha256).hexdigest()


def _with_trailer(text: str, mac: str) -> str:
    return text.rstrip("\n") + f"\n\n{TRAILER}: {_VERSION} {mac}\n"


def split_trailer(text: str) -> tuple[str, str | None]:
    """``(text without the trailer, the MAC)``; the MAC is None when there is no trailer."""
    match = _TRAILER_LINE.search(text)
    if match is None:
        return text, None
    return text[: match.start()].rstrip("\n") + "\n", match.group(1)


def has_trailer(text: str) -> bool:
    """True when ``text`` carries an ``Argus-Auth`` trailer (valid or not)."""
    return f"\n{TRAILER}: " in f"\n{text}"


def _commit_mac(key: bytes, tree: str, parents: list[str], message: str) -> str:
    return _mac(key, b"argus-status-commit-v1", tree.encode(), " ".join(parents).encode(), message.encode())


def sign_commit_message(key: bytes, tree: str, parents: list[str], message: str) -> str:
    """``message`` with the trailer that makes the commit of ``tree`` on ``parents`` argus's."""
    body = message.rstrip("\n") + "\n"
    return _with_trailer(body, _commit_mac(key, tree, parents, body))


def commit_verifies(key: bytes, tree: str, parents: list[str], message: str) -> bool:
    """True when a commit of ``tree`` on ``parents`` with ``message`` was made with ``key``."""
    body, mac = split_trailer(message)
    return mac is not None and hmac.compare_digest(mac, _commit_mac(key, tree, parents, body))


def _note_mac(key: bytes, commit: str, text: str) -> str:
    return _mac(key, b"argus-note-v1", commit.encode(), text.encode())


def sign_note(key: bytes, commit: str, text: str) -> str:
    """The note ``text`` of ``commit``, with its trailer."""
    body = text.rstrip("\n") + "\n"
    return _with_trailer(body, _note_mac(key, commit, body))


def note_verifies(key: bytes, commit: str, text: str) -> bool:
    """True when ``text`` is a note argus wrote on ``commit`` with ``key``."""
    body, mac = split_trailer(text)
    return mac is not None and hmac.compare_digest(mac, _note_mac(key, commit, body))


def lease_mac(key: bytes, holder: str, expires: float) -> str:
    """The ``auth`` field of a lease held by ``holder`` until ``expires``."""
    return _mac(key, b"argus-lease-v1", holder.encode(), repr(float(expires)).encode())


def lease_verifies(key: bytes, data: dict[str, object]) -> bool:
    """True when the lease ``data`` (its JSON message) was written with ``key``."""
    holder, expires, auth = data.get("holder"), data.get("expires"), data.get("auth")
    if not isinstance(holder, str) or not isinstance(expires, (int, float)) or not isinstance(auth, str):
        return False
    return hmac.compare_digest(auth, lease_mac(key, holder, float(expires)))
