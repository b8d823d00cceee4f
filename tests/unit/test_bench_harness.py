"""``make bench``'s shared output: the ``RESULT`` line each benchmark prints per target
(``bench/harness.py``), and how ``bench/run_all.py`` reads it back and tabulates it; the
chunk path's idle time as ``chunk_overhead`` reads it from the task runs, a round of
chunks delivered two ways in one run (``chunk_interleaved``) and the CPU a worker spends
beside a running chunk (``bare_chunks.Beside``), two processes'
CPU a chunk over the window where both deliver (``chunk_pair``), a worker's CPU
between two moments from its samples, a process tree's CPU, a process's context switches
summed over its threads, each thread's CPU by name, and the processes pinned apart for
``--pin``."""

from __future__ import annotations

import asyncio
import contextvars
import http.server
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import thread as pool_thread
from pathlib import Path

import psutil
import pytest

# The benchmarks import their harness as a top-level module, from bench/ itself
# (appended: nothing installed is shadowed).
sys.path.append(str(Path(__file__).resolve().parents[2] / "bench"))

import harness
from bare_chunks import IN_CHUNK, Beside, Chunk, read_chunks
from chunk_interleaved import round_of
from chunk_overhead import idle_seconds
from chunk_pair import Sampler, chunks_inside
from harness import (
    PREFECT_PID,
    SHARED_STACK,
    Worker,
    knee_verdict,
    median_interval,
    private_stack,
    report_links,
    result,
)
from request_rate import deciding_rates
from run_all import Ran, Result, parse_result, summary_markdown, summary_text


def test_the_benchmarks_free_ports_lie_outside_the_ephemeral_range_each_once() -> None:
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    ports = [harness.free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert not [port for port in ports if int(low) <= port <= int(high) or port < 20000]


def test_a_result_line_carries_figure_reference_ratio_target_and_verdict(
    capsys: pytest.CaptureFixture[str],
) -> None:
    line = result(
        "delivery",
        "FcmProvider.send_many, one process",
        figure="34,178 msgs/s",
        reference="12,958 msgs/s (bare aiohttp blast)",
        ratio=2.6375,
        target=">= 10,000 msgs/s and >= 0.7x the bare blast",
        met=True,
    )
    assert line == (
        "RESULT | delivery: FcmProvider.send_many, one process | figure 34,178 msgs/s"
        " | reference 12,958 msgs/s (bare aiohttp blast) | ratio 2.64"
        " | target >= 10,000 msgs/s and >= 0.7x the bare blast | met"
    )
    assert capsys.readouterr().out == line + "\n"


def test_the_verdict_is_met_not_met_or_no_verdict_with_its_reason() -> None:
    common = {"figure": "1 s", "reference": "2 s (bare)", "target": "<= 1x"}
    assert result("b", "m", ratio=0.5, met=False, **common).endswith(" | NOT met")
    undecided = result("b", "m", ratio=None, met=None, why="quick size", **common)
    assert undecided.endswith(" | ratio n/a | target <= 1x | no verdict (quick size)")
    qualified = result("b", "m", ratio=0.5, met=True, why="under load", **common)
    assert qualified.endswith(" | met (under load)")


def test_a_result_refuses_an_undecided_verdict_without_reason_and_a_separator() -> None:
    with pytest.raises(ValueError, match="reason"):
        result("b", "m", figure="1", reference="2", ratio=None, target="t", met=None)
    with pytest.raises(ValueError, match="separates"):
        result("b", "m | x", figure="1", reference="2", ratio=None, target="t", met=True)


def test_run_all_reads_back_every_field_of_a_result_line() -> None:
    line = result(
        "device_import",
        "SQLite, 200,000 devices, new devices",
        figure="2.36 s",
        reference="0.85 s (bare executemany of the same rows)",
        ratio=2.78,
        target="<= 15 s for 1 M devices",
        met=None,
        why="quick size: judged at 1 M devices",
    )
    assert parse_result(line + "\n") == Result(
        benchmark="device_import",
        measure="SQLite, 200,000 devices, new devices",
        figure="2.36 s",
        reference="0.85 s (bare executemany of the same rows)",
        ratio="2.78",
        target="<= 15 s for 1 M devices",
        verdict="no verdict (quick size: judged at 1 M devices)",
    )


@pytest.mark.parametrize(
    "line",
    [
        "round 1 sandbox  upload → report    3.6 s",
        "RESULT | render: time | figure 1 s | reference 2 s | ratio 0.50 | target <= 1x",
        "RESULT | render time | figure 1 s | reference 2 s | ratio 0.50 | target t | met",
        "RESULT | render: time | figure 1 s | ref 2 s | ratio 0.50 | target t | met",
        "  RESULT | render: time | figure 1 s | reference 2 s | ratio 0.50 | target t | met",
    ],
)
def test_other_lines_are_not_results(line: str) -> None:
    assert parse_result(line) is None


def test_a_rate_target_is_met_by_a_rate_held_at_or_above_it_and_missed_below_it() -> None:
    assert knee_verdict({10.0: True, 100.0: True}, 100.0) is True
    assert knee_verdict({10.0: True, 25.0: False}, 100.0) is False
    assert knee_verdict({3.0: False}, 5.0) is False
    assert knee_verdict({10.0: True, 25.0: True}, 100.0) is None
    assert knee_verdict({150.0: False}, 100.0) is None


def test_the_median_interval_is_the_order_statistics_that_hold_the_median() -> None:
    # 1 Dec 00:34, chunk_overhead's 12 rounds (%): the 3rd and the 10th smallest
    rounds = [13.0, 8.1, 6.8, 5.2, 10.5, 20.5, 4.4, 7.7, 2.1, 1.5, 8.3, 12.7]
    low, high, confidence = median_interval(rounds)
    assert (low, high) == (4.4, 12.7)
    assert confidence == pytest.approx(1 - 2 * 79 / 4096)  # P(2 or fewer of 12 below), twice
    assert median_interval(list(range(100)))[:2] == (39, 60)
    low, high, confidence = median_interval([3.0, 1.0, 2.0])
    assert (low, high) == (1.0, 3.0)  # the range: all that 3 values can give
    assert confidence == 0.75
    values = [float(v) for v in range(12)]
    assert median_interval(values, 0.99) == (1.0, 10.0, pytest.approx(1 - 2 * 13 / 4096))


def test_the_deciding_rates_leave_neither_rate_target_undecided() -> None:
    assert deciding_rates(4.27) == [5.0, 1.5 * 4.27]
    assert deciding_rates(3.0) == [4.5, 5.0]
    assert deciding_rates(10 / 3) == [5.0]
    for reference in (2.77, 3.94, 4.06, 4.27, 4.49, 10 / 3):
        rates = deciding_rates(reference)
        for outcome in (True, False):
            for target in (5.0, 1.5 * reference):
                assert knee_verdict(dict.fromkeys(rates, outcome), target) is outcome


def test_the_summary_lists_each_benchmark_with_its_results_or_their_absence() -> None:
    found = Result("render", "time", "0.05 s", "0.16 s (str.format)", "0.32", "<= 1x", "met")
    runs = [
        Ran("render", ["200000"], 0.8, seconds=4.2, cpu=3.9, results=[found, found]),
        Ran("sandbox", [], 0.9, seconds=0.3, cpu=0.2, status=1),
    ]
    text = summary_text(runs, "quick", 4.5).splitlines()
    assert text[1].split()[:6] == ["render", "4", "s", "CPU", "4", "s"]
    assert text[1].split()[6:] == ["ok", "(load", "average", "0.8", "at", "start)"]
    assert (
        text[2].strip()
        == "time: 0.05 s | reference 0.16 s (str.format) | ratio 0.32 | target <= 1x | met"
    )
    assert text[4].split()[:8] == ["sandbox", "0", "s", "CPU", "0", "s", "FAILED", "(exit"]
    assert text[5].strip() == "(no RESULT line)"
    table = summary_markdown(runs, "quick", 4.5).splitlines()
    rows = [row for row in table if row.startswith("| ")]
    header, render_first, render_second, sandbox, total = rows
    assert header.count("|") == render_first.count("|") == sandbox.count("|") == total.count("|")
    assert render_first.startswith("| `render` (load 0.8) | 4 | 4 | ok | time | 0.05 s |")
    assert render_second.startswith("| | | | | time |")
    assert "| FAILED (exit 1) | (no RESULT line) |" in sandbox
    assert total.endswith("| ≤ 300 s | met |")


def test_a_plain_private_stack_is_the_shared_one_when_the_environment_names_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(SHARED_STACK, str(tmp_path))
    with private_stack() as home:
        assert home == tmp_path
    assert tmp_path.exists()  # the stack's owner removes it, not its guests


@pytest.fixture
def never_processed() -> Iterator[str]:
    """An API whose report route always answers that the request is not processed."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"error": "not processed yet"}'
            self.send_response(409)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_waiting_for_a_report_that_never_comes_fails_after_the_timeout(
    never_processed: str,
) -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="no report for r-1 after 0 s: 409"):
        report_links(never_processed, {}, "r-1", timeout=0.3)
    assert time.monotonic() - started < 5


def test_the_idle_time_between_chunks_counts_only_where_no_chunk_runs() -> None:
    # two slots: chunks overlap, one gap of 0.5 s where neither runs, spans out of order
    spans = [(0.0, 1.0), (2.5, 3.0), (0.5, 2.0), (3.0, 4.0)]
    assert idle_seconds(spans) == pytest.approx(0.5)
    assert idle_seconds([(0.0, 1.0)]) == 0.0
    assert idle_seconds([(0.0, 1.0), (0.2, 0.4), (1.25, 2.0)]) == pytest.approx(0.25)


def test_a_rounds_overhead_is_its_pairs_median_plus_the_time_no_chunk_ran_and_the_cpu_beside(
    tmp_path: Path,
) -> None:
    log = tmp_path / "chunks.log"
    log.write_text(
        "other 0 task 0.0 9.0 1 1 1\n"  # another request's: not this round's
        "r 1 task 1.0 2.1 0.01 0.002 0.001\n"  # as the worker ended them, not in chunk order
        "r 0 bare 0.0 1.0 0.02 0.0 0.001\n"
        "r 2 bare 2.2 3.2 0.0 0.0 0.0\n"  # 0.1 s with no chunk running before it
        "r 3 task 3.2 4.0 0.03 0.004 0.002\n"
        "r 4 task 4.0 5.2 0.0 0.0 0.0\n"
        "r 5 bare 5.2 6.2 0.0 0.0 0.0\n"
    )
    chunks = read_chunks(log, "r")
    assert [chunk.number for chunk in chunks] == [0, 1, 2, 3, 4, 5]
    assert chunks[0] == Chunk(0, bare=True, start=0.0, end=1.0, beside=(0.02, 0.0, 0.001))
    this = round_of(chunks)
    # pairs (0, 1), (2, 3), (4, 5), each task against its own pair's bare chunk
    assert this.pairs == pytest.approx([0.1, -0.2, 0.2])
    assert (this.task_ms, this.bare_ms) == pytest.approx((1100, 1000))
    assert this.idle == pytest.approx(0.1)
    assert this.idle_share == pytest.approx(0.1 / 6 / 1.0)
    assert this.beside == pytest.approx((0.06, 0.006, 0.004))
    assert this.beside_share == pytest.approx(0.07 / 6 / 1.0)
    assert this.overhead == pytest.approx(0.1 + 0.1 / 6 + 0.07 / 6)


def test_a_log_without_the_cpu_beside_reads_as_none(tmp_path: Path) -> None:
    log = tmp_path / "chunks.log"
    log.write_text("r 0 bare 0.0 1.0\nr 1 task 1.0 2.0\n")  # chunk_overhead --bare's lines
    assert [chunk.beside for chunk in read_chunks(log, "r")] == [(0.0, 0.0, 0.0)] * 2


def _spin(seconds: float) -> None:
    """Busy for ``seconds`` of this thread's CPU."""
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


def test_the_cpu_beside_a_chunk_counts_the_loop_and_pool_work_outside_its_context(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # install() patches these two; monkeypatch puts them back after the test
    monkeypatch.setattr(asyncio.events.Handle, "_run", asyncio.events.Handle._run)
    monkeypatch.setattr(pool_thread._WorkItem, "run", pool_thread._WorkItem.run)
    beside = Beside()
    beside.install()

    async def chunk() -> None:  # a chunk's work: on the loop, then in the pool
        _spin(0.03)
        await asyncio.to_thread(_spin, 0.12)
        _spin(0.03)

    async def around(started: asyncio.Event) -> None:  # the run's and worker's work beside it
        await started.wait()
        _spin(0.04)
        await asyncio.to_thread(_spin, 0.02)

    async def main() -> tuple[float, float]:
        started = asyncio.Event()
        other = asyncio.create_task(around(started))
        await asyncio.to_thread(_spin, 0.05)  # before the chunk: not counted
        own = contextvars.Context()
        own.run(IN_CHUNK.set, True)
        with beside.chunk() as counting:
            started.set()
            await asyncio.create_task(chunk(), context=own)
            await other  # still inside the chunk's span
        await asyncio.to_thread(_spin, 0.05)  # after it: not counted
        return counting.loop, counting.pool

    assert asyncio.run(main()) == pytest.approx((0.04, 0.02), abs=0.01)


def test_a_threads_result_handed_to_a_chunk_is_the_chunks_and_to_another_is_not() -> None:
    async def main() -> list[bool]:
        loop = asyncio.get_running_loop()
        own = contextvars.Context()
        own.run(IN_CHUNK.set, True)
        awaited_by_chunk, awaited_elsewhere = loop.create_future(), loop.create_future()
        awaited_by_chunk.add_done_callback(lambda _: None, context=own)
        awaited_elsewhere.add_done_callback(lambda _: None)
        hand_back = [  # as _chain_future hands a thread's result back: (future, source)
            asyncio.events.Handle(_set_state, (future, None), loop)
            for future in (awaited_by_chunk, awaited_elsewhere)
        ]
        in_context = asyncio.events.Handle(print, (), loop, context=own)
        elsewhere = asyncio.events.Handle(print, (), loop)
        return [Beside._the_chunks(h) for h in (*hand_back, in_context, elsewhere)]

    def _set_state(future: asyncio.Future[None], other: object) -> None:
        pass

    assert asyncio.run(main()) == [True, False, True, False]


def test_the_cpu_beside_a_chunk_counts_every_other_thread_but_the_pools() -> None:
    release = threading.Event()
    spun = [threading.Event(), threading.Event()]

    def busy(done: threading.Event) -> None:  # alive until released: /proc reads live threads
        _spin(0.05)
        done.set()
        release.wait()

    before = Beside.threads_cpu()
    threads = [
        threading.Thread(target=busy, args=(done,), name=name)
        for done, name in zip(spun, ("run-heartbeats", "asyncio_9"), strict=True)
    ]
    for thread in threads:
        thread.start()
    try:
        for done in spun:
            assert done.wait(10)
        counted = Beside.threads_cpu() - before
    finally:
        release.set()
        for thread in threads:
            thread.join()
    assert counted == pytest.approx(0.05, abs=0.02)  # the heartbeats', not the pool's


def test_a_pair_of_two_chunks_of_one_kind_is_refused() -> None:
    with pytest.raises(AssertionError):
        round_of([Chunk(0, True, 0.0, 1.0), Chunk(1, True, 1.0, 2.0)])


def test_the_chunks_inside_a_window_count_a_chunk_partly_inside_by_its_share() -> None:
    spans = [(0.0, 1.0), (1.0, 3.0), (3.0, 4.0), (4.0, 4.0)]  # the last: no span at all
    assert chunks_inside(spans, 0.0, 4.0) == pytest.approx(3.0)
    assert chunks_inside(spans, 0.5, 2.0) == pytest.approx(0.5 + 0.5)
    assert chunks_inside(spans, 5.0, 6.0) == 0.0


def test_a_pairs_cpu_a_chunk_is_read_over_the_samples_where_both_deliver() -> None:
    sampler = Sampler.__new__(Sampler)  # no thread: its samples only
    # the first delivers 1 chunk a second from 0 to 10 s, the second 2 a second from 2 s
    first = [(float(n), n + 1.0) for n in range(10)]
    second = [(2.0 + n / 2, 2.5 + n / 2) for n in range(20)]
    # CPU: 0.3 s a second for the first, 0.4 for the second; a sample every 0.5 s
    sampler.samples = [(t / 2, 0.3 * t / 2, 0.4 * t / 2) for t in range(0, 25)]
    # in no particular order (a worker's task runs read back, shares among them)
    seconds, mine, theirs, done = sampler.per_chunk(first[::-1], second)
    assert seconds == pytest.approx(8.0)  # 2 s to 10 s, where both deliver
    assert done == pytest.approx(8.0)
    assert mine == pytest.approx(0.3)
    assert theirs == pytest.approx(0.2)
    with pytest.raises(AssertionError, match="at the same time"):
        sampler.per_chunk(first[:2], second)


def test_a_workers_cpu_between_two_times_is_read_from_its_samples_inside_them() -> None:
    worker = Worker.__new__(Worker)  # no process: its samples only
    worker._cpu = [(100.0, 0.0), (101.0, 0.5), (102.0, 1.5), (103.0, 1.5)]
    assert worker.cpu_seconds_between(101.0, 102.0) == pytest.approx(1.0)
    # the samples inside, 1 s apart, scaled to the 2 s asked for
    assert worker.cpu_seconds_between(100.5, 102.5) == pytest.approx(2.0)
    assert worker.cpu_seconds_between(100.0, 103.0) == pytest.approx(1.5)


def test_a_worker_is_not_sampled_while_this_process_times_something() -> None:
    worker = Worker.__new__(Worker)  # its sampler only, of a process that sleeps
    worker.process = subprocess.Popen(["sleep", "30"])
    try:
        worker._start_sampler()
        time.sleep(0.2)
        assert worker._cpu, "the sampler took no sample"
        with worker.unsampled():
            paused = len(worker._cpu)
            time.sleep(0.3)
            assert len(worker._cpu) == paused
        time.sleep(0.2)
        assert len(worker._cpu) > paused
    finally:
        worker.stop()


PIN_APART = """
import json, os, subprocess, sys, threading, time
sys.path.append(sys.argv[1])
from harness import moved_to, pin_apart

started = subprocess.Popen([sys.executable, "-c", "import threading, time\\n"
    "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\\n"
    "time.sleep(30)"])
time.sleep(0.5)  # its second thread runs
running = threading.Thread(target=time.sleep, args=(30,), daemon=True)
running.start()
others = pin_apart(0)
after = subprocess.Popen(["sleep", "30"])
def affinities(pid):
    return sorted({tuple(sorted(os.sched_getaffinity(int(tid))))
                   for tid in os.listdir(f"/proc/{pid}/task")})
try:
    pinned = affinities(os.getpid())
    with moved_to(others):
        moved = affinities(os.getpid())
    print(json.dumps([sorted(others), affinities(started.pid), pinned, affinities(after.pid),
                      moved, affinities(os.getpid())]))
finally:
    started.kill(); after.kill()
"""


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity")
    or len(os.sched_getaffinity(0)) < 2
    or 0 not in os.sched_getaffinity(0),
    reason="pinning apart needs two CPUs, CPU 0 among them",
)
def test_pinning_apart_puts_what_was_started_on_the_other_cpus_and_what_follows_on_one() -> None:
    """And this process, moved to the other CPUs for a while, comes back to its own."""
    env = {k: v for k, v in os.environ.items() if k != PREFECT_PID}  # no stack's server
    out = subprocess.run(
        [sys.executable, "-c", PIN_APART, str(Path(harness.__file__).parent)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    others = sorted(os.sched_getaffinity(0) - {0})
    # the child started before (both its threads), this process (both its threads), the
    # child started after; this process moved to the others, then back
    assert json.loads(out) == [others, [others], [[0]], [[0]], [others], [[0]]]


SLEEPS = """
import threading, time
slept, end = threading.Event(), threading.Event()

def other():
    for _ in range(200):
        time.sleep(0.001)  # off the CPU each time: a voluntary switch, whatever the load
    slept.set()
    end.wait()  # alive while counted: an ended thread leaves /proc

threading.Thread(target=other).start()
slept.wait()
print("ready", flush=True)
input()
end.set()
"""


def _voluntary_per_thread(pid: int) -> dict[str, int]:
    counts = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        status = (task / "status").read_text().splitlines()
        counts[task.name] = next(int(s.split()[1]) for s in status if s.startswith("voluntary_"))
    return counts


def test_a_processs_context_switches_are_summed_over_its_threads() -> None:
    """A second thread sleeps 200 times (each sleep a voluntary switch of its own; a
    hand-over between two threads was not always one under load: a suite run of 2 Dec
    counted 27 of 200, with three test processes on two cores), and the main thread's own
    count (psutil's, /proc/<pid>/status) holds none of them. Read once both threads are
    blocked for good (the main one enters ``input()`` after it says ready): their counts
    no longer move."""
    child = subprocess.Popen(
        [sys.executable, "-c", SLEEPS], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"ready\n"
        per_thread, deadline = _voluntary_per_thread(child.pid), time.monotonic() + 10
        while time.monotonic() < deadline:
            time.sleep(0.1)
            per_thread, before = _voluntary_per_thread(child.pid), per_thread
            if per_thread == before:
                break
        voluntary, _ = harness.thread_switches(child.pid)
    finally:
        child.communicate(b"\n", timeout=30)
    main_alone = per_thread[str(child.pid)]
    assert voluntary == sum(per_thread.values())
    assert len(per_thread) == 2
    assert voluntary - main_alone >= 200


def test_each_threads_cpu_is_read_by_its_id_and_summed_by_its_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two threads of one name spin 0.15 s of CPU each while the main thread waits: the
    readings give their time to them, summed under their name, scaled as asked, and
    little to the main thread. (The names are py-spy's where it is installed: given here.)"""
    spun, release = threading.Barrier(3), threading.Event()

    def spin() -> None:
        end = time.thread_time() + 0.15
        while time.thread_time() < end:
            pass
        spun.wait()
        release.wait()

    spinners = [threading.Thread(target=spin) for _ in range(2)]
    before = harness.thread_cpu(os.getpid())
    for spinner in spinners:
        spinner.start()
    try:
        spun.wait(timeout=30)
        after = harness.thread_cpu(os.getpid())
    finally:
        release.set()
        for spinner in spinners:
            spinner.join()
    main = threading.main_thread().native_id
    names = {spinner.native_id: "spinner" for spinner in spinners} | {main: "MainThread"}
    monkeypatch.setattr(harness, "thread_names", lambda pid: names)
    spent = harness.threads_spent(os.getpid(), before, after, scale=2.0)
    assert spent["spinner"] == pytest.approx(0.6, abs=0.03)
    assert spent["MainThread"] < 0.2


def test_the_threads_names_are_read_from_py_spys_dump() -> None:
    dump = (
        "Process 7556: python t.py\nPython v3.11.7\n\n"
        'Thread 7556 (idle): "MainThread"\n    <module> (t.py:5)\n'
        'Thread 7558 (active+gil): "asyncio_0"\n    f (t.py:3)\n'
        'Thread 0x7F2C (idle): "Thread-1 (_sample)"\n'
        "Thread pool: not a heading\n"
    )
    assert harness.dumped_thread_names(dump) == {
        7556: "MainThread",
        7558: "asyncio_0",
        0x7F2C: "Thread-1 (_sample)",
    }


def test_a_process_tree_s_cpu_counts_its_descendants_and_nothing_once_it_is_gone() -> None:
    """``harness.tree_cpu``: a shell whose child burns 0.5 s of CPU reads that much, less
    the kernel's clock-tick rounding (user and system each counted in whole 10 ms ticks);
    a process that has ended reads 0."""
    burn = (
        "import time\nend = time.process_time() + 0.5\n"
        "while time.process_time() < end: pass\ntime.sleep(30)"
    )
    shell = subprocess.Popen(["sh", "-c", f'"{sys.executable}" -c "$0"; sleep 30', burn])
    try:
        tree = psutil.Process(shell.pid)
        deadline = time.monotonic() + 10
        while harness.tree_cpu(tree) < 0.45 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert harness.tree_cpu(tree) >= 0.45
        assert sum(tree.cpu_times()[:2]) < 0.1  # the shell itself did next to nothing
    finally:
        for each in [tree, *tree.children(recursive=True)]:
            each.kill()
        shell.wait()
    assert harness.tree_cpu(tree) == 0.0
