"""What every scenario works with: the run's context (:class:`Ctx`: sizes, folders, the host
measured, plots), the :class:`Section` and :class:`Table` it returns, and running a host
timed on a file of requests."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._support import Native, file_fed, repeat


@dataclass
class Table:
    caption: str
    header: list[str]
    rows: list[list[str]]


@dataclass
class Section:
    key: str
    title: str
    explain: str
    tables: list[Table] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
    headline: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass
class Ctx:
    quick: bool
    out: Path
    work: Path
    host: str
    native: Native
    status: Callable[[str], None]
    reps: int = 0

    def __post_init__(self) -> None:
        self.reps = 3 if self.quick else 5

    def n(self, quick: int, full: int) -> int:
        return quick if self.quick else full

    def lines(self, name: str, line: str, count: int) -> Path:
        path = self.work / f"{name}.ndjson"
        if not path.exists():
            with path.open("w") as f:
                for _ in range(count // 1000):
                    f.write((line + "\n") * 1000)
                f.write((line + "\n") * (count % 1000))
        return path

    def plot(self) -> Any:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        return plt

    def lines_plot(self, section: Section, name: str, title: str, xlabel: str, ylabel: str,
                   series: dict[str, tuple[list[float], list[float]]], *, logx: bool = False,
                   logy: bool = False, zero: bool = False, xticks: list[float] | None = None) -> None:
        """One line per series (label: (xs, ys)); a label starting with "ideal" is dashed."""
        fig, ax = self.plot().subplots(figsize=(5.5, 3.2))
        for label, (xs, ys) in series.items():
            ax.plot(xs, ys, marker="" if label.startswith("ideal") else "o",
                    linestyle="--" if label.startswith("ideal") else "-", label=label)
        if logx:
            ax.set_xscale("log", base=2 if xticks else 10)
        if logy:
            ax.set_yscale("log")
        if zero:
            ax.set_ylim(bottom=0)
        if xticks:
            ax.set_xticks(xticks, [f"{x:g}" for x in xticks])
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        if len(series) > 1:
            ax.legend(fontsize=8)
        self.save(fig, name, section)

    def save(self, fig: Any, name: str, section: Section) -> None:
        fig.tight_layout()
        fig.savefig(self.out / name, dpi=110)
        self.plot().close(fig)
        section.plots.append(name)


def timed_host(cmd: list[str], stdin: Path, ctx: Ctx, expect: int,
               env: dict[str, str] | None = None) -> Callable[[], float]:
    out = ctx.work / "out.ndjson"

    def run() -> float:
        return file_fed(cmd, stdin, out, expect, env=env).seconds

    return run


def startup_s(ctx: Ctx, cmd: list[str], env: dict[str, str] | None = None) -> float:
    """Median seconds from spawn to exit of `cmd` on empty input: taken off file-fed runs
    whose work is short enough for it to matter."""
    empty = ctx.work / "empty.ndjson"
    empty.touch()
    return repeat(timed_host(cmd, empty, ctx, 0, env=env), ctx.reps).median


def placements(ctx: Ctx) -> list[tuple[str, int | None, int | None]]:
    cpus = sorted(os.sched_getaffinity(0))
    out: list[tuple[str, int | None, int | None]] = [(f"one vCPU (both on CPU {cpus[0]})", cpus[0], cpus[0])]
    if len(cpus) > 1:
        out.append((f"two vCPUs (driver CPU {cpus[0]}, host CPU {cpus[1]})", cpus[0], cpus[1]))
    return out
