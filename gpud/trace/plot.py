"""Drawing trace results: allocation ratio against arrived load (gpud beside the published
curves), and each project's allocation against its fair share over time. Needs matplotlib."""

from __future__ import annotations

from typing import Sequence

from gpud.trace.fill import LEVELS


def have_matplotlib() -> bool:
    """True when matplotlib can be imported (the optional ``plot`` extra)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_fill(path: str, document: dict) -> None:
    """Write a PNG of allocation ratio vs arrived load: one solid curve per gpud placement (its
    first seed's full curve, and the seed means at each level), dashed published curves."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for entry in document["placements"]:
        curve = entry["curve_first_seed"]
        line, = ax.plot([x for x, _ in curve], [y for _, y in curve], linewidth=1.2,
                        label=f"gpud {entry['placement']}")
        ax.plot(LEVELS, [entry["alloc_pct"][str(lv)] for lv in LEVELS], "o", color=line.get_color())
    for row in document["published"]:
        levels = sorted(int(k) for k in row["alloc_pct"])
        ax.plot(levels, [row["alloc_pct"][str(lv)] for lv in levels], "--", marker="x", linewidth=1,
                label=f"paper {row['policy']}")
    ax.plot([0, max(LEVELS)], [0, max(LEVELS)], ":", color="grey", linewidth=0.8)
    ax.set_xlim(40, max(LEVELS) + 2)
    ax.set_ylim(40, 100)
    ax.set_xlabel("arrived GPU requests (% of capacity)")
    ax.set_ylabel("GPUs allocated (% of capacity)")
    ax.set_title(f"Fill, workload {document['workload']} ({document['gpus']} GPUs)")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_replay(path: str, document: dict, projects: Sequence[str] | None = None) -> None:
    """Write a PNG of the allocation ratio over time and each project's allocation (solid) against
    its fair share (dashed) over time, for the projects with the largest quotas (at most 6)."""
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    day = 86400.0
    series = document["allocation_ratio_series"]
    top.plot([t / day for t, _ in series], [v for _, v in series], linewidth=0.8)
    top.set_ylabel("GPUs allocated (%)")
    top.set_title(f"Replay, placement {document['placement']} ({document['gpus']:g} GPUs)")
    top.grid(alpha=0.3)
    shares = document["project_share_series"]
    chosen = projects or sorted(shares, key=lambda n: -document["projects"].get(n, {}).get("quota_gpus", 0))[:6]
    for name in chosen:
        points = shares.get(name, [])
        line, = bottom.plot([t / day for t, _, _ in points], [a for _, a, _ in points], linewidth=0.8,
                            label=name)
        bottom.plot([t / day for t, _, _ in points], [f for _, _, f in points], "--", linewidth=0.8,
                    color=line.get_color())
    bottom.set_xlabel("trace time (days)")
    bottom.set_ylabel("GPUs: allocated (solid), fair share (dashed)")
    bottom.legend(fontsize=7, loc="upper left")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_history(path: str, document: dict, projects: Sequence[str] | None = None) -> None:
    """Write a PNG of each project's delivered minus entitled GPU-hours over the replay, without history
    (dashed) and with it (solid), for the projects with the largest quotas (at most 6)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 5))
    day = 86400.0
    off, on = document["entitlement_series"], document["with_history"]["entitlement_series"]
    chosen = projects or sorted(off, key=lambda n: -document["projects"].get(n, {}).get("quota_gpus", 0))[:6]
    for name in chosen:
        line, = ax.plot([t / day for t, _, _ in on.get(name, [])], [d - e for _, d, e in on.get(name, [])],
                        linewidth=0.8, label=name)
        ax.plot([t / day for t, _, _ in off.get(name, [])], [d - e for _, d, e in off.get(name, [])], "--",
                linewidth=0.8, color=line.get_color())
    ax.axhline(0, color="grey", linewidth=0.6)
    ax.set_xlabel("trace time (days)")
    ax.set_ylabel("delivered - entitled GPU-hours")
    ax.set_title(f"History (strength {document['with_history'].get('history_strength', '?')}) solid, "
                 f"without dashed: deviation {document['with_history']['entitlement']['deviation_pct']:.1f}% "
                 f"vs {document['entitlement']['deviation_pct']:.1f}%")
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
