"""A progress bar for a TrainingJob, drawn by tqdm: a widget in a notebook, a text bar in a terminal.

Why tqdm: `tqdm.auto` picks the Jupyter widget when it runs in a notebook kernel (and ipywidgets is
there) and the classic text bar otherwise, handles terminals that are not terminals (CI logs, a pipe)
and redraws in place; a hand-written bar would do one of those badly. The bar is driven only by what
the operator writes into status: `progress` (else currentEpoch/totalEpochs) for the fill, the state
in the description, and epoch, metrics and restarts after the bar.
"""

from __future__ import annotations

from typing import Any, TextIO

from tqdm.auto import tqdm

from trainingjob_client.views import JobStatus, TrainingJob

BAR_FORMAT = "{desc} {percentage:3.0f}%|{bar}| "


def postfix(status: JobStatus) -> str:
    """epoch, metrics and restarts, the way the bar shows them after itself."""
    parts = []
    if status.current_epoch is not None or status.total_epochs is not None:
        total = "?" if status.total_epochs is None else status.total_epochs
        parts.append(f"epoch {status.current_epoch or 0}/{total}")
    parts += [f"{key} {status.metrics[key]:.4g}" for key in sorted(status.metrics)]
    if status.restart_count:
        parts.append(f"restarts {status.restart_count}")
    return "  ".join(parts)


class ProgressBar:
    """One bar per job; `update(job)` on every change, `close()` at the end (also a context manager)."""

    def __init__(self, name: str, *, file: TextIO | None = None, leave: bool = True) -> None:
        self.name = name
        self._bar: Any = tqdm(
            total=100,
            desc=name,
            bar_format=BAR_FORMAT,
            file=file,
            leave=leave,
            dynamic_ncols=True,
            mininterval=0,
        )
        self._state: str | None = None

    def update(self, job: TrainingJob) -> None:
        status = job.status
        percent = status.percent()
        if percent is not None:
            self._bar.n = percent
        self._bar.set_description_str(f"{self.name} {status.state or 'Pending'}", refresh=False)
        # The details go into the format itself: tqdm's own postfix would start with ", ".
        details = postfix(status).replace("{", "{{").replace("}", "}}")
        self._bar.bar_format = BAR_FORMAT + details
        self._bar.refresh()

    def write(self, line: str) -> None:
        """Prints a line above the bar without breaking it (state changes, messages)."""
        self._bar.write(line, file=self._bar.fp)

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
