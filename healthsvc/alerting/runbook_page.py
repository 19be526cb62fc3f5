"""``GET /runbook``: the on-call runbook (``docs/runbook.md``) as a page, so an alert's
``runbook_url`` opens wherever the service runs, with no wiki to set up first.

The package ships the runbook (``healthsvc/alerting/runbook.md`` is a link to
``docs/runbook.md``, copied into the wheel). The page is rendered here from the few pieces of
Markdown the runbook uses (headings, paragraphs, bullet lists, bold, inline code), each ``##``
heading with its text as the ``id``, so ``/runbook#loss_spike`` opens that kind's section.
"""
from __future__ import annotations

import functools
import html
import re
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

router = APIRouter(include_in_schema=False)

_INLINE = [(re.compile(r"`([^`]+)`"), r"<code>\1</code>"), (re.compile(r"\*\*([^*]+)\*\*"), r"<strong>\1</strong>")]
_STYLE = ("body{font:15px/1.5 system-ui,sans-serif;max-width:50em;margin:2em auto;padding:0 1em}"
          "code{background:#f2f2f2;padding:0 .2em}h2{border-top:1px solid #ddd;padding-top:.6em}")


def _inline(text: str) -> str:
    out = html.escape(text, quote=False)
    for pattern, repl in _INLINE:
        out = pattern.sub(repl, out)
    return out


def render(markdown: str) -> str:
    """The runbook's Markdown as an HTML page.

    >>> "<h2 id=\\"hang\\">hang</h2>" in render("## hang\\n\\nSome **ranks** went `silent`.")
    True
    """
    body: list[str] = []
    para: list[str] = []
    items: list[str] = []

    def flush() -> None:
        if para:
            body.append(f"<p>{_inline(' '.join(para))}</p>")
            para.clear()
        if items:
            body.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in items) + "</ul>")
            items.clear()

    for line in markdown.splitlines():
        stripped = line.strip()
        heading = re.match(r"^(#{1,3}) (.+)$", stripped)
        if heading:
            flush()
            level, text = len(heading.group(1)), heading.group(2)
            anchor = f' id="{html.escape(text)}"' if level == 2 else ""
            body.append(f"<h{level}{anchor}>{_inline(text)}</h{level}>")
        elif stripped.startswith("- "):
            if para:
                flush()
            items.append(stripped[2:])
        elif not stripped:
            flush()
        elif items and line.startswith("  "):
            items[-1] += " " + stripped      # a bullet's continuation line
        else:
            para.append(stripped)
    flush()
    return ("<!doctype html><html><head><meta charset=\"utf-8\"><title>healthsvc runbook</title>"
            f"<style>{_STYLE}</style></head><body>" + "\n".join(body) + "</body></html>")


@functools.lru_cache(maxsize=1)
def _page() -> str:
    return render((resources.files("healthsvc.alerting") / "runbook.md").read_text(encoding="utf-8"))


@router.get("/runbook")
def runbook_page() -> HTMLResponse:
    return HTMLResponse(_page(), headers={"cache-control": "no-cache"})
