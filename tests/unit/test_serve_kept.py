"""Serve kept as argus declares it: which applications go, which are restored, the allow list.

The decision (:func:`reconciler.plan.serve_kept.keep_decision`) is pure; whole ticks run against
:class:`~tests.unit.fake_ray.FakeRay`, which treats imperative (``serve.run``) apps as Ray 2.60 does:
a PUT that leaves one out does not touch it, a PUT that names one makes it declarative.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply.serve import SERVE_EVENT_KEEP_S, TAKE_OVER_IMPORT_PATH, ServeEventLog, apply_serve
from reconciler.builders.serve import ROUTER_APP, app_name, is_owned_app, normalise_app, router_app_config
from reconciler.dashboard import DashboardError
from reconciler.observe.serve import observe_serve
from reconciler.plan.assess import ObjectStatus
from reconciler.plan.serve_kept import (
    MAX_EVENT_CHARS,
    SeenApp,
    ServeEvent,
    config_digest,
    keep_decision,
    kept_digests,
    with_serve_events,
)
from reconciler.source.remote import open_source
from reconciler.spec.loader import SourceFile, load
from reconciler.spec.types import ClusterSpec, ObjectKey, Serving
from tests.support import ConfigRepo, Ticker, cluster_yaml, ticker
from tests.unit.fake_ray import FakeRay
from tests.unit.test_fuzz_ticks import AllowAll

CPU = ClusterSpec(serving=Serving(accelerator="cpu"))
BOB = ObjectKey("bob", "model", "chat")
BOB_APP = app_name("bob", "chat")
ROUTER = normalise_app(router_app_config(CPU))
MODEL = normalise_app(
    {"name": BOB_APP, "route_prefix": None, "import_path": "reconciler.serve_apps.model_app:build_app"}
)


def seen(
    name: str, route: str | None, *, imperative: bool = False, config: Any = None, status: str = "RUNNING"
) -> SeenApp:
    return SeenApp(name, route, imperative, normalise_app(config) if config is not None else None, status)


def decide(apps: list[SeenApp], allowed: tuple[str, ...] = (), kept: dict[str, str] | None = None) -> Any:
    return keep_decision(
        {a.name: a for a in apps},
        {ROUTER_APP: ROUTER, BOB_APP: MODEL},
        owned=is_owned_app,
        allowed=allowed,
        kept=kept,
    )


# --- the decision (pure) ---------------------------------------------------------------------------


def test_as_declared_nothing_goes_and_nothing_is_restored() -> None:
    d = decide([seen(ROUTER_APP, "/", config=ROUTER), seen(BOB_APP, None, config=MODEL)])
    assert not (d.remove or d.take_over or d.restore or d.events)


@pytest.mark.parametrize("route", ["/", "/v1", "/argus", "/v1/chat/completions"])
def test_foreign_apps_with_a_route_go_imperative_or_declarative(route: str) -> None:
    d = decide([seen("metrics-cache", route, imperative=True), seen("shadow", route, config={"name": "shadow"})])
    assert d.take_over == {"metrics-cache"} and d.remove == {"shadow"} and not d.carry
    assert [(e.app, e.kind) for e in d.events] == [("metrics-cache", "removed"), ("shadow", "removed")]
    assert f"route {route}" in d.events[0].text() and "imperative" in d.events[0].text()


def test_foreign_apps_without_a_route_and_allowed_ones_stay() -> None:
    d = decide(
        [
            seen("batch", None, imperative=True),
            seen("offline", None, config={"name": "offline", "route_prefix": None}),
            seen("dash", "/dash", imperative=True),
            seen("grafana", "/grafana", config={"name": "grafana", "route_prefix": "/grafana"}),
        ],
        allowed=("dash", "grafana"),
    )
    assert not (d.remove or d.take_over or d.events)
    assert d.carry == {"offline", "grafana"}  # declarative ones the PUT carries as deployed


def test_apps_being_deleted_are_left_to_finish() -> None:
    d = decide([seen("shadow", "/v1", imperative=True, status="DELETING")])
    assert not (d.take_over or d.events)


def test_argus_apps_replaced_by_serve_run_are_restored() -> None:
    d = decide([seen(ROUTER_APP, "/", imperative=True), seen(BOB_APP, "/argus", imperative=True)])
    # Removed first (a PUT of argus's config would leave the job's deployments serving until argus's
    # build is done), deployed again once Serve has deleted them.
    assert d.take_over == d.hold == {ROUTER_APP, BOB_APP} and not d.restore
    assert all("imperative serve.run" in e.text() and "removed first" in e.text() for e in d.events)
    assert decide([seen(ROUTER_APP, "/", config=ROUTER, status="DELETING")]).hold == {ROUTER_APP}


def test_an_argus_app_moved_to_a_route_is_restored_without_memory() -> None:
    moved = {**MODEL, "route_prefix": "/v1"}
    d = decide([seen(BOB_APP, "/v1", config=moved)])
    assert d.restore == {BOB_APP} and "route /v1" in d.events[0].detail and "no route" in d.events[0].detail
    evil = {**moved, "import_path": "evil:app"}  # someone else's code: removed first
    assert decide([seen(BOB_APP, "/v1", config=evil)]).remove == {BOB_APP}


def test_a_changed_argus_app_is_restored_once_it_ran_as_declared() -> None:
    changed = {**ROUTER, "args": {"table": 99}}
    # Never seen running as declared (a restart, or argus's own change in flight): not an event.
    assert not decide([seen(ROUTER_APP, "/", config=changed)]).events
    # Seen running as declared before: someone else changed it. Its code (args) changed: removed first.
    d = decide([seen(ROUTER_APP, "/", config=changed)], kept={ROUTER_APP: config_digest(ROUTER)})
    assert d.remove == d.hold == {ROUTER_APP} and not d.restore
    assert "args.table: 99 → 4" in d.events[0].detail
    # Only its deployments' settings changed (the same code): set back in place.
    table = {**ROUTER, "deployments": [{"name": "ArgusRouter", "user_config": {"models": [["x", "y", "z", ""]]}}]}
    d = decide([seen(ROUTER_APP, "/", config=table)], kept={ROUTER_APP: config_digest(ROUTER)})
    assert d.restore == {ROUTER_APP} and not d.hold


def test_argus_namespace_apps_argus_does_not_declare_go_only_with_a_route() -> None:
    d = decide([seen("argus--eve--x", "/x", imperative=True), seen("argus--eve--y", None, imperative=True)])
    assert d.take_over == {"argus--eve--x"} and [e.app for e in d.events] == ["argus--eve--x"]


def test_kept_digests_follow_what_runs_as_declared() -> None:
    apps = {ROUTER_APP: seen(ROUTER_APP, "/", config=ROUTER), BOB_APP: seen(BOB_APP, "/v1", imperative=True)}
    target = {ROUTER_APP: ROUTER, BOB_APP: MODEL}
    kept = kept_digests(apps, target, {})
    assert kept == {ROUTER_APP: config_digest(ROUTER)}
    # Tampered now: the entry stays while argus declares the same config; a new config drops it.
    tampered = {ROUTER_APP: seen(ROUTER_APP, "/", config={**ROUTER, "args": {}})}
    assert kept_digests(tampered, target, kept) == kept
    assert kept_digests(tampered, {ROUTER_APP: {**ROUTER, "args": {"table": 5}}}, kept) == {}


def test_event_texts_are_bounded() -> None:
    long = ServeEvent("x" * 1000, "removed", "y" * 1000)
    assert len(long.text()) == MAX_EVENT_CHARS


def test_events_go_on_the_model_status_or_into_the_notes() -> None:
    statuses = {BOB: ObjectStatus(BOB, "RUNNING", "Synced", reason="serving")}
    out, notes = with_serve_events(statuses, [(BOB, "restored it"), (None, "removed shadow")])
    assert out[BOB].reason == "serving; restored it" and notes == ["removed shadow"]
    assert statuses[BOB].reason == "serving"  # not changed


def test_the_event_log_keeps_recent_events_bounded_and_redacted() -> None:
    log = ServeEventLog()
    events = log.record(
        [ServeEvent(BOB_APP, "restored", "token=hf_abcdefghijklmnop"), ServeEvent("s", "removed", "x")], 1000.0
    )
    assert [k for k, _ in events] == [BOB, None]
    assert "hf_abcdefghijklmnop" not in events[0][1] and "1970-01-01T00:16:40Z" in events[0][1]
    assert len(log.record([], 1000.0 + SERVE_EVENT_KEEP_S + 1)) == 0


# --- the allow list in cluster.yaml -------------------------------------------------------------------


def test_allowed_apps_are_loaded_and_checked_at_their_line() -> None:
    ok = load([SourceFile("cluster.yaml", b"kind: Cluster\nserving:\n  allowed_apps: [grafana, team.x]\n", "b1")])
    assert ok.cluster_valid and ok.cluster.serving.allowed_apps == ("grafana", "team.x")
    text = b"kind: Cluster\nserving:\n  allowed_apps:\n    - grafana\n    - argus-router\n"
    bad = load([SourceFile("cluster.yaml", text, "b2")])
    assert not bad.cluster_valid
    assert [str(i) for i in bad.issues] == [
        "cluster.yaml:5: serving.allowed_apps[1]: 'argus-router' is in argus's own namespace (argus*): argus keeps "
        "its applications as it declares them and never lets another take their names"
    ]
    typed = load([SourceFile("cluster.yaml", b"kind: Cluster\nserving:\n  allowed_apps: [ok, 3]\n", "b3")])
    assert not typed.cluster_valid and typed.issues[0].line == 3 and "allowed_apps" in str(typed.issues[0])


# --- whole ticks against FakeRay --------------------------------------------------------------------


def _repo(tmp_path: Path, **serving: Any) -> ConfigRepo:
    repo = ConfigRepo(tmp_path)
    doc = cluster_yaml(tmp_path / "hf", tmp_path / "users", 8000)
    doc["serving"].update(serving, proxy_location="EveryNode")  # FakeRay's
    repo.write("cluster.yaml", doc)
    repo.write("users/bob/models/chat.yaml", {"kind": "Model", "source": "$HOME/models/chat", "replicas": 1})
    repo.commit_push("objects")
    return repo


def _ticker(repo: ConfigRepo, ray: FakeRay) -> Ticker:
    source = open_source(str(repo.bare), str(repo.bare) + "-cache")
    return ticker(source, "main", ray, fs=AllowAll(), secrets_env={}, task_check=lambda t, c: [])


def test_a_tick_removes_shadow_apps_and_restores_argus_apps(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ray = FakeRay(gpus=8)
    t = _ticker(_repo(tmp_path), ray)
    t.tick()
    declared = {n: normalise_app(a) for n, a in ray.apps.items()}
    assert set(declared) == {ROUTER_APP, BOB_APP}
    assert not [n for n in t.tick().notes if "Serve application" in n]  # as declared: nothing to say
    puts = ray.puts

    for route in ("/", "/v1", "/argus"):
        ray.serve_run(f"shadow{route.strip('/')}", route)
    ray.serve_run(ROUTER_APP, "/")  # replaces the router
    ray.serve_run(BOB_APP, "/argus/usage")  # replaces bob's model application
    ray.apps["declared-shadow"] = {"name": "declared-shadow", "route_prefix": "/v1/models", "import_path": "x:y"}
    ray.apps["batch"] = {"name": "batch", "route_prefix": None, "import_path": "x:y"}  # no route: stays
    ray.serve_run("offline", None)  # imperative without a route: stays
    with caplog.at_level(logging.WARNING, logger="reconciler.apply.serve"):
        result = t.tick()

    assert not ray.imperative.keys() - {"offline"}
    assert set(ray.apps) == {"batch"}  # argus's own replaced apps are removed first ...
    take_over, final = ray.put_bodies[-2], ray.put_bodies[-1]
    assert ray.puts == puts + 2  # the take-over, then the declared set
    result = t.tick()  # ... and deployed again once Serve has deleted them
    assert set(ray.apps) == {ROUTER_APP, BOB_APP, "batch"}
    assert {n: normalise_app(ray.apps[n]) for n in declared} == declared  # restored exactly
    assert {a["name"] for a in take_over["applications"]} >= {"shadow", "shadowv1", "shadowargus", ROUTER_APP}
    assert all(a["import_path"] == TAKE_OVER_IMPORT_PATH for a in take_over["applications"] if "shadow" in a["name"])
    assert {a["name"] for a in final["applications"]} == {"batch"}
    # Each event is on the object's status (bob's model) or in the status notes (router, foreign).
    bob = result.statuses[BOB]
    assert "restored" in bob.reason and "imperative serve.run" in bob.reason
    notes = "\n".join(result.notes)
    for name in ("shadow", "shadowv1", "shadowargus", "declared-shadow", ROUTER_APP):
        assert f"Serve application '{name}'" in notes, notes
    assert "'batch'" not in notes and "'offline'" not in notes
    logged = [json.loads(r.getMessage()) for r in caplog.records if r.getMessage().startswith("{")]
    assert {e["app"] for e in logged if e["event"] == "serve_kept"} >= {"shadow", ROUTER_APP, BOB_APP}
    # The events stay on the status for a while (a superseded status write cannot lose them) ...
    again = t.tick()
    assert "restored" in again.statuses[BOB].reason
    assert ray.puts == puts + 3  # ... and nothing more is sent: Serve is as declared


def test_allowed_apps_stay_with_their_routes(tmp_path: Path) -> None:
    ray = FakeRay(gpus=8)
    t = _ticker(_repo(tmp_path, allowed_apps=["grafana", "dash"]), ray)
    ray.serve_run("dash", "/dash")
    ray.apps["grafana"] = {"name": "grafana", "route_prefix": "/grafana", "import_path": "g:app"}
    result = t.tick()
    assert ray.imperative == {"dash": "/dash"} and ray.apps["grafana"]["route_prefix"] == "/grafana"
    assert not any("Serve application" in n for n in result.notes)


def test_a_tampered_model_config_with_its_spec_hash_is_deployed_again(tmp_path: Path) -> None:
    ray = FakeRay(gpus=8)
    t = _ticker(_repo(tmp_path), ray)
    t.tick()
    t.tick()
    good = json.loads(json.dumps(ray.apps[BOB_APP]))
    evil = {**good, "route_prefix": "/v1", "import_path": "evil:app"}  # same args, spec hash and all
    ray.apps[BOB_APP] = evil
    result = t.tick()
    assert BOB_APP not in ray.apps  # someone else's code under bob's name: removed first
    t.tick()
    assert normalise_app(ray.apps[BOB_APP]) == normalise_app(good)
    assert "restored" in result.statuses[BOB].reason and "route /v1" in result.statuses[BOB].reason


def test_a_refused_take_over_is_a_status_with_a_back_off_never_an_exit() -> None:
    class Refusing(FakeRay):
        refused = 0

        def request(self, method: str, path: str, body: Any = None, *, timeout: float | None = None) -> Any:
            if method == "PUT" and any(a.get("import_path") == TAKE_OVER_IMPORT_PATH for a in body["applications"]):
                self.refused += 1
                raise DashboardError("PUT", path, 400, "refused")
            return super().request(method, path, body, timeout=timeout)

    ray = Refusing()
    ray.serve_run("shadow", "/v1")
    memo: dict[str, Any] = {}
    events: list[ServeEvent] = []
    now = [100.0]
    assert apply_serve(ray, [], observe_serve(ray), CPU, memo=memo, events=events, clock=lambda: now[0])
    assert ray.imperative == {"shadow": "/v1"} and ROUTER_APP in ray.apps  # the router still went out
    assert [e.kind for e in events] == ["removed", "failed"] and "retried in 2s" in events[-1].detail
    events.clear()
    now[0] += 1.0  # within the back-off: not tried, said so
    apply_serve(ray, [], observe_serve(ray), CPU, memo=memo, events=events, clock=lambda: now[0])
    assert events[-1].kind == "failed" and "retried in" in events[-1].detail
    refused = ray.refused
    now[0] += 5.0  # due again: tried (and refused) once more
    apply_serve(ray, [], observe_serve(ray), CPU, memo=memo, events=events, clock=lambda: now[0])
    assert ray.refused == refused + 1 and "retried in 4s" in events[-1].detail


def test_a_carried_model_app_changed_under_its_spec_hash_is_set_back(tmp_path: Path) -> None:
    ray = FakeRay(gpus=8)
    t = _ticker(_repo(tmp_path), ray)
    t.tick()
    t.tick()
    good = json.loads(json.dumps(ray.apps[BOB_APP]))
    evil = json.loads(json.dumps(good))
    evil["args"]["llm_config"]["runtime_env"]["env_vars"]["VLLM_LOGGING_CONFIG_PATH"] = "/tmp/evil.json"
    ray.apps[BOB_APP] = evil  # same spec hash, route and code: the planner sees nothing to change
    result = t.tick()
    t.tick()  # its args changed (a new build): removed first, deployed again on the next tick
    assert normalise_app(ray.apps[BOB_APP]) == normalise_app(good)
    reason = result.statuses[BOB].reason
    assert "changed by someone else" in reason and "VLLM_LOGGING_CONFIG_PATH: /tmp/evil.json → (unset)" in reason
    puts = ray.puts
    t.tick()
    assert ray.puts == puts  # as declared again: nothing more is sent
