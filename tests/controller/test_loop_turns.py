"""The loop's turns: a burst of node messages leaves the loop free between turns of bounded work; every piece runs,
each task's pieces in order, first come first served."""

from __future__ import annotations

import asyncio
import time

import pytest

from gpud.controller.slices import SLICE_S, Slices, Turns

PIECE_S = 0.001


def busy(seconds: float) -> None:
    """Hold the loop for ``seconds`` of its thread's CPU time, as a piece of CPU-bound work does (however loaded
    the machine: turns are measured in that time)."""
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


class PerTurn:
    """How many entries ``done`` gains in each turn of the running loop, counted from its making until ``stop``."""

    def __init__(self, done: list) -> None:
        self.done = done
        self.counts: list[int] = []
        self.stopped = False
        self.loop = asyncio.get_running_loop()
        self._probe(0)

    def _probe(self, last: int) -> None:
        self.counts.append(len(self.done) - last)
        if not self.stopped:
            self.loop.call_soon(self._probe, len(self.done))

    def stop(self) -> list[int]:
        """Stop counting; the counts, turn by turn."""
        self.stopped = True
        return self.counts


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
    async def dear(n: int) -> None:  # task exits costing 2 ms each, all ready at once
        began = await turns.enter()
        try:
            busy(0.002)
            done.append(n)
        finally:
            turns.leave(began)

    counted = PerTurn(done)
    await asyncio.gather(*(dear(n) for n in range(60)))
    per_turn = counted.stop()
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


async def test_on_a_loop_busy_with_other_work_the_pieces_take_at_most_their_most():
    # Other work takes 20 ms a turn; pieces capped at 6 ms a turn keep a third of the loop, and no turn grows by more.
    turns = Turns(slice_s=0.003, most_s=0.006)
    done: list[int] = []
    per_turn: list[int] = []
    finished = False
    loop = asyncio.get_running_loop()

    def other_work(last: int = 0) -> None:
        per_turn.append(len(done) - last)
        busy(0.02)
        if not finished:
            loop.call_soon(other_work, len(done))

    other_work()
    await asyncio.gather(*(piece(turns, done, n) for n in range(100)))
    finished = True
    assert sorted(done) == list(range(100))
    assert max(per_turn) <= 0.006 / PIECE_S + 2, per_turn
    assert len(per_turn) < 40, len(per_turn)


STEP_S = 0.0005


async def long_work(done: list[tuple[int, int]], number: int, steps: int) -> None:
    """A piece of long work (a plan carried out, its commands sent, rows made) in steps of STEP_S of CPU."""
    slices = Slices()
    for step in range(steps):
        busy(STEP_S)
        done.append((number, step))
        await slices.pause()


async def test_long_work_under_way_together_takes_one_slice_a_turn():
    # A fill carries out a plan, sends its commands, makes its rows and accepts a batch of submits at once: each
    # taking a slice of every turn held the loop four slices long. Together they take about one slice a turn, and
    # each of them moves on.
    done: list[tuple[int, int]] = []
    counted = PerTurn(done)
    await asyncio.gather(*(long_work(done, n, 40) for n in range(4)))
    per_turn = counted.stop()
    assert sorted(done) == sorted((n, s) for n in range(4) for s in range(40))
    # The first turn takes a slice of the first piece and a step of each other (before each looks at the clock).
    first = next(i for i, count in enumerate(per_turn) if count)
    steady = per_turn[first + 1:]
    # A turn's share of long work is SLICE_S of the loop thread's CPU time (which a loaded machine does not
    # stretch): never a slice for each piece (four pieces: 4 x SLICE_S).
    assert max(steady) <= SLICE_S / STEP_S + 2, per_turn
    # Round and round, in the order they paused: until a piece is done, every piece still under way has had as many
    # slices as it, but one. (Counted in slices, not steps: how many steps fit a slice depends on the machine's load.)
    ends = {n: done.index((n, 39)) for n in range(4)}
    for n, end in ends.items():
        slices = _slices(done[:end + 1])
        assert all(slices[m] >= slices[n] - 1 for m in range(4) if ends[m] > end), (n, slices, done)


def _slices(done: list[tuple[int, int]]) -> dict[int, int]:
    """How many slices each piece ran in ``done``: runs of its steps with no other piece's step between."""
    slices = dict.fromkeys(range(4), 0)
    previous = None
    for number, _ in done:
        if number != previous:
            slices[number] += 1
            previous = number
    return slices


async def test_long_work_gives_way_to_a_request_every_slice():
    # A request made ready while four pieces of long work are under way is served within a slice of them.
    done: list[tuple[int, int]] = []
    seen_at: list[int] = []
    pieces = [asyncio.ensure_future(long_work(done, n, 40)) for n in range(4)]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    before = len(done)
    asyncio.get_running_loop().call_soon(lambda: seen_at.append(len(done)))
    await asyncio.gather(*pieces)
    assert seen_at and seen_at[0] - before <= SLICE_S / STEP_S + 2, (before, seen_at)


async def test_many_short_pieces_of_long_work_woken_at_once_take_one_slice_a_turn():
    # A write that a hundred commits wait for wakes them all in one turn, and each sends its few commands, one at a
    # time under one lock, well within a slice of its own: what they take together ends the turn's share of long
    # work, or the hundred held the loop for a hundred steps.
    done: list[tuple[int, int]] = []
    written = asyncio.get_running_loop().create_future()
    sending = asyncio.Lock()

    async def commit(number: int) -> None:
        await written
        async with sending:
            slices = Slices()
            for step in range(3):
                busy(STEP_S)
                done.append((number, step))
                await slices.pause()

    commits = [asyncio.ensure_future(commit(n)) for n in range(100)]
    await asyncio.sleep(0)
    counted = PerTurn(done)
    written.set_result(None)
    await asyncio.gather(*commits)
    per_turn = counted.stop()
    assert done == [(n, s) for n in range(100) for s in range(3)]
    assert max(per_turn) <= SLICE_S / STEP_S + 2, per_turn
