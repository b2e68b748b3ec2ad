"""Progress while Spark works: a line per step on stderr, and the report's ``index.html``
showing the step and Spark's task counts until the report replaces it."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from qpid_flow.analytics.page import render_progress


class Progress:
    """Steps of a report, announced as they start; a thread samples Spark's status
    tracker once a second for the tasks done in the running stages."""

    def __init__(
        self, title: str, steps: Sequence[str], page: Path | None, spark: Any = None, out: TextIO = sys.stderr
    ) -> None:
        self.title = title
        self.steps = list(steps)
        self.page = page
        self.out = out
        self.done = 0
        self.current = ""
        self.detail = ""
        self.log: list[str] = []
        self.timings: list[tuple[str, float]] = []  # (step, seconds) of each finished step
        self._tracker = spark.sparkContext.statusTracker() if spark is not None else None
        self._started = time.monotonic()
        self._step_started = self._started
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Progress:
        if self._tracker is not None:
            self._thread = threading.Thread(target=self._sample, name="report-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def step(self, name: str) -> None:
        now = time.monotonic()
        with self._lock:
            if self.current:
                self._finished(now)
                self.done += 1
            self.current = name
            self.detail = ""
            self._step_started = now
        index = min(self.done + 1, len(self.steps))
        print(f"report: [{index}/{len(self.steps)}] {name}", file=self.out, flush=True)
        self._write_page()

    def finish(self) -> float:
        elapsed = time.monotonic() - self._started
        with self._lock:
            if self.current:
                self._finished(time.monotonic())
                self.current = ""
            self.done = len(self.steps)
        return elapsed

    def _finished(self, now: float) -> None:
        seconds = now - self._step_started
        self.timings.append((self.current, seconds))
        self.log.append(f"{self.current}: {seconds:.1f} s")

    def _write_page(self) -> None:
        if self.page is None:
            return
        with self._lock:
            text = render_progress(
                self.title, min(self.done, len(self.steps) - 1), len(self.steps), self.current, self.detail, self.log
            )
        temporary = self.page.with_suffix(".tmp")
        temporary.write_text(text, encoding="utf-8")
        temporary.replace(self.page)  # a reader never sees half a page

    def _sample(self) -> None:
        tracker = self._tracker
        assert tracker is not None
        while not self._stop.wait(1.0):
            try:
                stages = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
            except Exception:  # the JVM is going away: nothing more to show
                return
            stages = [s for s in stages if s is not None]
            if not stages:
                continue
            done = sum(s.numCompletedTasks for s in stages)
            total = sum(s.numTasks for s in stages)
            with self._lock:
                self.detail = f"Spark: {done}/{total} tasks of {len(stages)} running stage(s)"
            self._write_page()
