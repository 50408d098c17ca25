"""A tiny document model rendered both as Markdown and as one self-contained HTML file.

A report is a list of blocks (headings, paragraphs, bullet lists, tables, figures, code). Text is a
list of pieces, each a string or a :class:`Link`, so every number can link to where it came from.
Markdown references figures as files beside it; HTML embeds them as base64 PNGs (no network needed).
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Link:
    text: str
    href: str


Text = list[str | Link]


@dataclass(frozen=True)
class Heading:
    level: int
    text: str
    anchor: str = ""


@dataclass(frozen=True)
class Paragraph:
    text: Text


@dataclass(frozen=True)
class Bullets:
    items: list[Text]


@dataclass(frozen=True)
class Table:
    header: list[str]
    rows: list[list[Text]]
    anchors: list[str] = field(default_factory=list)  # one per row ("" for none)
    css_class: str = ""


@dataclass(frozen=True)
class Figure:
    name: str  # file name under figures/
    caption: str
    png: bytes


@dataclass(frozen=True)
class Code:
    text: str


Block = Heading | Paragraph | Bullets | Table | Figure | Code


# ---------------------------------------------------------------------------------------- Markdown
def to_markdown(blocks: list[Block], figure_dir: str = "figures") -> str:
    return "\n\n".join(_md_block(block, figure_dir) for block in blocks) + "\n"


def _md_text(text: Text) -> str:
    out = []
    for piece in text:
        if isinstance(piece, Link):
            out.append(f"[{_md_escape(piece.text)}]({piece.href})")
        else:
            out.append(_md_escape(piece))
    return "".join(out)


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_block(block: Block, figure_dir: str) -> str:
    if isinstance(block, Heading):
        anchor = f'<a id="{block.anchor}"></a>' if block.anchor else ""
        return f"{'#' * block.level} {anchor}{block.text}"
    if isinstance(block, Paragraph):
        return _md_text(block.text)
    if isinstance(block, Bullets):
        return "\n".join(f"- {_md_text(item)}" for item in block.items)
    if isinstance(block, Table):
        lines = ["| " + " | ".join(block.header) + " |", "|" + "---|" * len(block.header)]
        for index, row in enumerate(block.rows):
            anchor = block.anchors[index] if index < len(block.anchors) else ""
            cells = [_md_text(cell) for cell in row]
            if anchor:
                cells[0] = f'<a id="{anchor}"></a>' + cells[0]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)
    if isinstance(block, Figure):
        return f"![{block.caption}]({figure_dir}/{block.name})\n\n*{block.caption}*"
    return f"```\n{block.text.rstrip()}\n```"


# -------------------------------------------------------------------------------------------- HTML
STYLE = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; max-width: 1200px; margin: 2em auto;
       padding: 0 1em; color: #222; line-height: 1.45; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.88em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: left; vertical-align: top; }
th { background: #f2f2f2; }
tr:target { background: #fff3c4; }
table.recommendation tr:nth-child(2) { background: #eaf6ea; font-weight: 600; }
figure { margin: 1.5em 0; } figure img { max-width: 100%; } figcaption { font-style: italic; color: #555; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
a { color: #0b63b0; }
"""


def to_html(blocks: list[Block], title: str) -> str:
    body = "\n".join(_html_block(block) for block in blocks)
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


def _html_text(text: Text) -> str:
    out = []
    for piece in text:
        if isinstance(piece, Link):
            out.append(f'<a href="{html.escape(piece.href, quote=True)}">{html.escape(piece.text)}</a>')
        else:
            out.append(html.escape(piece))
    return "".join(out)


def _html_block(block: Block) -> str:
    if isinstance(block, Heading):
        anchor = f' id="{html.escape(block.anchor)}"' if block.anchor else ""
        return f"<h{block.level}{anchor}>{html.escape(block.text)}</h{block.level}>"
    if isinstance(block, Paragraph):
        return f"<p>{_html_text(block.text)}</p>"
    if isinstance(block, Bullets):
        return "<ul>\n" + "\n".join(f"<li>{_html_text(item)}</li>" for item in block.items) + "\n</ul>"
    if isinstance(block, Table):
        css = f' class="{block.css_class}"' if block.css_class else ""
        head = "<tr>" + "".join(f"<th>{html.escape(cell)}</th>" for cell in block.header) + "</tr>"
        rows = []
        for index, row in enumerate(block.rows):
            anchor = block.anchors[index] if index < len(block.anchors) else ""
            row_id = f' id="{html.escape(anchor)}"' if anchor else ""
            rows.append(f"<tr{row_id}>" + "".join(f"<td>{_html_text(cell)}</td>" for cell in row) + "</tr>")
        return f"<table{css}>\n{head}\n" + "\n".join(rows) + "\n</table>"
    if isinstance(block, Figure):
        data = base64.b64encode(block.png).decode("ascii")
        return (
            f'<figure><img alt="{html.escape(block.caption, quote=True)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(block.caption)}</figcaption></figure>"
        )
    return f"<pre>{html.escape(block.text)}</pre>"
