"""An executed notebook as a page a reader of the repository sees without running anything:
``docs/notebooks/NAME.md`` (markdown cells as they are, code in fenced blocks, text outputs
verbatim) and its figures as PNG files in ``docs/img/notebooks/``.

Why markdown and PNG files, not the notebook with its outputs: a diff of a re-run shows which text
changed and which figure was redrawn, the figures render on any code host and in any markdown
viewer, and the notebooks under ``notebooks/`` stay free of outputs (their own diffs stay code)."""
from __future__ import annotations

import base64
import io
import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"
TEXT_LINES = 40          # a longer text output is cut (the notebook itself has all of it)


def _text(text: str) -> str:
    """What a notebook shows of a stream: a carriage return redraws the line (a progress bar).
    The test's server listens on a random port: shown as the service's default one, so a re-run
    changes the page only where the notebook's output really changed."""
    text = re.sub(r"http://127\.0\.0\.1:\d+", "http://127.0.0.1:8080", text)
    lines = [line.rsplit("\r", 1)[-1] for line in text.replace("\r\n", "\n").split("\n")]
    if len(lines) > TEXT_LINES:
        lines = lines[:TEXT_LINES] + [f"... ({len(lines) - TEXT_LINES} more lines)"]
    return "\n".join(lines).rstrip("\n")


def _small_png(data: bytes) -> bytes:
    """The figure with a 256-colour palette: about a third of the bytes, and no visible change for
    line plots and heatmaps (Pillow comes with matplotlib)."""
    from PIL import Image
    image = Image.open(io.BytesIO(data)).convert("RGB").quantize(colors=256)
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return out.getvalue()


def render(nb, name: str, docs: Path = DOCS) -> Path:
    """Write ``nb`` (executed) as ``docs/notebooks/{name}.md`` with its figures; returns the page."""
    img_dir = docs / "img" / "notebooks"
    img_dir.mkdir(parents=True, exist_ok=True)
    for old in img_dir.glob(f"{name}-*.png"):   # a re-run with fewer figures leaves none behind
        old.unlink()
    parts = [f"<!-- Written by tests/notebooks/test_notebooks.py from notebooks/{name}.ipynb, executed against "
             f"the recorded run in notebooks/data. Do not edit: run the test. -->"]
    figures = 0
    for cell in nb.cells:
        source = "".join(cell.source).strip()
        if cell.cell_type == "markdown":
            parts.append(re.sub(r"\]\(\.\./docs/", "](../", source))   # links from notebooks/ to docs/
            continue
        if cell.cell_type != "code":
            continue
        parts.append(f"```python\n{source}\n```")
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if out.get("output_type") == "stream":
                parts.append(f"```text\n{_text(out['text'])}\n```")
            elif "image/png" in data:
                figures += 1
                png = img_dir / f"{name}-{figures}.png"
                png.write_bytes(_small_png(base64.b64decode(data["image/png"])))
                parts.append(f"![{name}, figure {figures}](../img/notebooks/{png.name})")
            elif "text/plain" in data and not re.match(r"<.* at 0x[0-9a-f]+>$", data["text/plain"].strip()):
                parts.append(f"```text\n{_text(data['text/plain'])}\n```")
            elif out.get("output_type") == "error":
                parts.append(f"```text\n{out['ename']}: {out['evalue']}\n```")
    page = docs / "notebooks" / f"{name}.md"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text("\n\n".join(parts) + "\n")
    return page
