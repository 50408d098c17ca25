"""The engine's open-loop request stream: read in bounded batches, delivered one by one on time."""

import pytest
import simpy

from sim.engine.arrivals import Arrivals
from workloads.request import Request


def _stream(pulled: list[int], count: int):
    for request_id in range(count):
        pulled.append(request_id)
        yield Request(request_id, float(request_id // 2), ((request_id, 8),), 1, 10_000 + request_id)


@pytest.mark.parametrize("read_ahead", [1, 3, 4, 100])
def test_arrivals_deliver_on_time_whatever_they_read_ahead(read_ahead: int) -> None:
    env = simpy.Environment()
    pulled: list[int] = []
    delivered: list[tuple[float, int]] = []
    held_ahead: list[int] = []

    def deliver(request: Request) -> None:
        held_ahead.append(len(pulled) - len(delivered))
        delivered.append((env.now, request.request_id))

    arrivals = Arrivals(env, _stream(pulled, 10), deliver, read_ahead=read_ahead)
    assert pulled == list(range(min(read_ahead, 10)))  # one batch read before the clock starts
    assert arrivals.next_arrival_s() == 0.0
    env.process(arrivals.process())
    env.run()
    # Two requests per second, each delivered at its own arrival time, in stream order.
    assert delivered == [(float(request_id // 2), request_id) for request_id in range(10)]
    # Read but not yet delivered, counting the one being delivered: at most a batch and that one.
    assert max(held_ahead) == min(read_ahead + 1, 10)
    assert arrivals.next_open is None and arrivals.next_arrival_s() == float("inf")


def test_arrivals_refuse_a_read_ahead_below_one() -> None:
    with pytest.raises(ValueError, match="read_ahead must be at least 1, not 0"):
        Arrivals(simpy.Environment(), [], lambda request: None, read_ahead=0)


def test_on_delivered_follows_arrivals_not_reads() -> None:
    """A progress bar told by ``on_delivered`` advances as requests arrive on the clock: two per
    second here, although the first four were read before the clock started."""
    env = simpy.Environment()
    pulled: list[int] = []
    updates: list[tuple[float, int, int]] = []  # (time, count, requests read so far)
    arrivals = Arrivals(
        env,
        _stream(pulled, 10),
        lambda request: None,
        read_ahead=4,
        on_delivered=lambda count: updates.append((env.now, count, len(pulled))),
    )
    env.process(arrivals.process())
    env.run()
    assert [(time, count) for time, count, _ in updates] == [(float(second), 2) for second in range(5)]
    assert updates[0][2] == 4  # a batch was read ahead when the first two arrived


def test_on_delivered_counts_each_follow_up_as_it_arrives() -> None:
    """A closed loop's stream holds only each user's first request: the bar (whose total counts every
    request) is told of each follow-up too, at its arrival, or it would stop short of its total."""
    env = simpy.Environment()
    updates: list[tuple[float, int]] = []
    delivered: list[int] = []
    arrivals = Arrivals(
        env,
        _stream([], 2),  # requests 0 and 1, both at 0 s
        lambda request: delivered.append(request.request_id),
        on_delivered=lambda count: updates.append((env.now, count)),
    )
    env.process(arrivals.process())
    env.run(until=1.0)
    arrivals.schedule_follow_up(Request(2, 2.5, ((2, 8),), 1, 10_002))
    arrivals.schedule_follow_up(Request(3, 4.0, ((3, 8),), 1, 10_003))
    env.run()
    assert delivered == [0, 1, 2, 3]
    assert updates == [(0.0, 2), (2.5, 1), (4.0, 1)]
    assert sum(count for _, count in updates) == 4
