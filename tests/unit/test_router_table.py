"""The model table the daemon pushes to the router (builder) and how the router reads it (pure parts)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from reconciler.apply.serve import target_apps
from reconciler.builders.serve import model_app_config, router_app_config, router_table
from reconciler.observe.serve import parse_serve_details
from reconciler.serve_apps.router import Route, claim_names
from reconciler.serve_apps.table import MAX_TABLE_ENTRIES, REFRESH_BOUNDS_S, SAFETY_REFRESH_S, Entry, parse_table
from reconciler.spec.types import ClusterSpec, ModelSpec, ObjectKey, Serving

CPU = ClusterSpec(serving=Serving(accelerator="cpu", cpus_per_replica=1.0))


def spec(user: str = "alice", name: str = "chat", alias: str | None = None, created: int = 1764417600) -> ModelSpec:
    return ModelSpec(
        key=ObjectKey(user, "model", name),
        source="hf:org/model",
        source_path="/hf/model",
        source_task=None,
        replicas=1,
        gpus_per_replica=1,
        engine_kwargs={"max_model_len": 256},
        env={},
        suspend=False,
        created_at=created,
        alias_field=alias,
    )


def app(m: ModelSpec) -> dict[str, Any]:
    return model_app_config(m, CPU, "/hf/model", "h")


def test_the_table_names_each_model_app_once_with_its_deployment_id_and_alias() -> None:
    chat, prod = spec(), spec(name="big", alias="alice-prod")
    rows = router_table([app(prod), app(chat)])
    assert rows == [
        ["argus--alice--big", f"LLMServer:{prod.served_name}", prod.served_name, "alice-prod"],
        # The default alias is sent empty: the router derives <user>-<name> from the app name.
        ["argus--alice--chat", f"LLMServer:{chat.served_name}", chat.served_name, ""],
    ]
    assert rows[0][1] == app(prod)["deployments"][0]["name"]  # the deployment the app really has
    # An application carried as Serve reports it (JSON) gives the same row.
    assert router_table([json.loads(json.dumps(app(chat)))]) == rows[1:]


def test_the_table_leaves_out_what_is_not_an_argus_model_app() -> None:
    odd: list[dict[str, Any]] = [
        {"name": "someone-else", "args": app(spec())["args"]},
        {"name": "argus-router"},
        {"name": "argus--no-model"},
        {"name": "argus--alice--x", "args": {"llm_config": {"model_loading_config": {"model_id": ""}}}},
        {"name": "argus--alice--y", "args": "not a mapping"},
    ]
    assert router_table(odd) == []


def test_the_router_config_changes_with_the_model_set_only() -> None:
    a, b = app(spec(name="a")), app(spec(name="b"))
    one, two = router_app_config(CPU, [a]), router_app_config(CPU, [b, a])
    assert one == router_app_config(CPU, [a])  # same models, same config: no PUT, no reconfigure
    assert {k: v for k, v in one.items() if k != "deployments"} == {k: v for k, v in two.items() if k != "deployments"}
    assert one["deployments"][0]["user_config"] == {"models": router_table([a])}
    assert two["deployments"][0]["user_config"] == {"models": router_table([a, b])}  # order does not matter


def test_target_apps_table_lists_exactly_the_model_apps_the_put_deploys() -> None:
    a = app(spec(name="a"))
    foreign = {"name": "other", "import_path": "x:y"}
    body: dict[str, Any] = {
        "applications": {
            "other": {"status": "RUNNING", "source": "declarative", "deployed_app_config": foreign, "deployments": {}}
        }
    }
    target = target_apps([a], parse_serve_details(body), CPU)
    assert target["argus-router"]["deployments"][0]["user_config"] == {"models": router_table([a])}


def test_a_table_entry_stays_short() -> None:
    """The longest names the loader admits (user 31, name 63 characters) fit in ~450 bytes."""
    longest = spec(user="u" * 31, name="n" * 63, alias="u" * 31 + "-" + "a" * 63)
    row = router_table([app(longest)])[0]
    assert len(json.dumps(row)) < 450
    assert len(json.dumps(row)) * 4 < len(json.dumps(app(longest)))  # a quarter of the model's own entry


def test_the_router_reads_back_what_the_builder_writes() -> None:
    chat, prod = spec(), spec(name="big", alias="alice-prod")
    config = router_app_config(CPU, [app(chat), app(prod)])["deployments"][0]["user_config"]
    entries, refresh, problems = parse_table(json.loads(json.dumps(config)))
    assert problems == [] and refresh == SAFETY_REFRESH_S
    c, p = chat.served_name, prod.served_name
    assert entries == {
        "argus--alice--chat": Entry("argus--alice--chat", f"LLMServer:{c}", c, "alice-chat"),
        "argus--alice--big": Entry("argus--alice--big", f"LLMServer:{p}", p, "alice-prod"),
    }


def test_a_hostile_table_row_cannot_route_another_users_alias_or_a_foreign_app() -> None:
    rows = [
        ["argus--alice--chat", "LLMServer:x", "alice-x", "bob-prod"],  # bob's namespace: no alias at all
        ["someone-else", "D", "m", ""],  # not an argus app
        ["argus--alice--chat", "LLMServer:y", "alice-y", ""],  # the same app twice: the first row holds
        ["argus--bob--a", "LLMServer:z", "z" * 600, ""],  # overlong field
        ["argus--bob--b", "LLMServer:z", "", ""],  # empty model id
        ["argus--bob--c", "LLMServer:z", 3, ""],
        "argus--bob--d",
    ]
    entries, _, problems = parse_table({"models": rows})
    assert entries == {"argus--alice--chat": Entry("argus--alice--chat", "LLMServer:x", "alice-x", None)}
    assert len(problems) == 6


def test_a_malformed_or_huge_table_never_raises_and_stays_bounded() -> None:
    assert parse_table(None) == ({}, SAFETY_REFRESH_S, [])
    assert parse_table("models")[0] == {} and parse_table({"models": {"a": 1}})[0] == {}
    assert parse_table({"refresh_s": 0.0})[1] == REFRESH_BOUNDS_S[0]  # no busy loop
    assert parse_table({"refresh_s": 1e12})[1] == REFRESH_BOUNDS_S[1]
    assert parse_table({"refresh_s": float("nan")})[1] == SAFETY_REFRESH_S
    assert parse_table({"refresh_s": True})[1] == SAFETY_REFRESH_S
    rows = [[f"argus--u--m{i}", f"LLMServer:m{i}", f"m{i}", ""] for i in range(MAX_TABLE_ENTRIES + 5)]
    entries, _, problems = parse_table({"models": rows})
    assert len(entries) == MAX_TABLE_ENTRIES and problems == [f"{len(rows)} models: only the first 100000 are routed"]


def route(app_name: str, model_id: str, alias: str | None, deployed_at: float) -> Route:
    return Route(Entry(app_name, "LLMServer:" + model_id, model_id, alias), deployed_at, None, None, None)  # type: ignore[arg-type]


def test_the_earlier_deployed_app_keeps_a_model_id_or_alias_claimed_twice() -> None:
    old = route("argus--alice--a", "alice-1-a", "alice-prod", 100.0)
    new_same_id = route("argus--alice--b", "alice-1-a", "alice-b", 200.0)
    new_same_alias = route("argus--alice--c", "alice-1-c", "alice-prod", 150.0)
    ids, aliases, refused = claim_names([new_same_id, new_same_alias, old])
    assert ids == {"alice-1-a": old, "alice-1-c": new_same_alias}
    assert aliases == {"alice-prod": old}  # the app refused its model id routes no alias either
    assert refused == {"argus--alice--b", "argus--alice--c"}


def test_a_dated_id_wins_over_an_alias() -> None:
    dated = route("argus--alice--late", "alice-x", None, 200.0)
    aliased = route("argus--alice--early", "alice-1-early", "alice-x", 100.0)
    ids, aliases, refused = claim_names([aliased, dated])
    assert set(ids) == {"alice-x", "alice-1-early"} and aliases == {} and refused == {"argus--alice--early"}
    own = replace(aliased, entry=replace(aliased.entry, alias="alice-early"))
    assert claim_names([own, dated])[1] == {"alice-early": own}
