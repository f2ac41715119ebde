"""The PNG of a run: throughput of the admission rows on both scopes, and
each target as measured against what it must reach (and its goal)."""

from __future__ import annotations

from pathlib import Path

from bench.report import Result, RowOut


def draw(result: Result, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = {r["id"]: r for r in result["rows"]}
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.2))
    names = [
        ("a", "a floor"),
        ("b", "b peer"),
        ("b'", "b' peer\nreplays"),
        ("c", "c Keyturn"),
        ("d", "d Keyturn\nreplays"),
    ]
    xs = list(range(len(names)))
    width = 0.38
    for offset, scope, color in ((-width / 2, "many", "#4477aa"), (width / 2, "hot", "#ee6677")):
        values = [_throughput(rows.get(f"{k}.{scope}")) for k, _ in names]
        bars = left.bar([x + offset for x in xs], values, width, color=color)
        left.bar_label(bars, labels=[f"{v:.0f}" for v in values], fontsize=7)
    left.set_xticks(xs, [label for _k, label in names], fontsize=8)
    left.set_ylabel("admissions per second (closed loop)")
    c = result["meta"]["concurrency"]
    left.legend([f"{result['meta']['sessions']} sessions", "1 hot session"], fontsize=8)
    left.set_title(f"Throughput at {c} connections", fontsize=10)

    labels: list[str] = []
    scores: list[float] = []
    notes: list[str] = []
    colors: list[str] = []
    for t in result["targets"]:
        value = t["measured"]
        if value is None or value != value:
            score = 0.0
        elif t["cmp"] == ">=":
            score = value / t["must"]
        else:
            score = t["must"] / value if value else 10.0
        labels.append(t["label"])
        scores.append(min(score, 3.0))
        goal = f", goal {t['goal_target']}" if t["goal"] != t["must"] else ""
        notes.append(
            "n/a" if value is None else f"{value:.2f} {t['unit']} (must {t['target']}{goal})"
        )
        colors.append(_COLORS[t["verdict"]] if t["judged"] else "#999999")
    ys = list(range(len(labels)))[::-1]
    right.barh(ys, scores, color=colors)
    right.axvline(1.0, color="black", linewidth=1)
    for y, s, note in zip(ys, scores, notes, strict=True):
        right.text(s + 0.03, y, note, va="center", fontsize=7)
    right.set_yticks(ys, labels, fontsize=8)
    right.set_xlim(0, 3.6)
    right.set_xlabel("measured vs must reach (≥ 1 meets it; capped at 3)")
    smoke = " (smoke: sizes too small to judge)" if result["meta"]["smoke"] else ""
    right.set_title(f"Targets{smoke}", fontsize=10)
    fig.suptitle(
        f"Keyturn benchmark, {result['meta']['date']} — {result['meta']['summary']}", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# Goal met, met, not met, nothing measured.
_COLORS = {"goal met": "#117733", "met": "#44aa99", "NOT met": "#cc3311", "n/a": "#999999"}


def _throughput(row: RowOut | None) -> float:
    """A row's throughput, 0 for a row that is missing or has none."""
    return (row["throughput"] or 0) if row is not None else 0
