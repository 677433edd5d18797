"""Container logs as the local kubelet keeps and serves them (hack/local_kubelet/logfiles.py, shim.py).

`kubectl logs` gets what the kubelet API returns for its options, so the log files must keep each
line's time and stream (the CRI format a container runtime writes) and the reading must honour
tailLines, sinceSeconds/sinceTime, timestamps, limitBytes, stream, previous and follow the way a
kubelet does. The shim is run as the real process it is: it writes the log while the command runs,
and a SIGTERM to its group ends the command but not the copying. Through the API server and kubectl:
tests/e2e/test_local_kubelet.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hack.common import REPO
from hack.local_kubelet.logfiles import (
    BadOptions,
    LogOptions,
    PodLogs,
    Record,
    format_record,
    mark_exit,
    parse_options,
    parse_record,
    read_log,
    timestamp,
)
from hack.local_kubelet.logserver import Identity, identity_of
from tests.cluster import wait_for

SECOND = 1_000_000_000
T0 = 1_700_000_000 * SECOND  # 2023-11-14T22:13:20Z


def test_records_round_trip_in_the_cri_format() -> None:
    assert timestamp(T0 + 5) == "2023-11-14T22:13:20.000000005Z"
    line = format_record(T0, "stdout", b"epoch 1/3\n")
    assert line == b"2023-11-14T22:13:20.000000000Z stdout F epoch 1/3\n"
    assert parse_record(line[:-1]) == Record("2023-11-14T22:13:20.000000000Z", "stdout", False, b"epoch 1/3")
    partial = parse_record(format_record(T0, "stderr", b"no newline yet")[:-1])
    assert partial == Record("2023-11-14T22:13:20.000000000Z", "stderr", True, b"no newline yet")
    assert partial.output(timestamps=False) == b"no newline yet"
    assert partial.output(timestamps=True) == b"2023-11-14T22:13:20.000000000Z no newline yet"
    assert parse_record(b"not a record") is None


def test_options_are_read_as_a_kubelet_reads_them() -> None:
    options = parse_options(
        {"follow": ["true"], "tailLines": ["5"], "limitBytes": ["100"], "timestamps": ["1"]}, T0
    )
    assert options == LogOptions(follow=True, timestamps=True, tail_lines=5, limit_bytes=100)
    assert parse_options({"sinceSeconds": ["10"]}, T0).since == timestamp(T0 - 10 * SECOND)
    assert parse_options({"sinceTime": ["2023-11-14T22:13:00Z"]}, T0).since == timestamp(T0 - 20 * SECOND)
    assert parse_options({"tail": ["all"]}, T0).tail_lines is None
    assert parse_options({"tail": ["3"]}, T0).tail_lines == 3
    assert parse_options({"stream": ["Stderr"]}, T0).streams == ("stderr",)
    assert parse_options({"previous": ["false"]}, T0).previous is False
    for query, message in [
        ({"sinceSeconds": ["1"], "sinceTime": ["2023-11-14T22:13:00Z"]}, "at most one of sinceTime"),
        ({"follow": ["sometimes"]}, "follow: invalid boolean"),
        ({"tailLines": ["-1"]}, "tailLines: must be at least 0"),
        ({"limitBytes": ["0"]}, "limitBytes: must be at least 1"),
        ({"sinceSeconds": ["soon"]}, "sinceSeconds: not an integer"),
        ({"sinceTime": ["yesterday"]}, "sinceTime: not an RFC 3339 time"),
        ({"stream": ["Both"]}, "invalid stream type 'Both'"),
    ]:
        with pytest.raises(BadOptions, match=message):
            parse_options(query, T0)


def write_log(path: Path, *entries: tuple[int, str, bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(format_record(T0 + s * SECOND, stream, chunk) for s, stream, chunk in entries))
    return path


def read(path: Path, **options: object) -> bytes:
    return b"".join(read_log(path, LogOptions(**options)))  # type: ignore[arg-type]


def test_reading_honours_tail_since_timestamps_limit_and_stream(tmp_path: Path) -> None:
    log = write_log(
        tmp_path / "0.log",
        (0, "stdout", b"one\n"),
        (1, "stderr", b"two\n"),
        (2, "stdout", b"thr"),
        (2, "stdout", b"ee\n"),
        (3, "stdout", b"four\n"),
    )
    with log.open("ab") as handle:
        handle.write(b"2023-11-14T22:13:24.0Z stdout F half a li")  # being written: not read yet
    assert read(log) == b"one\ntwo\nthree\nfour\n"
    assert read(log, tail_lines=2) == b"ee\nfour\n"  # records, as a kubelet counts them
    assert read(log, tail_lines=0) == b""
    assert read(log, since=timestamp(T0 + 2 * SECOND)) == b"three\nfour\n"
    assert read(log, streams=("stderr",)) == b"two\n"
    assert read(log, limit_bytes=6) == b"one\ntw"
    assert read(log, tail_lines=1, timestamps=True) == b"2023-11-14T22:13:23.000000000Z four\n"


def test_follow_reads_new_output_until_the_container_has_ended(tmp_path: Path) -> None:
    log = write_log(tmp_path / "0.log", (0, "stdout", b"before\n"))
    chunks: list[bytes] = []
    follower = threading.Thread(target=lambda: chunks.extend(read_log(log, LogOptions(follow=True))))
    follower.start()
    wait_for("the existing output", lambda: chunks == [b"before\n"], 10)
    with log.open("ab") as handle:
        handle.write(format_record(T0, "stdout", b"during\n"))
    wait_for("the new output", lambda: len(chunks) == 2, 10)
    assert follower.is_alive()
    with log.open("ab") as handle:
        handle.write(format_record(T0, "stdout", b"last words\n"))
    mark_exit(log, 0)
    follower.join(10)
    assert not follower.is_alive()
    assert b"".join(chunks) == b"before\nduring\nlast words\n"
    # A follower that is told to stop (the reader hung up) stops without the exit marker.
    other = write_log(tmp_path / "other.log", (0, "stdout", b"x\n"))
    assert b"".join(read_log(other, LogOptions(follow=True), stopped=lambda: True)) == b"x\n"


def test_previous_is_the_earlier_run_of_the_container_or_of_the_pod_of_that_name(tmp_path: Path) -> None:
    logs = PodLogs(tmp_path)
    logs.register("ml", "job-worker-0", "uid-a", "0")
    write_log(logs.instance("ml", "job-worker-0", "uid-a", "trainer", 0), (0, "stdout", b"attempt 0\n"))
    time.sleep(0.01)  # the pods are ordered by when their directory was made
    logs.register("ml", "job-worker-0", "uid-b", "1")
    assert logs.choose("ml", "job-worker-0", "uid-b", "trainer", previous=False) is None  # not started
    current = write_log(logs.instance("ml", "job-worker-0", "uid-b", "trainer", 0), (1, "stdout", b"1\n"))
    assert logs.choose("ml", "job-worker-0", "uid-b", "trainer", previous=False) == current
    earlier = logs.choose("ml", "job-worker-0", "uid-b", "trainer", previous=True)
    assert earlier is not None
    assert read(earlier) == b"attempt 0\n"
    assert logs.choose("ml", "job-worker-0", "uid-a", "trainer", previous=True) is None
    # A restarted native sidecar: its previous run is in the same pod.
    for restart in range(3):
        write_log(
            logs.instance("ml", "job-worker-0", "uid-b", "tailer", restart), (restart, "stdout", b"r\n")
        )
    assert logs.choose("ml", "job-worker-0", "uid-b", "tailer", previous=False).name == "2.log"  # type: ignore[union-attr]
    assert logs.choose("ml", "job-worker-0", "uid-b", "tailer", previous=True).name == "1.log"  # type: ignore[union-attr]
    mark_exit(current, 0)
    mark_exit(current, 137)  # the first word stays
    assert current.with_suffix(".exit").read_text() == "0\n"


def run_shim(tmp_path: Path, command: list[str]) -> tuple[subprocess.Popen[bytes], Path, Path]:
    log, journal = tmp_path / "pod" / "c" / "0.log", tmp_path / "journal.log"
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "command": command,
                "env": {"PATH": os.environ["PATH"], "GREETING": "hello"},
                "cwd": str(tmp_path),
                "log": str(log),
                "journal": str(journal),
                "prefix": "[c] ",
            }
        )
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "hack.local_kubelet.shim", str(spec)], cwd=REPO, start_new_session=True
    )
    return process, log, journal


def test_the_shim_keeps_each_line_with_its_time_and_stream_and_passes_the_exit_code(tmp_path: Path) -> None:
    code = (
        "import os, sys; print(os.environ['GREETING'], os.getcwd()); sys.stdout.flush(); "
        "sys.stderr.write('warning\\n'); sys.stderr.flush(); sys.stdout.write('partial'); sys.exit(3)"
    )
    process, log, journal = run_shim(tmp_path, [sys.executable, "-c", code])
    assert process.wait(30) == 3
    assert not (tmp_path / "spec.json").exists()  # the environment is not left on disk
    records = [parse_record(line) for line in log.read_bytes().splitlines()]
    # Each stream in its order (the two pipes are read apart, so not in order with each other).
    by_stream = {
        stream: [(r.partial, r.content) for r in records if r is not None and r.stream == stream]
        for stream in ("stdout", "stderr")
    }
    assert by_stream == {
        "stdout": [(False, f"hello {tmp_path}".encode()), (True, b"partial")],
        "stderr": [(False, b"warning")],
    }
    assert all(r is not None and r.time.endswith("Z") for r in records)
    journal_text = journal.read_text()  # the streams interleave there as they come
    assert f"[c] hello {tmp_path}\n" in journal_text
    assert "warning\n" in journal_text
    assert "[c] partial" in journal_text


def test_a_sigterm_to_the_group_ends_the_command_and_the_shim_reports_it(tmp_path: Path) -> None:
    code = (
        "import signal, sys, time\n"
        "def bye(*_):\n    print('terminated, saving', flush=True); sys.exit(143)\n"
        "signal.signal(signal.SIGTERM, bye); print('ready', flush=True)\n"
        "while True: time.sleep(0.1)\n"
    )
    process, log, _journal = run_shim(tmp_path, [sys.executable, "-c", code])
    wait_for("the command running", lambda: log.exists() and b"ready" in log.read_bytes(), 30)
    os.killpg(process.pid, signal.SIGTERM)
    assert process.wait(30) == 143
    assert b"terminated, saving" in log.read_bytes()  # the shim outlived the signal to copy it


def test_a_command_that_cannot_start_exits_128_with_the_reason_in_the_log(tmp_path: Path) -> None:
    process, log, _journal = run_shim(tmp_path, [str(tmp_path / "no-such-program")])
    assert process.wait(30) == 128
    assert b"local kubelet: cannot start" in log.read_bytes()


def test_a_client_certificate_names_the_user_and_its_groups() -> None:
    subject = ((("organizationName", "team-a"),), (("organizationName", "ml"),), (("commonName", "alice"),))
    assert identity_of({"subject": subject}) == Identity("alice", ("team-a", "ml", "system:authenticated"))
    assert identity_of({}) is None  # no certificate given
    assert identity_of({"subject": ((("organizationName", "nameless"),),)}) is None
