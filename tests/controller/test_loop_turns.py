"""The loop's turns: a burst of node messages leaves the loop free between turns of bounded work; every piece runs,
each task's pieces in order, first come first served."""

from __future__ import annotations

import asyncio
import time

import pytest

from gpud.controller.slices import Turns

PIECE_S = 0.001


def busy(seconds: float) -> None:
    """Hold the loop for ``seconds`` of its thread's CPU time, as a piece of CPU-bound work does (however loaded
    the machine: turns are measured in that time)."""
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


async def piece(turns: Turns, done: list, what: object) -> None:
    began = await turns.enter()
    try:
        busy(PIECE_S)
        done.append(what)
    finally:
        turns.leave(began)


async def burst(turns: Turns) -> tuple[list[int], list[int]]:
    """200 nodes' messages ready at once, and a request made ready just after them: the pieces in the order they
    ran, and how many had run when the request was served."""
    done: list[int] = []
    seen_at: list[int] = []
    pieces = [asyncio.ensure_future(piece(turns, done, n)) for n in range(200)]
    asyncio.get_running_loop().call_soon(lambda: seen_at.append(len(done)))
    await asyncio.gather(*pieces)
    return done, seen_at


async def test_a_burst_of_pieces_leaves_the_loop_free_between_turns():
    # Served as they came, the request would wait for all 200 pieces (0.2 s); in turns it waits for about one
    # turn's worth of them.
    turns = Turns(slice_s=0.005)
    done, seen_at = await burst(turns)
    assert sorted(done) == list(range(200))
    assert done == list(range(200))  # first come, first served
    assert seen_at and seen_at[0] <= 0.005 / PIECE_S + 2, seen_at
    assert turns.waits > 0


async def test_without_turns_the_same_burst_holds_the_loop():
    # The measure the test above relies on: the request waits behind the whole burst when pieces do not take turns.
    _, seen_at = await burst(Turns(slice_s=10.0))
    assert seen_at == [200]


async def test_each_tasks_pieces_keep_their_order():
    turns = Turns(slice_s=0.002)
    done: list[tuple[int, int]] = []

    async def node(number: int) -> None:
        for message in range(10):
            await piece(turns, done, (number, message))

    await asyncio.gather(*(node(n) for n in range(30)))
    assert len(done) == 300
    for number in range(30):
        assert [m for n, m in done if n == number] == list(range(10))


async def test_a_waiting_piece_cancelled_leaves_the_others_to_run():
    turns = Turns(slice_s=0.0)  # every piece after the first waits for a later turn
    done: list[int] = []
    first = asyncio.ensure_future(piece(turns, done, 0))
    second = asyncio.ensure_future(piece(turns, done, 1))
    third = asyncio.ensure_future(piece(turns, done, 2))
    await asyncio.sleep(0)
    second.cancel()
    await asyncio.gather(first, third)
    with pytest.raises(asyncio.CancelledError):
        await second
    assert done == [0, 2]
    assert not turns.waiting


async def test_pieces_dearer_than_the_recent_ones_still_fill_one_turn_only():
    turns = Turns(slice_s=0.005)
    done: list[int] = []
    for n in range(64):  # cheap pieces (heartbeats): the recent cost says a turn holds many
        began = await turns.enter()
        turns.leave(began)
    per_turn: list[int] = []
    finished = False
    loop = asyncio.get_running_loop()

    def probe(last: int = 0) -> None:
        per_turn.append(len(done) - last)
        if not finished:
            loop.call_soon(probe, len(done))

    async def dear(n: int) -> None:  # task exits costing 2 ms each, all ready at once
        began = await turns.enter()
        try:
            busy(0.002)
            done.append(n)
        finally:
            turns.leave(began)

    probe()
    await asyncio.gather(*(dear(n) for n in range(60)))
    finished = True
    assert sorted(done) == list(range(60))
    assert max(per_turn) <= 0.005 / 0.002 + 2, per_turn


async def test_on_a_loop_busy_with_other_work_the_pieces_keep_their_share():
    # Other work takes 20 ms of CPU in every turn of the loop: 100 pieces of 1 ms held to 5 ms a turn took 56 turns
    # (heartbeats waiting ever longer); with as much as the other work took, 23.
    turns = Turns(slice_s=0.005)
    done: list[int] = []
    loop_turns_seen = 0
    finished = False
    loop = asyncio.get_running_loop()

    def other_work() -> None:
        nonlocal loop_turns_seen
        busy(0.02)
        loop_turns_seen += 1
        if not finished:
            loop.call_soon(other_work)

    other_work()
    await asyncio.sleep(0)
    started = loop_turns_seen
    await asyncio.gather(*(piece(turns, done, n) for n in range(100)))
    finished = True
    assert sorted(done) == list(range(100))
    assert loop_turns_seen - started < 40, loop_turns_seen - started
