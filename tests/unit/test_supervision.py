"""Specs: `kairos up` restarts a process that exits as a kubelet restarts a container (back-off 1 s
doubling to 30 s, back to 1 s after a minute up), and `kairos status` shows what it restarted."""

from __future__ import annotations

import json
from pathlib import Path

from tools.cli.cluster_cmds import restarts_table
from tools.stack.supervision import (
    BASE_DELAY,
    MAX_DELAY,
    RESET_AFTER,
    Restarts,
    after_exit,
    after_restart,
    read_restarts,
)


def crash_loop(times: int, up_for: float) -> list[float]:
    """The back-off of each of `times` exits of a process that stays up `up_for` seconds each time."""
    record, now, delays = Restarts(0.0), 0.0, []
    for _ in range(times):
        now += up_for
        record = after_exit(record, now, 1)
        delays.append(record.delay)
        now = record.due or now
        record = after_restart(record, now)
    return delays


def test_a_crash_loop_waits_one_second_then_doubles_up_to_thirty() -> None:
    assert crash_loop(8, up_for=0.5) == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert BASE_DELAY == 1.0
    assert MAX_DELAY == 30.0


def test_a_process_that_ran_a_minute_starts_over_at_one_second() -> None:
    assert crash_loop(5, up_for=RESET_AFTER) == [1.0, 1.0, 1.0, 1.0, 1.0]


def test_a_restart_is_due_after_the_back_off_and_counted() -> None:
    record = after_exit(Restarts(started_at=100.0), now=105.0, code=-9)
    assert (record.due, record.last_exit, record.count) == (106.0, -9, 0)
    restarted = after_restart(record, now=106.0)
    assert (restarted.count, restarted.due, restarted.started_at) == (1, None, 106.0)


def test_status_lists_only_what_was_restarted_or_waits(tmp_path: Path) -> None:
    records = {
        "binder-0": Restarts(started_at=0.0, count=2, delay=2.0, last_exit=-9),
        "nats-server": Restarts(started_at=0.0, count=0, delay=1.0, due=110.0, last_exit=-9),
        "queue-0": Restarts(started_at=0.0),
    }
    table = restarts_table(records, now=108.0)
    assert table is not None
    rows = list(zip(*(column.cells for column in table.columns), strict=True))
    assert rows == [("binder-0", "2", "-9", "running"), ("nats-server", "0", "-9", "restarting in 2 s")]
    assert restarts_table({"queue-0": Restarts(started_at=0.0)}, now=1.0) is None


def test_the_record_survives_a_round_trip_and_a_bad_file_reads_as_none(tmp_path: Path) -> None:
    (tmp_path / "restarts.json").write_text(json.dumps({"state-0": {"started_at": 1.0, "count": 3}}))
    assert read_restarts(tmp_path) == {"state-0": Restarts(started_at=1.0, count=3)}
    (tmp_path / "restarts.json").write_text("{not json")
    assert read_restarts(tmp_path) == {}
    (tmp_path / "restarts.json").write_text(json.dumps({"state-0": {"bogus": 1}}))
    assert read_restarts(tmp_path) == {}
    assert read_restarts(tmp_path / "absent") == {}
