"""Progress bars that tell the truth about long work, on stderr; one helper for
every long loop of the package, so they all say the same things the same way.

* :class:`StepProgress` -- steps towards ``max_steps``, with an optional time
  budget (``max_seconds``). When the budget ends the run first, the bar's total
  is the step the run will stop at (the steps reachable within the budget at
  the measured rate), the ETA is ``min(steps left / rate, budget left)``, and
  the bar says which bound ends the run: ``stops at 30m budget`` or ``stops at
  step 6000``. Steps done before a resume are not counted in the rate. Without
  a budget it is a plain count (names encoded, mentions mined).
* :class:`InputProgress` -- bytes of input files as the bar's total (for a
  ``.gz``, its bytes on disk: the position of the compressed file), with
  documents/s and mentions/s (any named counts) as its postfix. Work found done
  before (a resumed run's committed documents) is counted apart and left out
  of the rates and the ETA.
* :func:`watch_file` -- called by the package's file openers (:mod:`spacy_genbioel.util`,
  :mod:`spacy_genbioel.annotate.lines`), so an :class:`InputProgress` sees how
  far into its files the readers are without the readers knowing about it.
* :func:`wanted` -- whether a bar is drawn: never when the caller says no
  (``progress=False``, ``--no-progress``) or ``GENBIOEL_PROGRESS=0`` is set;
  otherwise when stderr is a terminal (``GENBIOEL_PROGRESS=1``: always).

The arithmetic (:func:`estimate_steps`, :func:`estimate_input`) is pure and
takes its clock readings as arguments; the classes take their clocks as
arguments, so both are tested with a fake clock. The bars are tqdm's; while
one is drawn, log records are printed above it (``tqdm.contrib.logging``), so
logging goes on as before. Nothing here imports from the package.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, TypeVar, Union

__all__ = [
    "ENV",
    "LARGE",
    "InputEstimate",
    "InputProgress",
    "ProgressSettings",
    "StepEstimate",
    "StepProgress",
    "ByteMeter",
    "estimate_input",
    "estimate_steps",
    "format_rate",
    "format_seconds",
    "wanted",
    "watch_file",
]

#: the environment variable that turns every bar off (``0``) or on even without a terminal (``1``)
ENV = "GENBIOEL_PROGRESS"
#: from how many names an index or trie build shows a bar unless told otherwise
LARGE = 100_000
#: seconds between two redraws
REDRAW = 0.5

T = TypeVar("T")
Clock = Callable[[], float]
_END = object()
_BAR = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"
_COUNT = "{desc}: {n_fmt} [{elapsed}{postfix}]"


def wanted(flag: Optional[bool] = None, file: Optional[IO[str]] = None) -> bool:
    """Whether to draw a bar: not when ``flag`` is False or ``GENBIOEL_PROGRESS=0``; with
    ``GENBIOEL_PROGRESS=1`` always; otherwise when ``file`` (default stderr) is a terminal."""
    if flag is False:
        return False
    env = os.environ.get(ENV, "").strip().lower()
    if env in ("0", "false", "no", "off"):
        return False
    if env in ("1", "true", "yes", "on"):
        return True
    stream = file if file is not None else sys.stderr
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


def format_seconds(seconds: float) -> str:
    """``45s``, ``12m05s``, ``30m``, ``3h12m`` (rounded up to the unit shown: an ETA never reads short)."""
    seconds = max(0, math.ceil(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s" if seconds % 60 else f"{seconds // 60}m"
    minutes = math.ceil(seconds / 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes % 60 else f"{minutes // 60}h"


def format_rate(rate: float) -> str:
    """Three significant figures at most, no exponent: ``1234``, ``56.7``, ``8.90``, ``0.123``."""
    if rate >= 100:
        return f"{rate:.0f}"
    if rate >= 10:
        return f"{rate:.1f}"
    return f"{rate:.2f}" if rate >= 1 else f"{rate:.3g}"


# -- steps, with a time budget ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepEstimate:
    """Where a run of steps will stop and when. ``total``: the step it stops at;
    ``eta``: wall seconds until then (None before this run's first step);
    ``bound``: ``"steps"``, ``"budget"`` or ``"unknown"`` (no rate yet, both bounds
    set); ``rate``: steps per wall second in this run."""

    total: int
    eta: Optional[float]
    bound: str
    rate: Optional[float]


def estimate_steps(
    step: int,
    max_steps: int,
    *,
    initial: int = 0,
    elapsed: float = 0.0,
    max_seconds: Optional[float] = None,
    budget_elapsed: Optional[float] = None,
    budget_before: float = 0.0,
) -> StepEstimate:
    """Where a run at ``step`` stops: ``max_steps``, or the time budget when that ends first.

    ``initial`` is the step this run started at (a resumed run's steps before it
    are not in the rate); ``elapsed`` the wall seconds of this run;
    ``budget_elapsed`` the seconds of this run on the budget's clock (default
    ``elapsed``; a CPU-time budget runs another clock) and ``budget_before`` the
    budget spent before it. The steps reachable within the budget are
    ``budget left x steps per budget second``; the ETA turns them into wall time."""
    steps_left = max(0, max_steps - step)
    budget_elapsed = elapsed if budget_elapsed is None else budget_elapsed
    seconds_left = None if max_seconds is None else max(0.0, max_seconds - budget_before - budget_elapsed)
    done = step - initial
    rate = done / elapsed if done > 0 and elapsed > 0 else None
    if seconds_left == 0.0 and steps_left:
        return StepEstimate(step, 0.0, "budget", rate)  # the run stops after this step
    if rate is None:
        return StepEstimate(max_steps, None, "steps" if max_seconds is None else "unknown", None)
    if seconds_left is not None:
        budget_rate = done / budget_elapsed if budget_elapsed > 0 else rate
        reachable = seconds_left * budget_rate
        if reachable < steps_left:
            return StepEstimate(min(max_steps, step + math.ceil(reachable)), reachable / rate, "budget", rate)
    return StepEstimate(max_steps, steps_left / rate, "steps", rate)


class _Bar:
    """A tqdm bar on stderr (or ``file``), or nothing when :func:`wanted` says no; while
    it is drawn, console log records go above it."""

    def __init__(self, enabled: Optional[bool], file: Optional[IO[str]], **options: Any) -> None:
        self.tqdm = None
        self._redirect = contextlib.ExitStack()
        if not wanted(enabled, file):
            return
        from tqdm import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        total = options.get("total")
        options.setdefault("bar_format", _BAR if total else _COUNT)
        self.tqdm = tqdm(
            file=file if file is not None else sys.stderr, dynamic_ncols=True, mininterval=REDRAW, **options
        )
        self._redirect.enter_context(logging_redirect_tqdm())

    def close(self) -> None:
        if self.tqdm is not None:
            self.tqdm.close()
            self._redirect.close()


@dataclass(frozen=True)
class ProgressSettings:
    """How a :class:`StepProgress` counts, what budget it knows and how it is drawn."""

    #: the step this run starts at (a resumed run's; steps before it are not in the rate)
    initial: int = 0
    #: the time budget in seconds on ``clock`` (None: steps only)
    max_seconds: Optional[float] = None
    #: budget spent before a resume
    budget_before: float = 0.0
    #: the budget's clock (default: ``wall``; a CPU-time budget runs another)
    clock: Optional[Clock] = None
    #: the wall clock of the rate and the ETA
    wall: Clock = time.monotonic
    #: the budget's name on the bar (``budget``, ``cpu budget``, ``round budget``)
    budget_name: str = "budget"
    #: what a step is called on the bar (``step``, ``name``, ``text``)
    unit: str = "step"
    #: draw the bar: False never, None or True as :func:`wanted` decides
    enabled: Optional[bool] = True
    #: the stream drawn on (default: stderr)
    file: Optional[IO[str]] = None
    #: keep the finished bar on screen
    leave: bool = True


class StepProgress:
    """A bar of steps towards ``max_steps`` that knows the time budget.

    ``settings`` (:class:`ProgressSettings`; :meth:`start` takes them as
    keywords) give the start step and budget as :func:`estimate_steps` takes
    them, the clocks (``clock`` the budget's, default ``wall``,
    :func:`time.monotonic`) and how the bar is drawn. ``update(n, loss=...)``
    counts steps and shows the named values; ``close`` (or the ``with`` block)
    ends the bar, ``close(stopped=True)`` at the step reached. :meth:`estimate`
    works with or without a bar."""

    def __init__(self, desc: str, max_steps: int, settings: Optional[ProgressSettings] = None) -> None:
        s = settings or ProgressSettings()
        self.settings = s
        self.max_steps, self.initial, self.step = int(max_steps), int(s.initial), int(s.initial)
        self.max_seconds, self.budget_before, self.budget_name, self.unit = (
            s.max_seconds,
            s.budget_before,
            s.budget_name,
            s.unit,
        )
        self.wall, self.clock = s.wall, s.clock or s.wall
        self._values: Dict[str, Any] = {}  # of the last update (loss, lr...)
        self._drawn = -math.inf
        self._wall0, self._clock0 = self.wall(), self.clock()
        self._bar = _Bar(
            s.enabled,
            s.file,
            total=self.max_steps,
            desc=desc,
            unit=s.unit,
            initial=self.initial,
            leave=s.leave,
            postfix=self.describe(self.estimate()),
        )
        self.bar = self._bar.tqdm

    @classmethod
    def start(cls, desc: str, max_steps: int, **settings: Any) -> "StepProgress":
        """``StepProgress(desc, max_steps, ProgressSettings(**settings))``: the settings as keywords
        (``StepProgress.start("encode", n, unit="text", enabled=False)``)."""
        return cls(desc, max_steps, ProgressSettings(**settings))

    def estimate(self) -> StepEstimate:
        return estimate_steps(
            self.step,
            self.max_steps,
            initial=self.initial,
            elapsed=self.wall() - self._wall0,
            max_seconds=self.max_seconds,
            budget_elapsed=self.clock() - self._clock0,
            budget_before=self.budget_before,
        )

    def describe(self, est: StepEstimate, stopped: bool = False) -> str:
        """The postfix: rate, time left and the bound that ends the run (``stopped``: the one that did)."""
        parts = [f"{format_rate(est.rate)} {self.unit}/s"] if est.rate is not None else []
        budget = f"{format_seconds(self.max_seconds)} {self.budget_name}" if self.max_seconds is not None else None
        if stopped:
            if budget is not None and self.step < self.max_steps:
                parts.append(f"stopped by the {budget}")
            return ", ".join(parts)
        if est.eta is not None:
            parts.append(f"{format_seconds(est.eta)} left")
        if budget is not None:
            parts.append(
                {"budget": f"stops at {budget}", "steps": f"stops at {self.unit} {self.max_steps}"}.get(
                    est.bound, f"stops at {self.unit} {self.max_steps} or {budget}"
                )
            )
        return ", ".join(parts)

    def update(self, n: int = 1, **values: Any) -> None:
        self.step += n
        if self.bar is None:
            return
        self._values = values
        now = self.wall()
        if now - self._drawn >= REDRAW or self.step >= self.max_steps:  # the estimate, at most once per redraw
            self._drawn = now
            est = self.estimate()
            self.bar.total = max(est.total, self.step)
            self.bar.set_postfix_str(", ".join(p for p in (self.describe(est), self.shown()) if p), refresh=False)
        self.bar.update(n)

    def shown(self) -> str:
        """The values of the last update (``loss=0.1234, lr=...``)."""
        return ", ".join(f"{k}={v}" for k, v in self._values.items())

    def wrap(self, items: Iterable[T], every: int = 1024) -> Iterator[T]:
        """``items``, counted ``every`` at a time (for a loop that is not ours, such as a fit)."""
        pending = 0
        for item in items:
            yield item
            pending += 1
            if pending == every:
                self.update(pending)
                pending = 0
        if pending:
            self.update(pending)

    def close(self, stopped: bool = False) -> None:
        """End the bar; ``stopped``: the run ended here, so the total is the step reached."""
        if self.bar is not None and stopped:
            self.bar.total = self.step
            self.bar.set_postfix_str(
                ", ".join(p for p in (self.describe(self.estimate(), stopped=True), self.shown()) if p), refresh=False
            )
        self._bar.close()

    def __enter__(self) -> "StepProgress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# -- bytes of input files --------------------------------------------------------------------------------------
_METER: ContextVar[Optional["ByteMeter"]] = ContextVar("genbioel_byte_meter", default=None)


def _key(path: Union[str, "os.PathLike[str]"]) -> str:
    return os.path.realpath(os.fspath(path))


def watch_file(path: Union[str, "os.PathLike[str]"], handle: Any) -> None:
    """Tell the :class:`ByteMeter` in effect (if any) that ``path`` was opened as ``handle``
    (the file on disk: for a ``.gz``, the compressed file). Called by the openers."""
    meter = _METER.get()
    if meter is not None:
        meter.opened(path, handle)


class ByteMeter:
    """How far readers are through ``paths``, read in order: the files before the
    one being read count whole, that one counts up to the position of its handles
    on disk (``tell()`` of the compressed file for a ``.gz``, read when asked),
    or whole once they are all closed. Files that are not in ``paths`` are not counted."""

    def __init__(self, paths: Sequence[Union[str, "os.PathLike[str]"]]) -> None:
        self.keys = [_key(p) for p in paths]
        self.sizes = [os.path.getsize(p) if os.path.isfile(p) else 0 for p in paths]
        self.total = sum(self.sizes)
        self._current, self._done, self._offset = -1, 0, 0
        self._handles: List[Any] = []
        self.finished = False

    def opened(self, path: Union[str, "os.PathLike[str]"], handle: Any) -> None:
        key = _key(path)
        index = next((i for i in range(max(self._current, 0), len(self.keys)) if self.keys[i] == key), None)
        if index is None:  # not one of ours (a side file), or one read before
            return
        if index != self._current:
            self._current, self._done, self._offset, self._handles = index, sum(self.sizes[:index]), 0, []
        self._handles.append(handle)

    def finish(self) -> None:
        """Every file was read to its end: the position is the total from now on."""
        self.finished = True

    def position(self) -> int:
        if self.finished:
            return self.total
        if self._current < 0:
            return 0
        size, reading = self.sizes[self._current], False
        for handle in self._handles:
            try:
                self._offset = max(self._offset, int(handle.tell()))
                reading = True
            except (ValueError, OSError, AttributeError):  # closed
                pass
        # every handle of the file closed: its reader is done with it (to its end, or to damage it skips)
        return self._done + (min(self._offset, size) if reading else size)

    @contextlib.contextmanager
    def active(self) -> Iterator["ByteMeter"]:
        """Files opened in this block (by the openers that call :func:`watch_file`) are measured."""
        previous = _METER.set(self).old_value
        try:
            yield self
        finally:
            _METER.set(None if previous is Token.MISSING else previous)


@dataclass(frozen=True)
class InputEstimate:
    """``position`` of ``total`` bytes; ``eta`` in seconds (None before any measured
    work); ``rates``: each count per second of measured work."""

    position: int
    total: int
    eta: Optional[float]
    rates: Dict[str, float] = field(default_factory=dict)


def estimate_input(
    position: int, total: int, *, start: int = 0, seconds: float = 0.0, counts: Optional[Dict[str, int]] = None
) -> InputEstimate:
    """At ``position`` of ``total`` bytes, with the measured work starting at byte
    ``start`` (after what was skipped) ``seconds`` ago and giving ``counts``: the
    bytes still to read at the measured bytes/s, and each count per second."""
    position = min(position, total) if total else position
    work = position - start
    rate = work / seconds if seconds > 0 and work > 0 else None
    eta = max(0, total - position) / rate if rate else None
    rates = {k: v / seconds for k, v in (counts or {}).items()} if seconds > 0 else {}
    return InputEstimate(position, total, eta, rates)


class InputProgress:
    """A bar over the bytes of ``paths`` with named counts (``counts=("docs", "mentions")``).

    Pull the reader's records through :meth:`read` (or read inside ``with
    progress.metering():``); call ``add(docs=1, mentions=3)`` for work done and
    ``skip(n)`` for records found done before (``skipped`` names them on the bar,
    ``resumed`` by default). Rates and ETA measure the work after the last skip
    only. ``clock`` is injectable; a ``with`` block that ends without an error
    ends the bar at its total."""

    def __init__(
        self,
        desc: str,
        paths: Sequence[Union[str, "os.PathLike[str]"]],
        *,
        counts: Sequence[str] = ("docs",),
        skipped: str = "resumed",
        enabled: Optional[bool] = True,
        file: Optional[IO[str]] = None,
        clock: Clock = time.monotonic,
        leave: bool = True,
    ) -> None:
        self.meter = ByteMeter(paths)
        self.clock, self.skipped_name = clock, skipped
        self.counts: Dict[str, int] = dict.fromkeys(counts, 0)
        self.skipped = 0
        self._mark = (self.clock(), 0, dict(self.counts))  # where the measured work starts: after the last skip
        self._drawn = -math.inf
        total = self.meter.total or None
        self._bar = _Bar(
            enabled,
            file,
            total=total,
            desc=desc,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            leave=leave,
            bar_format=(_BAR if total else _COUNT)
            .replace("{n_fmt}", "{n_fmt}B")
            .replace("{total_fmt}", "{total_fmt}B"),
        )
        self.bar = self._bar.tqdm

    def metering(self) -> Any:
        """A ``with`` block in which the files opened are measured."""
        return self.meter.active()

    def read(self, items: Iterable[T], count: Optional[str] = None) -> Iterator[T]:
        """``items`` (a reader's records), each pulled with the meter in effect (never across
        a ``yield``); ``count`` names a count to add 1 to per item. At their end, every input
        has been read."""
        iterator, counts = iter(items), self.counts
        if count is not None:
            counts.setdefault(count, 0)
        while True:
            token = _METER.set(self.meter)
            try:
                item = next(iterator, _END)
            finally:
                _METER.reset(token)
            if item is _END:
                self.meter.finish()
                return
            if count is not None:
                counts[count] += 1
                if self.bar is not None:
                    self._tick()
            yield item  # type: ignore[misc]

    def add(self, **counts: int) -> None:
        for name, n in counts.items():
            self.counts[name] = self.counts.get(name, 0) + n
        self._tick()

    def skip(self, n: int = 1) -> None:
        self.skipped += n
        self._mark = (self.clock(), self.meter.position(), dict(self.counts))
        self._tick()

    def estimate(self) -> InputEstimate:
        began, start, before = self._mark
        return estimate_input(
            self.meter.position(),
            self.meter.total,
            start=start,
            seconds=self.clock() - began,
            counts={k: v - before.get(k, 0) for k, v in self.counts.items()},
        )

    def describe(self, est: InputEstimate) -> str:
        parts = [f"{format_seconds(est.eta)} left"] if est.eta is not None and est.position < est.total else []
        parts += [f"{format_rate(rate)} {name}/s" for name, rate in est.rates.items()]
        first = next(iter(self.counts), None)
        if first is not None:
            parts.append(f"{self.counts[first]:,} {first}")
        if self.skipped:
            parts.append(f"{self.skipped:,} {self.skipped_name}")
        return ", ".join(parts)

    def _tick(self, force: bool = False) -> None:
        if self.bar is None:
            return
        now = self.clock()
        if not force and now - self._drawn < REDRAW:
            return
        self._drawn = now
        est = self.estimate()
        self.bar.n = est.position
        self.bar.set_postfix_str(self.describe(est), refresh=False)
        self.bar.refresh()

    def close(self, finished: bool = False) -> None:
        """End the bar; ``finished``: every input was read (the bar ends at its total)."""
        if self.bar is not None:
            if finished:
                self.meter.finish()
            self._tick(force=True)
        self._bar.close()

    def __enter__(self) -> "InputProgress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close(finished=exc[0] is None)
