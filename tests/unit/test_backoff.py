"""The one back-off (reconciler/backoff.py): doubling, a cap, a floor set by the failure, pruning."""

from __future__ import annotations

from reconciler.backoff import Backoff


def test_backoff_doubles_and_resets() -> None:
    book = Backoff(first=2.0, cap=10.0)
    assert book.due("t", 0.0)
    assert [book.failed("t", 0.0) for _ in range(4)] == [2.0, 4.0, 8.0, 10.0]
    assert not book.due("t", 9.0) and book.due("t", 10.0)
    assert book.retry_in("t", 4.0) == 6.0
    book.succeeded("t")
    assert book.due("t", 0.0) and book.retry_in("t", 0.0) is None


def test_a_failure_that_names_its_delay_is_never_retried_sooner_and_the_cap_still_holds() -> None:
    book = Backoff(first=1.0, cap=30.0)
    assert book.failed("ray", 0.0, at_least=5.0) == 5.0
    assert book.failed("ray", 0.0) == 10.0  # doubles from the delay actually used
    assert book.failed("ray", 0.0, at_least=600.0) == 30.0


def test_keys_are_independent_and_pruned_with_their_objects() -> None:
    book = Backoff()
    book.failed(("alice", "a"), 0.0)
    book.failed(("bob", "b"), 0.0)
    assert book.due(("carol", "c"), 0.0) and not book.due(("bob", "b"), 0.0)
    book.prune(lambda key: isinstance(key, tuple) and key[0] == "bob")
    assert len(book) == 1 and book.due(("alice", "a"), 0.0)
