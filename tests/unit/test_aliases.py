"""Stable model aliases (issue 21 item 6): who may hold which OpenAI name.

The hostile cases first: a user who names a model after another user's alias, dated name or
namespace gets a ``path:line`` error on their own file and changes nothing of the other's.
"""

from __future__ import annotations

from reconciler.builders.serve import llm_config, model_app_config
from reconciler.spec.hashing import model_spec_hash
from reconciler.spec.loader import SourceFile, load
from reconciler.spec.types import DesiredState, ObjectKey

T0 = 1767225600  # 2026-01-01 00:00 UTC
CLUSTER = "kind: Cluster\nusers:\n  alice: {gpus: 2}\n  alice-bob: {gpus: 2}\n  bob: {gpus: 2}\n"


def model(served_name: str | None = None) -> str:
    text = "kind: Model\nsource: Qwen/Qwen2.5-0.5B-Instruct\n"
    return text + (f"served_name: {served_name}\n" if served_name else "")


def state(files: dict[str, str], created: dict[str, int] | None = None) -> DesiredState:
    texts = {"cluster.yaml": CLUSTER, **files}
    return load(
        [SourceFile(p, t.encode(), str(hash(t))) for p, t in texts.items()],
        created=created or {},
        default_time=T0,
    )


def issues(s: DesiredState, path: str) -> list[str]:
    return [f"{i.line}: {i.message}" for i in s.issues if i.path == path]


def key(user: str, name: str) -> ObjectKey:
    return ObjectKey(user, "model", name)


def test_default_alias_is_user_dash_name_and_dated_name_stays() -> None:
    s = state({"users/alice/models/chat.yaml": model()})
    spec = s.models[key("alice", "chat")]
    assert spec.alias == "alice-chat"
    assert spec.served_name == "alice-202601010000-chat"
    assert not s.issues


def test_served_name_sets_the_alias() -> None:
    s = state({"users/alice/models/chat.yaml": model("alice-prod")})
    assert s.models[key("alice", "chat")].alias == "alice-prod"


def test_a_user_cannot_take_another_users_alias() -> None:
    path = "users/bob/models/steal.yaml"
    s = state({"users/alice/models/chat.yaml": model(), path: model("alice-chat")})
    assert issues(s, path) == ["3: served_name: 'alice-chat' must start with 'bob-' (your user name)"]
    assert key("bob", "steal") in s.invalid and key("alice", "chat") in s.models


def test_a_user_cannot_enter_a_longer_users_namespace() -> None:
    """`alice-bob-x` belongs to user alice-bob: alice may not claim it, even by default."""
    explicit = "users/alice/models/a.yaml"
    default = "users/alice/models/bob-x.yaml"
    s = state({explicit: model("alice-bob-x"), default: model(), "users/alice-bob/models/x.yaml": model()})
    assert issues(s, explicit) == ["3: served_name: 'alice-bob-x' lies in user 'alice-bob''s namespace (alice-bob-...)"]
    assert issues(s, default) == [
        "2: the default alias 'alice-bob-x' lies in user 'alice-bob''s namespace (alice-bob-...): set `served_name:`"
    ]
    assert s.models[key("alice-bob", "x")].alias == "alice-bob-x"


def test_an_alias_may_not_look_like_a_dated_name() -> None:
    path = "users/alice/models/chat.yaml"
    s = state({path: model("alice-202601010000-other")})
    assert issues(s, path) == [
        "3: served_name: 'alice-202601010000-other' must not look like a dated served name "
        "(<user>-<YYYYMMDDHHMM>-<name>)"
    ]


def test_a_clash_within_one_user_is_an_error_on_the_later_file() -> None:
    """The earlier file keeps its name whatever the paths sort like; the later one is INVALID."""
    first, later = "users/alice/models/zz-old.yaml", "users/alice/models/aa-new.yaml"
    s = state({first: model("alice-prod"), later: model("alice-prod")}, {first: T0, later: T0 + 60})
    assert issues(s, later) == ["3: served name 'alice-prod' is already used by users/alice/models/zz-old.yaml"]
    assert issues(s, first) == []
    assert s.models[key("alice", "zz-old")].alias == "alice-prod"


def test_an_explicit_alias_cannot_take_an_earlier_models_default_alias() -> None:
    first, later = "users/alice/models/chat.yaml", "users/alice/models/other.yaml"
    s = state({first: model(), later: model("alice-chat")}, {first: T0, later: T0 + 60})
    assert issues(s, later) == ["3: served name 'alice-chat' is already used by users/alice/models/chat.yaml"]


def test_only_an_explicit_alias_reaches_the_app_config_and_hash() -> None:
    """Models without `served_name:` keep their config and hash (no restart when argus learns
    aliases); the router derives `<user>-<name>` from the application name."""
    s = state({"users/alice/models/a.yaml": model(), "users/alice/models/b.yaml": model("alice-prod")})
    a, b = s.models[key("alice", "a")], s.models[key("alice", "b")]
    assert "experimental_configs" not in llm_config(a, s.cluster, "/models/qwen")
    assert llm_config(b, s.cluster, "/models/qwen")["experimental_configs"] == {"argus_alias": "alice-prod"}
    unset = state({"users/alice/models/b.yaml": model()}).models[key("alice", "b")]
    assert model_spec_hash(unset, s.cluster) != model_spec_hash(b, s.cluster)
    app = model_app_config(a, s.cluster, "/models/qwen", "h")
    assert app["name"] == "argus--alice--a"


def test_the_router_takes_an_alias_only_in_the_apps_own_namespace() -> None:
    """An application PUT by code on the cluster under alice's app name cannot route bob's alias."""
    from reconciler.serve_apps.table import alias_of

    assert alias_of("argus--alice--chat", "alice-prod") == "alice-prod"
    assert alias_of("argus--alice--chat", "bob-prod") is None
    assert alias_of("argus--alice--chat", "") == "alice-chat"
    assert alias_of("argus--odd", "odd-x") is None
