"""Bar charts drawn on the server as SVG geometry: the template only places the rectangles."""

from __future__ import annotations

from dataclasses import dataclass

WIDTH, HEIGHT, TOP = 280, 80, 4


@dataclass(frozen=True, slots=True)
class Bar:
    """One bar: where it stands, how tall, and what it says when pointed at."""

    x: float
    y: float
    width: float
    height: float
    title: str


def bars(values: list[float], labels: list[str], unit: str = "GPU-h", scale: float | None = None) -> list[Bar]:
    """Bars side by side filling WIDTH, the tallest (or ``scale``) reaching the top; each titled with its value."""
    if not values:
        return []
    top = max(scale or 0.0, max(values), 1e-9)
    step = WIDTH / len(values)
    out = []
    for i, (value, label) in enumerate(zip(values, labels)):
        height = (HEIGHT - TOP) * value / top
        out.append(Bar(round(i * step + 1, 2), round(HEIGHT - height, 2), round(max(step - 2, 1), 2),
                       round(height, 2), f"{label}: {value:.2f} {unit}"))
    return out
