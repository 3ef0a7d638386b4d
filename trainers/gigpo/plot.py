"""Learning curves from a run's metric records: success, return and invalid-action rate.

The trainer draws ``<out_dir>/curve.png`` at the end of a run; draw one from any metrics file
(a finished run, or one still going) with::

    python -m trainers.gigpo.plot runs/gigpo/metrics.jsonl -o curve.png

matplotlib is optional: without it, one line says so (exit code 1).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentgym.extras import missing_extra
from agentgym.io import atomic_path

#: (panel title, [(metric, label)]): training rollouts against held-out evaluation.
PANELS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("success rate", (("rollout/success_rate", "rollout"), ("eval/success_rate", "eval"))),
    ("return", (("rollout/return", "rollout"), ("eval/return", "eval"))),
    ("invalid-action rate", (("rollout/invalid_rate", "rollout"),)),
)


def load_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` file (a line cut short by a kill is skipped)."""
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def plot_history(records: Sequence[dict[str, Any]], out: str | Path, title: str = "") -> Path:
    """Draw the learning curves of ``records`` to the PNG ``out`` (written atomically).

    Raises ImportError, with a one-line message saying what to install, without matplotlib.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed, none opened
        import matplotlib.pyplot as plt
    except ImportError:
        raise missing_extra("the learning-curve plot", "matplotlib", "train") from None
    out = Path(out)
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 3.4))
    for ax, (panel, series) in zip(axes, PANELS, strict=True):
        for key, label in series:
            points = [(r["iteration"], r[key]) for r in records if key in r]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, ms=3, label=label)
        ax.set_title(panel)
        if panel.endswith("rate"):
            ax.set_ylim(-0.03, 1.03)  # rates on one scale, so runs compare at a glance
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(loc="best", fontsize="small")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    try:
        with atomic_path(out) as tmp:
            fig.savefig(tmp, dpi=100, format="png")
    finally:
        plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m trainers.gigpo.plot",
        description="Draw a run's learning curves (success, return, invalid-action rate).",
    )
    parser.add_argument("metrics", type=Path, help="a run's metrics.jsonl")
    parser.add_argument(
        "-o", "--out", type=Path, help="PNG to write (default: curve.png beside the metrics)"
    )
    args = parser.parse_args(argv)
    if not args.metrics.is_file():
        parser.exit(2, f"{parser.prog}: error: no such metrics file: {args.metrics}\n")
    records = load_metrics(args.metrics)
    if not records:
        parser.exit(2, f"{parser.prog}: error: {args.metrics} holds no records yet\n")
    out = args.out or args.metrics.with_name("curve.png")
    try:
        plot_history(records, out, title=str(args.metrics.parent))
    except ImportError as err:
        print(f"{parser.prog}: {err}", file=sys.stderr)
        sys.exit(1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
