"""How the demo prints: scene headers, timestamped event lines, notes and tables.

Built on rich: colours and box tables on a terminal; plain, unstyled text of a
fixed width when stdout is not a terminal (CI logs) or with ``--no-color``.
Every line is flushed as it is written, so a pipe shows progress live.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

WHO_STYLE = {
    "npud": "bold blue",
    "camera": "bold cyan",
    "voice": "bold magenta",
    "embedder": "bold yellow",
    "llm": "bold green",
    "HAL": "bold white",
    "admin": "bold red",
    "demo": "bold",
}


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (nearest rank), or None for no values."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(q / 100 * (len(s) - 1))))
    return s[k]


def fmt_ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.1f} ms" if v < 100 else f"{v:.0f} ms"


class Renderer:
    """Thread-safe printer for the demo (app events arrive on reader threads)."""

    def __init__(self, color: bool | None = None, stream: Any = None) -> None:
        from rich.console import Console

        stream = stream or sys.stdout
        tty = bool(getattr(stream, "isatty", lambda: False)())
        use_color = tty if color is None else (color and tty)
        self.console = Console(
            file=stream, highlight=False, no_color=not use_color, emoji=False,
            force_terminal=use_color, width=None if tty else 100, soft_wrap=not tty,
        )
        self.plain = not use_color
        self.t0 = time.monotonic()
        self._lock = threading.Lock()

    def elapsed(self, t: float | None = None) -> float:
        return (time.monotonic() if t is None else t) - self.t0

    def _print(self, *objs: Any, **kw: Any) -> None:
        with self._lock:
            self.console.print(*objs, **kw)
            self.console.file.flush()

    def title(self, text: str, sub: str) -> None:
        from rich.panel import Panel
        from rich.text import Text

        if self.plain:
            self._print(f"=== {text} ===")
            self._print(sub)
            return
        self._print(Panel(Text(sub, style="dim"), title=Text(text, style="bold"),
                          expand=False, border_style="blue"))

    def scene(self, n: int, total: int, title: str, why: str) -> None:
        from rich.rule import Rule
        from rich.text import Text

        self._print("")
        head = f"[{n}/{total}] {title}" if n else title
        if self.plain:
            self._print(f"--- {head} " + "-" * max(3, 72 - len(head)))
        else:
            self._print(Rule(Text(head, style="bold"), align="left", style="blue"))
        self._print(Text(why, style="dim italic"))

    def event(self, who: str, text: str, t: float | None = None, style: str = "") -> None:
        from rich.text import Text

        line = Text()
        line.append(f"{self.elapsed(t):6.2f}s  ", style="dim")
        line.append(f"{who:<9}", style=WHO_STYLE.get(who, "bold"))
        line.append(text, style=style)
        self._print(line)

    def note(self, text: str, style: str = "dim") -> None:
        from rich.text import Text

        self._print(Text(f"         {text}", style=style))

    def warn(self, text: str) -> None:
        from rich.text import Text

        self._print(Text(f"  ! {text}", style="bold yellow"))

    def table(self, title: str, columns: Sequence[str], rows: Sequence[Sequence[str]],
              caption: str | None = None) -> None:
        from rich import box
        from rich.table import Table

        t = Table(title=title, caption=caption, box=box.ASCII if self.plain else box.ROUNDED,
                  title_justify="left", caption_justify="left", show_edge=True)
        for i, c in enumerate(columns):
            t.add_column(c, justify="left" if i == 0 else "right",
                         style="bold" if i == 0 and not self.plain else None)
        for r in rows:
            t.add_row(*r)
        self._print("")
        self._print(t)
