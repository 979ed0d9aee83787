"""Who may call which model (issue 33 item 2): the ``access:`` field of a model file, cluster.yaml's
``serving.default_access``, and the endpoint's decision (:func:`reconciler.endpoint.gate.may_call`).

Pure: files in, specs and ``path:line`` issues out; the decision is a function of the caller, the
model's owner and its access list. The endpoint applying it is in tests/unit/test_endpoint.py.
"""

from __future__ import annotations

import pytest

from reconciler.endpoint.gate import Caller, may_call
from reconciler.spec.hashing import model_spec_hash
from reconciler.spec.loader import SourceFile, load
from reconciler.spec.types import DesiredState, ObjectKey

T0 = 1767225600
USERS = "users:\n  alice: {}\n  bob: {}\n  carl: {}\nteams:\n  research: {members: [alice, carl]}\n"
MODEL = "kind: Model\nsource: Qwen/Qwen2.5-0.5B-Instruct\n"
ALICE = ObjectKey("alice", "model", "m")
PATH = "users/alice/models/m.yaml"


def state(model: str, cluster: str = "kind: Cluster\n" + USERS) -> DesiredState:
    texts = {"cluster.yaml": cluster, PATH: model}
    return load([SourceFile(p, t.encode(), str(hash(t))) for p, t in texts.items()], created={}, default_time=T0)


def issues(s: DesiredState, path: str = PATH) -> list[str]:
    return [f"{i.line}: {i.message}" for i in s.issues if i.path == path]


@pytest.mark.parametrize(
    ("caller", "access", "allowed"),
    [
        (Caller("bob", None), None, True),  # no rule: everyone with a key
        (Caller("bob", None), frozenset(), False),  # []: the owner only
        (Caller("alice", "research"), frozenset(), True),  # the owner always may
        (Caller("bob", None), frozenset({"bob"}), True),  # by user name
        (Caller("carl", "research"), frozenset({"research"}), True),  # by team
        (Caller("bob", "product"), frozenset({"research"}), False),
        (Caller("bob", None), frozenset({"research", "*"}), True),  # "*": everyone with a key
        (Caller("research", None), frozenset({"research"}), True),  # a name is a user or a team
    ],
)
def test_may_call(caller: Caller, access: frozenset[str] | None, allowed: bool) -> None:
    assert may_call(caller, "alice", access) is allowed


def test_access_as_written_else_the_cluster_default_else_everyone() -> None:
    s = state(MODEL + "access: [research, bob]\n")
    assert issues(s) == [] and s.models[ALICE].access == ("research", "bob")
    assert s.models[ALICE].access_in(s.cluster) == ("research", "bob")
    s = state(MODEL)
    assert s.models[ALICE].access is None and s.models[ALICE].access_in(s.cluster) is None
    s = state(MODEL, "kind: Cluster\n" + USERS + "serving:\n  default_access: [research]\n")
    assert issues(s, "cluster.yaml") == [] and s.models[ALICE].access_in(s.cluster) == ("research",)
    s = state(MODEL + "access: ['*']\n", "kind: Cluster\n" + USERS + "serving:\n  default_access: []\n")
    assert s.models[ALICE].access_in(s.cluster) is None  # a model opts out of a closed default
    s = state(MODEL + "access: []\n")
    assert s.models[ALICE].access_in(s.cluster) == ()


def test_a_name_that_is_neither_user_nor_team_is_an_error_at_its_line() -> None:
    s = state(MODEL + "access:\n  - bob\n  - bbo\n")
    assert issues(s) == ["5: access[1]: 'bbo' is neither a user nor a team in cluster.yaml"]
    assert ALICE in s.invalid
    s = state(MODEL, "kind: Cluster\n" + USERS + "serving:\n  default_access: [nobody]\n")
    assert [i for i in issues(s, "cluster.yaml") if "nobody" in i] == [
        "9: serving.default_access[0]: 'nobody' is neither a user nor a team in cluster.yaml"
    ]
    # A cluster that does not declare its users cannot tell a typo from a user yet to come.
    s = state(MODEL + "access: [someone]\n", "kind: Cluster\n")
    assert issues(s) == []


def test_bad_access_values_are_schema_errors_at_their_line() -> None:
    for bad, line in (("access: bob\n", 3), ("access: [Bob]\n", 3), ("access: [bob, bob]\n", 3)):
        s = state(MODEL + bad)
        assert issues(s) and all(i.startswith(f"{line}: access") for i in issues(s)), (bad, issues(s))


def test_access_is_not_part_of_the_spec_hash() -> None:
    """Changing who may call a model reaches the router in place: its replicas never restart."""
    open_, closed = state(MODEL), state(MODEL + "access: []\n")
    a, b = open_.models[ALICE], closed.models[ALICE]
    assert model_spec_hash(a, open_.cluster) == model_spec_hash(b, closed.cluster)
