"""Push webhook checks (GitHub/Gitea/Gogs HMAC-SHA256 signatures, GitLab's token). Pure.

The header checks run before any body is read; :func:`signature_ok` runs on the complete body.
Header names are compared case-insensitively.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping

HUB = "x-hub-signature-256"
GITEA = ("x-gitea-signature", "x-gogs-signature")
GITLAB = "x-gitlab-token"
SIGNATURE_HEADERS = (HUB, *GITEA, GITLAB)

_HUB_RE = re.compile(r"sha256=[0-9a-fA-F]{64}")
_HEX_RE = re.compile(r"[0-9a-fA-F]{64}")
_TOKEN_RE = re.compile(r"[\x21-\x7e]{1,1024}")


def _lower(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def header_problem(headers: Mapping[str, str]) -> str | None:
    """Why the signature headers are unusable (missing, several, malformed), or None when one is well-formed.

    ``headers`` maps names (any case) to values as received (latin-1 decoded).
    """
    present = [(name, value) for name, value in _lower(headers).items() if name in SIGNATURE_HEADERS]
    if not present:
        return "no X-Hub-Signature-256, X-Gitea-Signature, X-Gogs-Signature or X-Gitlab-Token header"
    name, value = present[0]
    value = value.strip()
    if name == HUB:
        ok = _HUB_RE.fullmatch(value) is not None
    elif name in GITEA:
        ok = _HEX_RE.fullmatch(value) is not None
    else:
        ok = _TOKEN_RE.fullmatch(value) is not None
    return None if ok else f"malformed {name} header"


def signature_ok(headers: Mapping[str, str], body: bytes, secret: str) -> bool:
    """Check a push webhook: GitHub/Gitea/Gogs HMAC-SHA256 signatures or GitLab's token.

    Returns False for a missing or malformed header as well as for a wrong signature.
    """
    if header_problem(headers) is not None:
        return False
    lowered = _lower(headers)
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    hub = lowered.get(HUB, "").strip()
    if hub:
        return hmac.compare_digest(hub.lower().encode(), ("sha256=" + digest).encode())
    gitea = (lowered.get(GITEA[0], "") or lowered.get(GITEA[1], "")).strip()
    if gitea:
        return hmac.compare_digest(gitea.lower().encode(), digest.encode())
    token = lowered.get(GITLAB, "").strip()
    return bool(token) and hmac.compare_digest(token.encode(), secret.encode())


def pushed_ref(body: bytes) -> str | None:
    """The ``ref`` a push event names, or None when the body does not say."""
    try:
        data = json.loads(body or b"{}")
    except ValueError:
        return None
    ref = data.get("ref") if isinstance(data, dict) else None
    return ref if isinstance(ref, str) else None
