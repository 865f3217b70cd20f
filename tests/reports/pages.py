"""Read a report page back: its elements and attributes as the browser would see them (stdlib
html.parser, entities decoded), to test what the page says rather than how it is spelled."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path


class Element:
    def __init__(self, tag: str, attrs: dict, parent: Element | None):
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.children: list[Element] = []
        self.content: list[str | Element] = []  # text and children in document order

    @property
    def text(self) -> str:
        """The element's text as one line (whitespace collapsed)."""
        raw = "".join(x if isinstance(x, str) else " " + x.text + " " for x in self.content)
        return " ".join(raw.split())

    def classes(self) -> set[str]:
        return set((self.attrs.get("class") or "").split())

    def iter(self):
        yield self
        for c in self.children:
            yield from c.iter()

    def find_all(self, tag: str | None = None, cls: str | None = None, **attrs) -> list[Element]:
        return [e for e in self.iter() if (tag is None or e.tag == tag) and (cls is None or cls in e.classes())
                and all(e.attrs.get(k) == v for k, v in attrs.items())]

    def find(self, *a, **kw) -> Element | None:
        found = self.find_all(*a, **kw)
        return found[0] if found else None


VOID = {"meta", "link", "img", "br", "hr", "input", "col", "area", "base", "embed", "source", "wbr"}
#: end tags HTML lets a page leave out (the metrics tables do): a cell ends at the next cell or row,
#: a row at the next row (and both at the end of their table section, as any open element does)
IMPLIED_END = {"td": ("td", "th"), "th": ("td", "th"), "tr": ("td", "th", "tr")}


class _Builder(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Element("#root", {}, None)
        self.cur = self.root

    def handle_starttag(self, tag, attrs):
        while self.cur.tag in IMPLIED_END.get(tag, ()):
            self.cur = self.cur.parent
        el = Element(tag, dict(attrs), self.cur)
        self.cur.children.append(el)
        self.cur.content.append(el)
        if tag not in VOID:
            self.cur = el

    def handle_startendtag(self, tag, attrs):
        el = Element(tag, dict(attrs), self.cur)
        self.cur.children.append(el)
        self.cur.content.append(el)

    def handle_endtag(self, tag):
        node = self.cur
        while node is not None and node.tag != tag:
            node = node.parent
        if node is not None and node.parent is not None:
            self.cur = node.parent

    def handle_data(self, data):
        self.cur.content.append(data)


def parse(path_or_text: str | Path) -> Element:
    text = Path(path_or_text).read_text(encoding="utf-8") if isinstance(path_or_text, Path) else path_or_text
    b = _Builder()
    b.feed(text)
    b.close()
    return b.root
