"""The collector's full passes: after a long one its survivors are frozen, so the next passes walk only what was
made since, and garbage is still collected."""

from __future__ import annotations

import asyncio
import gc
import weakref

from gpud.controller.heap import FullPasses
from waiting import loop_turn


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it once it is garbage


def test_the_survivors_of_a_long_full_pass_are_frozen_and_garbage_is_still_collected():
    async def scenario() -> None:
        passes = FullPasses(asyncio.get_running_loop(), freeze_after_s=0.0)  # every full pass counts as long
        frozen = gc.get_freeze_count()
        kept = [Node() for _ in range(20_000)]
        garbage = Node()
        gone = weakref.ref(garbage)
        del garbage
        passes.install()
        try:
            assert gc.collect() >= 1  # the cycle that is garbage goes, before the survivors are frozen
            assert passes.passes == 1 and passes.freezes == 1
            assert gc.get_freeze_count() >= frozen + len(kept)
            assert gone() is None
            await loop_turn()  # the loop's turn: the collection that starts the long-lived count afresh
            assert passes.passes == 2
            # What the freeze took is walked no more: a full pass now sees only what was made since.
            assert len(gc.get_objects(generation=2)) < len(kept)
            later = Node()
            later_gone = weakref.ref(later)
            del later
            gc.collect()
            assert later_gone() is None
        finally:
            passes.uninstall()
            gc.unfreeze()
        assert kept[0].me is kept[0]
        passes_before = passes.passes
        gc.collect()
        assert passes.passes == passes_before  # uninstalled: no longer timed

    asyncio.run(scenario())


def test_a_short_full_pass_freezes_nothing():
    async def scenario() -> None:
        passes = FullPasses(asyncio.get_running_loop(), freeze_after_s=60.0)
        frozen = gc.get_freeze_count()
        passes.install()
        try:
            gc.collect()
        finally:
            passes.uninstall()
        assert passes.passes == 1 and passes.freezes == 0 and passes.longest_s < 60.0
        assert gc.get_freeze_count() == frozen

    asyncio.run(scenario())


def test_full_passes_come_a_hundred_middle_passes_apart_while_installed():
    """Each full pass walks every unfrozen object (a fleet's waiting connections among them) and frees next to
    nothing: the controller makes them rarer, and gives the collector back as it was when it stops."""
    from gpud.controller.heap import FULL_PASS_EVERY

    async def scenario() -> None:
        before = gc.get_threshold()
        passes = FullPasses(asyncio.get_running_loop())
        passes.install()
        try:
            assert gc.get_threshold() == (before[0], before[1], FULL_PASS_EVERY)
            passes.install()  # a second install keeps what was before the first
        finally:
            passes.uninstall()
        assert gc.get_threshold() == before

    asyncio.run(scenario())
