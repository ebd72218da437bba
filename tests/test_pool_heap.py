"""The pool's start-up heap: frozen once the engines are up, as `vllm serve` freezes its
own, and thawed for a restart so that a dead engine's objects can still be collected."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from app.engines.pool import settle_heap


class Node:
    """A reference cycle: only the cyclic GC frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def thawed() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the test session keeps its usual GC


def test_settle_heap_freezes_what_is_alive(thawed: None) -> None:
    alive = Node()
    assert gc.get_freeze_count() == 0
    settle_heap()
    assert gc.get_freeze_count() > 0
    assert all(o is not alive for o in gc.get_objects()), "still in a generation the GC walks"


def test_a_restart_thaws_the_heap_so_the_dead_engine_is_collected(thawed: None) -> None:
    dead = Node()
    ref = weakref.ref(dead)
    settle_heap()  # the first start: the cycle is frozen with everything else
    del dead
    gc.collect()
    assert ref() is not None, "a frozen cycle is not collected"
    settle_heap()  # after a restart
    assert ref() is None, "the thawed cycle was collected"
