"""One shape for what every benchmark writes (compare, bench, ladder, sweep-batch, tune).

Each command's report module declares a `ReportWriter`: the result as `<name>.json` (what other tools and the
Diagnose tab read), a table for the terminal, `<name>.md` and `<name>.png` where it has them, all written beside each
other, atomically, into the command's output folder. The results are the JSON-ready dicts the commands build; the
writer is how they are shown, the same way for every command.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from train.core import files


@dataclass(frozen=True)
class ReportWriter:
    name: str  # the files' stem: report, bench, ladder, sweep, tune
    table: Callable[[dict], str]  # what the command prints when it ends
    markdown: Callable[[dict], str] | None = None  # <name>.md
    chart: Callable[[dict, Path], None] | None = None  # <name>.png

    def write(self, out: Path, result: dict) -> list[Path]:
        """The result and its views into `out`; returns the files written, the JSON first."""
        out = Path(out)
        written = [out / f"{self.name}.json"]
        files.write_json(written[0], result)
        if self.markdown is not None:
            written.append(out / f"{self.name}.md")
            files.write_text(written[-1], self.markdown(result))
        if self.chart is not None:
            written.append(out / f"{self.name}.png")
            self.chart(result, written[-1])
        return written
