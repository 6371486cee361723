"""An apply's progress in a Jupyter notebook: a bar and a line in the cell's output,
redrawn in place (a display with an id, updated), as tqdm and rich do there."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from html import escape
from typing import Any


def notebook_progress() -> Callable[[Any], None] | None:
    """In a Jupyter kernel, a progress callback drawing the step, its kernel, units done,
    their rate and failures (at most four times a second, and at every step's end);
    elsewhere None."""
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    if type(shell).__name__ != "ZMQInteractiveShell":
        return None
    from IPython.display import display

    def bundle(text: str, done: float) -> dict[str, str]:
        return {"text/plain": text, "text/html": f'<progress value="{done:.3f}" max="1" style'
                f'="width:16em"></progress> <code>{escape(text)}</code>'}

    handle, drawn = display(bundle("apply: planning", 0.0), raw=True, display_id=True), [0.0]

    def draw(p: Any) -> None:
        if p.done < p.total and time.monotonic() - drawn[0] < 0.25:
            return
        drawn[0] = time.monotonic()
        text = (f"step {p.step}/{p.steps} {p.kernel}: {p.done}/{p.total} unit(s), "
                f"{p.rate:.3g}/s" + (f", {p.failed} failed" if p.failed else ""))
        handle.update(bundle(text, (p.step - 1 + p.done / max(p.total, 1)) / p.steps), raw=True)
    return draw
