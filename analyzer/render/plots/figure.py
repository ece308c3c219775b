"""A figure as file bytes."""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

from analyzer.redact import without_controls


def figure_bytes(fig: Figure, fmt: str = "png", *, dpi: int = 110) -> bytes:
    """The figure as PNG, SVG or PDF bytes (Agg canvas; deterministic metadata). Every text of
    the figure loses its control characters first: an SVG keeps each text in a comment, and XML
    forbids them there."""
    import io

    from matplotlib.text import Text

    for text in fig.findobj(Text):
        text.set_text(without_controls(text.get_text()))
    buffer = io.BytesIO()
    metadata: dict[str, Any] = {}
    if fmt == "png":
        metadata = {"Software": None}
    elif fmt == "svg":
        metadata = {"Date": None, "Creator": None}
    elif fmt == "pdf":
        metadata = {"CreationDate": None, "Creator": None, "Producer": None}
    fig.savefig(buffer, format=fmt, dpi=dpi, metadata=metadata, facecolor="white")
    return buffer.getvalue()
