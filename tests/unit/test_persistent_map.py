"""The status store's persistent map (reconciler/status/persistent.py): after any sequence of
changes each version equals a dict changed the same way, and no version changes once made."""

from __future__ import annotations

import json
import pickle
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.status.persistent import PersistentMap, evolved

keys = st.one_of(st.text(max_size=6), st.integers(-50, 50))
steps = st.lists(
    st.tuples(st.dictionaries(keys, st.integers(), max_size=40), st.lists(keys, max_size=10)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(keys, st.integers(), max_size=300), steps)
def test_every_version_equals_a_dict_changed_the_same_way(start: dict[Any, int], history: list[Any]) -> None:
    versions = [(PersistentMap(start), dict(start))]
    for changes, removed in history:
        before, model = versions[-1]
        model = dict(model)
        for key in removed:
            model.pop(key, None)
        model.update(changes)
        versions.append((before.evolve(changes, removed), model))
    for pm, model in versions:  # the older versions too: evolve never changes the map it starts from
        assert pm == model and model == pm and len(pm) == len(model)
        assert pm.to_dict() == model and dict(pm.items()) == model and sorted(pm, key=repr) == sorted(model, key=repr)
        assert sorted(pm.values()) == sorted(model.values())
        assert all(pm[k] == v and pm.get(k) == v and k in pm for k, v in model.items())
        assert pm.get("absent key", -1) == -1 and [] not in pm
        other = [*list(model)[:3], "absent key"]
        assert pm.keys() - other == model.keys() - other and other - pm.keys() == other - model.keys()
        for first, first_model in (versions[0], versions[-1]):  # other versions: bucketed alike or not
            assert pm.keys() - first.keys() == model.keys() - first_model.keys()
            assert first.keys() - pm.keys() == first_model.keys() - model.keys()
        assert pickle.loads(pickle.dumps(pm)) == model


def test_a_large_map_rebuckets_as_it_grows_and_shares_what_did_not_change() -> None:
    pm: PersistentMap[str, int] = PersistentMap()
    for i in range(0, 20_000, 500):
        pm = pm.evolve({f"k{j}": j for j in range(i, i + 500)})
    assert len(pm) == 20_000 and pm == {f"k{j}": j for j in range(20_000)}
    assert len(pm._buckets) ** 2 >= len(pm) // 4  # about sqrt(n) buckets, not the first 8
    one = pm.evolve({"k7": -7})
    assert sum(a is not b for a, b in zip(pm._buckets, one._buckets, strict=True)) == 1 and pm["k7"] == 7


def test_evolved_copies_a_plain_mapping_and_evolves_a_persistent_one() -> None:
    plain = {"a": 1, "b": 2}
    assert evolved(plain, {"c": 3}, ["a"]) == {"b": 2, "c": 3} and plain == {"a": 1, "b": 2}
    assert isinstance(evolved(PersistentMap(plain), {"c": 3}, ["a"]), PersistentMap)
    assert json.dumps(PersistentMap(plain).to_dict(), sort_keys=True) == json.dumps(plain, sort_keys=True)
