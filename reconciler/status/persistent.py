"""A mapping that is never changed once made, whose next version shares all but what changed. Pure.

The status store hands every status commit to page requests running in other threads, and each
may keep an older commit's maps while the store moves on: so the maps are never changed. Copying
a map of 100,000 documents on every commit cost tens of milliseconds; a :class:`PersistentMap`
is ``w`` dicts (buckets, a key's by its hash), and :meth:`PersistentMap.evolve` copies the list of
buckets and only the buckets a change touches: O(changed x n / w + w), with ``w`` about the square
root of ``n``. Reading a key is one hash and one dict lookup; iterating is dict iteration bucket by
bucket, in C. At 100,000 entries (a shared 2-core machine) a loop over the items takes ~16 ms
against a dict's ~3 ms (the items come in hash order, not in the order they lie in memory) and
``rpds.HashTrieMap``'s ~150 ms; the daemon loops over the status documents every tick. The order
is neither sorted nor the insertion order: a caller that shows a listing sorts it.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from itertools import chain
from typing import Any, TypeVar, overload

K = TypeVar("K")
V = TypeVar("V")
D = TypeVar("D")

_MIN_WIDTH = 8
_NONE: Any = object()  # a key's value where it is absent (no value is this object)


def _width(n: int) -> int:
    """The number of buckets for ``n`` keys: a power of two about ``sqrt(n)``."""
    width = _MIN_WIDTH
    while width * width < n:
        width *= 2
    return width


class PersistentMap(Mapping[K, V]):
    """``PersistentMap(mapping_or_pairs)``: a read-only mapping; :meth:`evolve` makes the next
    version. Equal to any mapping with the same items; pickles as its items."""

    __slots__ = ("_buckets", "_len", "_mask")

    _buckets: list[dict[K, V]]  # never changed once the map is made; shared between versions
    _len: int
    _mask: int  # a key's bucket is hash(key) & _mask

    def __init__(self, items: Mapping[K, V] | Iterable[tuple[K, V]] = ()) -> None:
        pairs = list(items.items() if isinstance(items, Mapping) else items)
        width = _width(len(pairs))
        buckets: list[dict[K, V]] = [{} for _ in range(width)]
        mask = width - 1
        for key, value in pairs:
            buckets[hash(key) & mask][key] = value
        self._buckets, self._len, self._mask = buckets, sum(map(len, buckets)), mask

    def evolve(self, changes: Mapping[K, V] | None = None, removed: Iterable[K] = ()) -> PersistentMap[K, V]:
        """Return this map with the keys of ``changes`` set to their values and the keys of
        ``removed`` absent (a key not here is skipped); this map stays as it is."""
        buckets = list(self._buckets)
        mask = len(buckets) - 1
        copied: set[int] = set()
        size = self._len
        for key in removed:
            at = hash(key) & mask
            if key in buckets[at]:
                if at not in copied:
                    buckets[at] = dict(buckets[at])
                    copied.add(at)
                del buckets[at][key]
                size -= 1
        for key, value in (changes or {}).items():
            at = hash(key) & mask
            if at not in copied:
                buckets[at] = dict(buckets[at])
                copied.add(at)
            bucket = buckets[at]
            size += key not in bucket
            bucket[key] = value
        new = PersistentMap.__new__(PersistentMap)
        new._buckets, new._len, new._mask = buckets, size, mask
        if size > 4 * len(buckets) * len(buckets):  # grown far past its width: rebucket (amortized O(1))
            return PersistentMap(new.items())
        return new

    def changed_since(self, other: Mapping[K, V]) -> set[K] | None:
        """The keys whose value is not the very same object in ``other`` (present in one only
        included), when ``other`` is a version of this map with the same buckets: only the
        buckets the two do not share are compared (O(changed x n / w + w)). None when ``other``
        is any other mapping (then the caller compares everything)."""
        if not isinstance(other, PersistentMap) or len(other._buckets) != len(self._buckets):
            return None
        out: set[K] = set()
        for mine, theirs in zip(self._buckets, other._buckets, strict=True):
            if mine is not theirs:
                out.update(k for k in mine.keys() | theirs.keys() if mine.get(k, _NONE) is not theirs.get(k, _NONE))
        return out

    def to_dict(self) -> dict[K, V]:
        """Return a plain dict of the same items (C-speed, bucket by bucket)."""
        out: dict[K, V] = {}
        for bucket in self._buckets:
            out.update(bucket)
        return out

    def __getitem__(self, key: K) -> V:
        return self._buckets[hash(key) & self._mask][key]

    @overload
    def get(self, key: K, /) -> V | None: ...
    @overload
    def get(self, key: K, default: V | D, /) -> V | D: ...
    def get(self, key: K, default: Any = None, /) -> Any:
        return self._buckets[hash(key) & self._mask].get(key, default)

    def __contains__(self, key: object) -> bool:
        try:
            return key in self._buckets[hash(key) & self._mask]
        except TypeError:  # unhashable: never a key
            return False

    def __iter__(self) -> Iterator[K]:
        return chain.from_iterable(self._buckets)

    def __len__(self) -> int:
        return self._len

    def keys(self) -> KeysView[K]:
        return _Keys(self)

    def items(self) -> ItemsView[K, V]:
        return _Items(self)

    def values(self) -> ValuesView[V]:
        return _Values(self)

    def __reduce__(self) -> tuple[Any, ...]:
        return (PersistentMap, (self.to_dict(),))

    def __repr__(self) -> str:
        return f"PersistentMap({self.to_dict()!r})"


def evolved(base: Mapping[K, V], changes: Mapping[K, V] | None = None, removed: Iterable[K] = ()) -> Mapping[K, V]:
    """Return ``base`` with ``changes`` set and ``removed`` absent, ``base`` unchanged: by
    :meth:`PersistentMap.evolve` when it is one (O(changed)), else a new dict."""
    if isinstance(base, PersistentMap):
        return base.evolve(changes, removed)
    out = dict(base)
    for key in removed:
        out.pop(key, None)
    out.update(changes or {})
    return out


class _Keys(KeysView[K]):
    """A difference of keys (``keys() - other``, ``other - keys()``) as a dict's keys do it: on
    sets, at C speed (the generic one tests every key one by one in Python)."""

    _mapping: PersistentMap[K, Any]

    def __sub__(self, other: Iterable[Any]) -> set[K]:
        mine = self._mapping._buckets
        if isinstance(other, _Keys) and len(other._mapping._buckets) == len(mine):
            # Bucketed alike, a key can only be in the same bucket of the other: bucket by bucket,
            # and a bucket both versions share differs in nothing.
            out: set[K] = set()
            for a, b in zip(mine, other._mapping._buckets, strict=True):
                if a is not b:
                    out.update(a.keys() - b.keys())
            return out
        return set(self).difference(other)

    def __rsub__(self, other: Iterable[Any]) -> set[Any]:
        return set(other).difference(self)


class _Items(ItemsView[K, V]):
    _mapping: PersistentMap[K, V]

    def __iter__(self) -> Iterator[tuple[K, V]]:
        return chain.from_iterable(map(dict.items, self._mapping._buckets))


class _Values(ValuesView[V]):
    _mapping: PersistentMap[Any, V]

    def __iter__(self) -> Iterator[V]:
        return chain.from_iterable(map(dict.values, self._mapping._buckets))
