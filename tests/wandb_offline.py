"""W&B's offline runs read back from their `.wandb` files, for the tests of the reference trainer's W&B
run (tests/trainer/test_tracking_wandb.py, tests/e2e/test_mlflow_real_node.py).

Why here: the wandb package (0.31) writes and reads its transaction log in its Go core and has no
Python reader any more. The file is a LevelDB-style log (a `:W&B` header, then 32 KiB blocks of
records with a 7-byte header: checksum, length, type: whole, first, middle or last piece), and each
record is a `Record` of wandb's own protocol buffers (`wandb.proto.wandb_internal_pb2`), which parse
it here. What a test asserts about a run is what W&B itself would upload from the file with `wandb sync`.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from wandb.proto import wandb_internal_pb2

HEADER: Final = b":W&B"
HEADER_LENGTH: Final = 7  # ":W&B", a 2-byte magic, a 1-byte version
BLOCK: Final = 32 * 1024
RECORD_HEADER: Final = struct.Struct("<IHB")  # checksum, length, type
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    """The records of one `.wandb` file, in the order written."""
    data = path.read_bytes()
    if data[: len(HEADER)] != HEADER:
        raise ValueError(f"{path} is not a W&B transaction log")
    parsed: list[Any] = []
    position, pieces = HEADER_LENGTH, b""
    while position + RECORD_HEADER.size <= len(data):
        left_in_block = BLOCK - position % BLOCK
        if left_in_block < RECORD_HEADER.size:  # the block's padding
            position += left_in_block
            continue
        _, length, kind = RECORD_HEADER.unpack_from(data, position)
        if kind == 0 and length == 0:  # zeros to the block's end
            position += left_in_block
            continue
        chunk = data[position + RECORD_HEADER.size : position + RECORD_HEADER.size + length]
        position += RECORD_HEADER.size + length
        if kind in (FULL, FIRST):
            pieces = b""
        pieces += chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            parsed.append(record)
    return parsed


def _value(text: str) -> Any:
    return json.loads(text) if text else None


@dataclass
class OfflineRun:
    """One attempt's run directory: its run's id, project, group and name, its config, its history
    (each logged row by step), and how the attempt ended it."""

    directory: Path
    run_id: str = ""
    project: str = ""
    group: str = ""
    name: str = ""
    start_time: float = 0.0
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    preempting: bool = False
    exit_code: int | None = None

    def steps(self, metric: str) -> list[int]:
        return [int(row["_step"]) for row in self.history if metric in row]


def read_run(directory: Path) -> OfflineRun:
    (log,) = directory.glob("run-*.wandb")
    run = OfflineRun(directory)
    for record in records(log):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            info = record.run
            run.run_id, run.project, run.group, run.name = (
                info.run_id,
                info.project,
                info.run_group,
                info.display_name,
            )
            run.start_time = info.start_time.seconds + info.start_time.nanos / 1e9
            run.config.update({item.key: _value(item.value_json) for item in info.config.update})
        elif kind == "config":
            run.config.update({item.key: _value(item.value_json) for item in record.config.update})
        elif kind == "history":
            row = {
                (item.key or "/".join(item.nested_key)): _value(item.value_json)
                for item in record.history.item
            }
            run.history.append(row)
        elif kind == "preempting":
            run.preempting = True
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    return run


def offline_runs(wandb_dir: Path) -> list[OfflineRun]:
    """Every offline run directory under `wandb_dir` (WANDB_DIR's `wandb/`), in the order the attempts
    started them."""
    return sorted(
        (read_run(path) for path in wandb_dir.glob("offline-run-*")), key=lambda run: run.start_time
    )
