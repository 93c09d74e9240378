"""The engine thread's token events reach the server's event loop in order, one wake-up per burst."""

import asyncio
import threading

from rooftop.engine.engine import TokenEvent
from rooftop.engine.serving import Handoff


def _event(i: int, last: bool = False) -> TokenEvent:
    return TokenEvent(i, chr(97 + i % 26), -0.5, [], 3, i + 1, "length" if last else None)


def test_a_burst_from_another_thread_wakes_the_loop_once_and_keeps_each_request_in_order():
    loop = asyncio.new_event_loop()
    try:
        wakeups = []
        original = loop.call_soon_threadsafe

        def counting(cb, *args):
            wakeups.append(cb)
            return original(cb, *args)

        loop.call_soon_threadsafe = counting
        handoff = Handoff(loop)
        queues = [asyncio.Queue() for _ in range(3)]

        def engine_step(first: int, n: int) -> None:  # one decode step: a token for every request
            for i in range(first, first + n):
                for q in queues:
                    handoff.put(q, _event(i, last=i == 9))

        steps = [threading.Thread(target=engine_step, args=(0, 5))]
        steps[0].start()
        steps[0].join()  # the loop is not running: the whole burst waits for one drain
        assert len(wakeups) == 1

        async def collect():
            await asyncio.sleep(0)
            t = threading.Thread(target=engine_step, args=(5, 5))
            t.start()
            out = []
            for q in queues:
                got = []
                while not got or got[-1].finish_reason is None:
                    got.append(await q.get())
                out.append(got)
            t.join()
            return out

        got = loop.run_until_complete(collect())
        for events in got:
            assert [ev.token_id for ev in events] == list(range(10))
            assert [ev.finish_reason for ev in events] == [None] * 9 + ["length"]
        assert len(wakeups) >= 2  # the second burst woke the loop again
    finally:
        loop.close()


def test_a_closed_loop_drops_events_without_raising():
    loop = asyncio.new_event_loop()
    loop.close()
    Handoff(loop).put(asyncio.Queue(), _event(0))  # the server is shutting down: nothing to deliver to
