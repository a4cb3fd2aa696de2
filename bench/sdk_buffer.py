"""SDK offline buffer benchmark: buffering events while callgate is down.

Usage:  python bench/sdk_buffer.py [--events 10000] [--rounds 3]

Needs only callgate-sdk (no Django, no database). Each figure is the median of ``--rounds``:
  1. ``report()`` of N attempt events into the on-disk buffer (``buffer_dir``, SQLite WAL):
     total seconds (target: under 2 s for 10,000) and the cost of an append in the last tenth
     against the first tenth (about 1: an append costs the same however full the buffer);
  2. ``report_now()`` of N events with callgate down (connection refused on 127.0.0.1:8249,
     this branch's port range, where nothing listens): each tries callgate, then buffers;
  3. ``len(buffer)`` at N events, in microseconds (O(1): a counter kept by triggers);
  4. ``flush()`` of the N buffered events once callgate is back (an in-process
     ``httpx.MockTransport`` accepting every batch, so only the SDK's side is timed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import httpx

from callgate_sdk import CallgateClient

DOWN_URL = "http://127.0.0.1:8249"
KEY = "cg_bench_" + "x" * 40


def attempt(client: CallgateClient, i: int) -> dict:
    return client.event(
        "attempt",
        operation_id=f"op_{i:032x}",
        request_id=f"req-{i // 4}",
        attempt=1,
        sent=True,
        outcome="success",
        http_status=200,
        error=None,
        result={"follow_up_id": f"F-{i}", "status": "open", "notes": "x" * 120},
    )


def accept_all(request: httpx.Request) -> httpx.Response:
    batch = json.loads(request.content)
    results = [
        {"index": n, "event_id": e["event_id"], "status": "accepted", "errors": []}
        for n, e in enumerate(batch)
    ]
    return httpx.Response(200, json={"results": results})


def one_round(n: int) -> dict[str, float]:
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as directory:
        client = CallgateClient(
            DOWN_URL, KEY, buffer_dir=directory, flush_interval=None, batch_size=500
        )
        events = [attempt(client, i) for i in range(n)]
        tenth = max(1, n // 10)
        marks = []
        started = time.perf_counter()
        for i, event in enumerate(events):
            if i % tenth == 0:
                marks.append(time.perf_counter())
            client.report(event)
        figures["report_s"] = time.perf_counter() - started
        marks.append(time.perf_counter())
        figures["last_vs_first_tenth"] = (marks[-1] - marks[-2]) / (marks[1] - marks[0])
        started = time.perf_counter()
        for _ in range(100):
            assert len(client.buffer) == n
        figures["len_us"] = (time.perf_counter() - started) / 100 * 1e6
        client.close(flush=False)

        back = CallgateClient(
            "http://callgate.test",
            KEY,
            buffer_dir=directory,
            flush_interval=None,
            batch_size=500,
            transport=httpx.MockTransport(accept_all),
        )
        started = time.perf_counter()
        assert back.flush() == n and len(back.buffer) == 0
        figures["flush_s"] = time.perf_counter() - started
        back.close(flush=False)

    with tempfile.TemporaryDirectory() as directory:
        client = CallgateClient(
            DOWN_URL, KEY, buffer_dir=directory, flush_interval=None, answer_timeout=0
        )
        events = [attempt(client, i) for i in range(n)]
        started = time.perf_counter()
        for event in events:
            assert client.report_now(event) is None
        figures["report_now_down_s"] = time.perf_counter() - started
        assert len(client.buffer) == n
        client.close(flush=False)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rounds = [one_round(args.events) for _ in range(args.rounds)]
    median = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    n = args.events
    print(f"SDK offline buffer, {n:,} events, median of {args.rounds} rounds (SQLite WAL on disk)")
    print(
        f"  report() into the buffer      {median['report_s']:7.3f} s  "
        f"{n / median['report_s']:>9,.0f} events/s  target < 2 s: "
        f"{'MET' if median['report_s'] < 2 else 'MISSED'} "
        f"(ratio to target {median['report_s'] / 2:.2f})"
    )
    print(
        f"  last tenth / first tenth      {median['last_vs_first_tenth']:7.2f}    "
        "(about 1: an append costs the same however full the buffer)"
    )
    print(f"  len(buffer) at {n:,}         {median['len_us']:7.1f} µs")
    print(
        f"  report_now() callgate down    {median['report_now_down_s']:7.3f} s  "
        f"{n / median['report_now_down_s']:>9,.0f} events/s (connection refused, then buffered)"
    )
    print(
        f"  flush() once callgate is back {median['flush_s']:7.3f} s  "
        f"{n / median['flush_s']:>9,.0f} events/s (batches of 500, SDK side only)"
    )


if __name__ == "__main__":
    main()
