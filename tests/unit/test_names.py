"""Every name argus derives from ``(user, kind, name)`` is injective (issue 9 §1).

Each derived name has an inverse here or in the code (``parse_app_name``, ``parse_submission_id``,
``parse_served``): when ``parse(derive(key)) == key`` for every valid key, two different keys can
never share a derived name. The generators use a tiny alphabet heavy in ``-`` and digits, where
collisions live (``a`` + ``b--c`` vs ``a--b`` + ``c``; ``nlp`` + ``intern-grpo`` vs ``nlp-intern`` +
``grpo``; a user ``a-202601010000``).
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.builders.jobs import run_folder
from reconciler.builders.serve import app_name, llm_deployment_name, parse_app_name
from reconciler.spec.hashing import parse_submission_id, submission_id
from reconciler.spec.loader import NAME_RE, USER_RE, classify
from reconciler.spec.types import served_name
from tests.support import task_spec

users = st.one_of(
    st.text(alphabet="ab2-", min_size=1, max_size=10),
    st.text(alphabet="abcxyz0123456789-", min_size=1, max_size=31),
).filter(lambda u: bool(USER_RE.match(u)))
names = st.one_of(
    st.text(alphabet="ab2-", min_size=1, max_size=10),
    st.text(alphabet="abcxyz0123456789-", min_size=1, max_size=63),
).filter(lambda n: bool(NAME_RE.match(n)))
stamps = st.integers(min_value=0, max_value=253402300799)  # up to 9999-12-31


def parse_served(served: str) -> tuple[str, int, str]:
    """Inverse of ``served_name``: the first all-digit part is the stamp (every part of a user
    name starts with a letter, so no user part is all digits)."""
    parts = served.split("-")
    k = next(i for i, p in enumerate(parts) if p.isdigit())
    return "-".join(parts[:k]), int(parts[k]), "-".join(parts[k + 1 :])


def stamp_of(created_at: int) -> int:
    import time

    return int(time.strftime("%Y%m%d%H%M", time.gmtime(created_at)))


@settings(max_examples=400, deadline=None)
@given(users, names)
def test_app_and_deployment_names_parse_back(user: str, name: str) -> None:
    assert parse_app_name(app_name(user, name)) == (user, name)


@settings(max_examples=400, deadline=None)
@given(users, names, stamps)
def test_served_name_parses_back(user: str, name: str, created_at: int) -> None:
    served = served_name(user, name, created_at)
    assert parse_served(served) == (user, stamp_of(created_at), name)
    # Ray Serve LLM's deployment name maps '/' and '.', which served names never contain.
    assert llm_deployment_name(served) == "LLMServer:" + served


@settings(max_examples=400, deadline=None)
@given(users, names, st.integers(min_value=1, max_value=50))
def test_submission_id_and_run_folder_parse_back(user: str, name: str, attempt: int) -> None:
    task = task_spec(user, name)
    sid = submission_id(task, attempt)
    parsed = parse_submission_id(sid)
    assert parsed is not None and parsed[:2] == (user, name) and parsed[3] == attempt
    assert len(sid) <= 128  # Ray uses it in actor and log file names
    folder = run_folder("/shared/users", user, name, sid)
    assert posixpath.relpath(folder, "/shared/users").split("/") == [user, "jobs", name, sid]


@settings(max_examples=300, deadline=None)
@given(users, names, users, names)
def test_two_keys_never_share_a_derived_name(u1: str, n1: str, u2: str, n2: str) -> None:
    if (u1, n1) == (u2, n2):
        return
    assert app_name(u1, n1) != app_name(u2, n2)
    assert served_name(u1, n1, 0) != served_name(u2, n2, 0)
    t1, t2 = task_spec(u1, n1), task_spec(u2, n2)
    t2 = replace(t2, raw=t1.raw)  # identical content: the key alone must tell them apart
    assert submission_id(t1) != submission_id(t2)
    assert run_folder("/u", u1, n1, submission_id(t1)) != run_folder("/u", u2, n2, submission_id(t2))


def test_the_reported_collisions_cannot_happen() -> None:
    # users `a` and `a--b`, models `b--c` and `c`: both were argus--a--b--c.
    assert classify("users/a--b/models/c.yaml")[0] is None
    assert classify("users/a/models/b--c.yaml")[0] is None
    # nlp/tasks/intern-grpo vs nlp-intern/tasks/grpo with identical content shared one id.
    one = task_spec("nlp", "intern-grpo")
    two = replace(task_spec("nlp-intern", "grpo"), raw=one.raw)
    assert submission_id(one) != submission_id(two)
    # user `a-202601010000` + `x` vs user `a` + `202611010000-x`: one served name.
    assert classify("users/a-202601010000/models/x.yaml")[0] is None
    assert classify("users/a/models/202611010000-x.yaml")[0] is not None
    # Names ending in '-' would make `--` ambiguous again.
    assert classify("users/a-/models/x.yaml")[0] is None and classify("users/a/models/x-.yaml")[0] is None


def test_old_style_names_still_rejected_with_a_clear_rule() -> None:
    key, problem = classify("users/team-2/models/chat.yaml")
    assert key is None and problem is not None and "starting with a letter" in problem
    assert re.search(r"must match", problem)
