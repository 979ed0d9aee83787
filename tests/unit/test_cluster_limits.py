"""Rate limits in cluster.yaml (issue 33 item 3, daemon side): ``serving.limits``, ``users.<u>`` and
``teams.<t>`` requests/tokens per minute, their path:line errors, and the router's ``limits`` and
``daemon`` in the user_config :func:`reconciler.builders.serve.router_app_config` builds. Pure."""

from __future__ import annotations

from reconciler.builders.serve import gate_config, router_app_config, router_limits
from reconciler.spec.loader import SourceFile, load
from reconciler.spec.types import ClusterSpec, DesiredState, Limits, Serving, Team, UserPolicy

T0 = 1767225600
BASE = "kind: Cluster\nusers:\n  alice: {}\n  bob: {}\nteams:\n  vision: {members: [bob]}\n"


def state(cluster: str) -> DesiredState:
    return load([SourceFile("cluster.yaml", cluster.encode(), str(hash(cluster)))], created={}, default_time=T0)


def issues(s: DesiredState) -> list[str]:
    return [f"{i.line}: {i.message}" for i in s.issues if i.path == "cluster.yaml"]


def test_limits_are_read_from_serving_users_and_teams() -> None:
    text = (
        "kind: Cluster\n"
        "serving:\n  limits: {requests_per_minute: 600, tokens_per_minute: 200000}\n"
        "users:\n  alice: {gpus: 4, requests_per_minute: 1200, tokens_per_minute: 400000}\n  bob: {}\n"
        "teams:\n  vision: {members: [bob], requests_per_minute: 2000}\n"
    )
    s = state(text)
    assert issues(s) == []
    assert s.cluster.serving.limits == Limits(600, 200000)
    assert s.cluster.users is not None
    assert s.cluster.users["alice"] == UserPolicy(gpus=4, requests_per_minute=1200, tokens_per_minute=400000)
    assert s.cluster.users["bob"] == UserPolicy()
    assert (s.cluster.teams["vision"].requests_per_minute, s.cluster.teams["vision"].tokens_per_minute) == (2000, None)


def test_no_limits_by_default() -> None:
    s = state(BASE)
    assert issues(s) == [] and s.cluster.serving.limits == Limits()
    assert router_limits(s.cluster) is None


def test_bad_limits_are_errors_at_their_line() -> None:
    cases = [
        ("serving:\n  limits: {requests_per_minute: 0}\n", 8, "serving.limits.requests_per_minute"),
        ("serving:\n  limits:\n    tokens_per_minute: -5\n", 9, "serving.limits.tokens_per_minute"),
        ("serving:\n  limits: {requests_per_minute: 1.5}\n", 8, "serving.limits.requests_per_minute"),
        ("serving:\n  limits: {requests_per_minute: lots}\n", 8, "serving.limits.requests_per_minute"),
        ("serving:\n  limits: {requests_per_hour: 5}\n", 8, "serving.limits"),
    ]
    for extra, line, where in cases:
        found = issues(state(BASE + extra))
        assert found and all(i.startswith(f"{line}: {where}") for i in found), (extra, found)
    found = issues(state("kind: Cluster\nusers:\n  alice: {tokens_per_minute: 0}\n"))
    assert found and found[0].startswith("3: users.alice.tokens_per_minute"), found
    found = issues(state(BASE.replace("[bob]}", "[bob], requests_per_minute: -1}")))
    assert found and found[0].startswith("6: teams.vision.requests_per_minute"), found


CLUSTER = ClusterSpec(
    serving=Serving(accelerator="cpu", limits=Limits(requests_per_minute=600)),
    users={"alice": UserPolicy(tokens_per_minute=400000), "bob": UserPolicy()},
    teams={"vision": Team("vision", members=("bob",), requests_per_minute=2000)},
)


def test_limits_travel_to_the_endpoint_with_keys_only() -> None:
    # alice's own tokens limit; her requests limit is the default's (cluster.yaml overrides key by key).
    limits = {"default": [600, None], "users": {"alice": [600, 400000]}, "teams": {"vision": [2000, None]}}
    assert router_limits(CLUSTER) == limits
    assert gate_config(CLUSTER, keys={"h": "alice"})["limits"] == limits
    # Without a keys file callers are unknown: nothing to limit per user (documented open endpoint).
    assert "limits" not in gate_config(CLUSTER, keys=None)
    # Keys but no limit set anywhere: no `limits` entry.
    assert "limits" not in gate_config(ClusterSpec(serving=Serving(accelerator="cpu")), keys={"h": "a"})


def test_no_limit_and_no_key_is_ever_in_the_routers_serve_config() -> None:
    """Any job reads and rewrites Serve configs: the router's carries the model table only."""
    config = router_app_config(CLUSTER, [])["deployments"][0]["user_config"]
    assert config == {"models": []}
