"""Unit tests of parsing and chunking (shared/parsing.py, chunking.py): no services."""

from __future__ import annotations

import json
import re

import pytest

from shared.errors import ParseError, UnsupportedMediaType
from shared.ingest.chunking import Chunker
from shared.parsing import parse, resolve_content_type


def word_offsets(text: str) -> list[tuple[int, int]]:
    """A stand-in tokenizer: one token per word or punctuation mark."""
    return [(m.start(), m.end()) for m in re.finditer(r"\w+|[^\w\s]", text)]


def test_chunks_respect_token_budget_offsets_and_sections():
    md = "# Intro\nCats purr. Dogs bark loudly.\n\n## Care\n" + "Feed them daily. " * 40
    chunker = Chunker(word_offsets, max_tokens=30, overlap_tokens=6)
    doc = parse(md.encode(), "text/markdown")
    chunks = chunker.chunk(doc)
    assert len(chunks) > 3
    for chunk in chunks:
        assert chunk.token_count <= 30
        assert doc.text[chunk.char_start : chunk.char_end] == chunk.text
    assert chunks[0].section == "Intro"
    assert chunks[-1].section == "Intro > Care"
    # Overlap: consecutive chunks in one section share text.
    assert chunks[2].char_start < chunks[1].char_end


def test_overlong_sentence_is_cut_at_token_boundaries():
    text = "word " * 100
    chunks = Chunker(word_offsets, max_tokens=16, overlap_tokens=0).chunk(
        parse(text.encode(), "text/plain")
    )
    assert all(c.token_count <= 16 for c in chunks)
    assert sum(c.token_count for c in chunks) == 100


def test_html_boilerplate_is_stripped_and_headings_kept():
    html = b"""<html><head><script>var x = 1;</script><style>p{}</style></head><body>
    <nav>Home | About</nav><h1>Guide</h1><p>Install the pump.</p><h2>Safety</h2>
    <p>Wear gloves.</p><footer>(c) 2026</footer></body></html>"""
    doc = parse(html, "text/html")
    assert "var x" not in doc.text and "Home | About" not in doc.text and "(c)" not in doc.text
    assert "Install the pump." in doc.text
    assert doc.section_at(doc.text.index("Wear gloves")) == "Guide > Safety"


@pytest.mark.parametrize(
    ("raw", "content_type", "reason"),
    [
        (b"", "text/plain", "empty"),
        (b"\xff\xfe\x00bad", "text/plain", "UTF-8"),
        (b"%PDF-1.4 garbage", "application/pdf", "PDF"),
        (b"<html><body><script>x</script></body></html>", "text/html", "no text"),
        (b'{"a": ', "application/json", "invalid JSON"),
    ],
)
def test_unparseable_documents_give_a_reason(raw, content_type, reason):
    with pytest.raises(ParseError, match=reason):
        parse(raw, content_type)


def test_content_type_from_magic_bytes_then_header_then_extension():
    assert resolve_content_type("text/plain", "x.txt", b"%PDF-1.7") == "application/pdf"
    assert resolve_content_type("application/octet-stream", "a.md", b"# hi") == "text/markdown"
    assert resolve_content_type("text/plain", "a.txt", b"\x89PNG\r\n\x1a\n") == "image/png"
    with pytest.raises(UnsupportedMediaType):
        resolve_content_type("image/gif", "a.gif", b"GIF89a")


def test_json_records_use_configured_text_fields():
    raw = b'{"title": "T1", "text": "alpha"}\n{"title": "T2", "body": "beta"}\n'
    doc = parse(raw, "application/x-ndjson")
    assert doc.text == "alpha\n\nbeta"
    assert doc.section_at(doc.text.index("beta")) == "T2"


def test_a_long_word_is_cut_to_the_character_cap():
    """One 200,000-character word is a single unknown token for WordPiece: without a cap in
    characters it would be one enormous chunk."""
    text = "Start. " + "x" * 200_000 + " end of the story."
    chunks = Chunker(word_offsets, max_tokens=16, overlap_tokens=0, max_chars=1000).chunk(
        parse(text.encode(), "text/plain")
    )
    assert max(len(c.text) for c in chunks) <= 1000
    assert sum(c.text.count("x") for c in chunks) == 200_000
    doc_text = parse(text.encode(), "text/plain").text
    assert all(doc_text[c.char_start : c.char_end] == c.text for c in chunks)


def test_markdown_headings_parse_in_linear_time():
    """The former heading pattern backtracked over a long line of spaces: quadratic."""
    import time

    def parse_time(n: int) -> float:
        line = "# a" + " " * n + "b\n"
        started = time.perf_counter()
        doc = parse((line + "Body text.\n").encode(), "text/markdown")
        assert doc.sections and doc.sections[0].path.startswith("a")
        return time.perf_counter() - started

    small, large = parse_time(5_000), parse_time(50_000)
    # Linear: 10x the input costs about 10x (quadratic would be about 100x). Generous, since
    # the machine is shared; the former pattern took seconds at 50,000.
    assert large < max(small * 30, 0.05), (small, large)


def test_section_lookup_bisects_and_keeps_heading_paths_bounded():
    md = "".join(f"# Heading {i}\nText of part {i}.\n" for i in range(2000))
    md += "# " + "long " * 1000 + "\nLast part.\n"
    doc = parse(md.encode(), "text/markdown")
    assert doc.section_at(0) == "Heading 0"
    assert doc.section_at(doc.text.index("Text of part 1234.")) == "Heading 1234"
    assert doc.section_at(len(doc.text) - 1).startswith("long")
    assert all(len(s.path) <= 500 for s in doc.sections)
    # A JSON record's title is its section's path: a field of any length, capped the same.
    record = json.dumps({"title": "T" * 100_000, "text": "Body of the record."}).encode()
    assert [len(s.path) for s in parse(record, "application/json").sections] == [500]


def test_a_parse_error_that_quotes_a_nul_is_stored_without_it() -> None:
    """Parsers' exceptions quote the file (pypdf's quoted this filter's name, NUL and all),
    and Postgres refuses a NUL in the job's recorded error. PDFium reads this PDF's text: its
    errors quote nothing of the file."""
    from shared.retry import describe_error
    from tests.helpers import pdf_whose_error_quotes_a_nul

    assert parse(pdf_whose_error_quotes_a_nul(), "application/pdf").text == "Unreadable."
    quoting = ParseError("the PDF could not be read (PdfReadError: /Bad\x00x)")
    assert "\x00" not in describe_error(quoting) and "/Bad" in describe_error(quoting)
    assert "\ufffd" in describe_error(ValueError("a lone \ud800 surrogate"))


def test_the_first_sentence_end_is_where_sentence_spans_ends_the_first_sentence() -> None:
    import random

    from shared.ingest.chunking import first_sentence_end, sentence_spans

    rng = random.Random(5)
    pieces = ["Word", "e.g.", "Dr.", "end.", "Why?", "Yes!", "  ", "\n\n", "3.5", "…", "x"]
    for _ in range(500):
        text = " ".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        spans = sentence_spans(text, 0, len(text))
        assert first_sentence_end(text) == (spans[0][1] if spans else None)


def test_pdf_pages_with_a_thin_or_garbled_text_layer_flag_their_chunks() -> None:
    from tests.helpers import pdf_with_pages

    body = "Glaciers carve U-shaped valleys as the ice moves slowly downhill. " * 4
    raw = pdf_with_pages([body, "Figure 3: moraine", "@#%& ~~ ||| ## " * 10, body])
    doc = parse(raw, "application/pdf")
    flagged = {s.path: s.flags for s in doc.sections}
    assert flagged == {
        "page 1": (),
        "page 2": ("doubtful_extraction",),  # 15 letters and digits: a caption, not a page
        "page 3": ("doubtful_extraction",),  # symbols, not words: an unusable font encoding
        "page 4": (),
    }
    chunks = Chunker(word_offsets, max_tokens=200, overlap_tokens=0).chunk(doc)
    by_page = {c.section: c.flags for c in chunks}
    assert by_page["page 2"] == ("doubtful_extraction",) and by_page["page 1"] == ()
    # Other formats are never flagged.
    text_chunks = Chunker(word_offsets, max_tokens=200, overlap_tokens=0).chunk(
        parse(b"Short.", "text/plain")
    )
    assert all(c.flags == () for c in text_chunks)


def test_markdown_heading_lines_become_the_section_path_not_chunk_text() -> None:
    md = (
        "# Intro\nCats purr.\n\n## Care ##\r\nFeed them.\n"
        "```\n# a comment in code, not a heading\n```\n### Deep\nLast words.\n"
    )
    doc = parse(md.encode(), "text/markdown")
    assert "# Intro" not in doc.text and "## Care" not in doc.text and "Deep" not in doc.text
    assert "# a comment in code, not a heading" in doc.text  # fenced code is kept as written
    assert doc.section_at(doc.text.index("Cats")) == "Intro"
    assert doc.section_at(doc.text.index("Feed")) == "Intro > Care"
    assert doc.section_at(doc.text.index("# a comment")) == "Intro > Care"
    assert doc.section_at(doc.text.index("Last words")) == "Intro > Care > Deep"
    chunks = Chunker(word_offsets, max_tokens=30, overlap_tokens=0, min_tokens=0).chunk(doc)
    assert not any(c.text.lstrip().startswith("#") and c.section != "Intro > Care" for c in chunks)
    assert [c.text for c in chunks if c.section == "Intro"] == ["Cats purr."]
    # A document of headings only keeps their words as its text.
    assert parse(b"# Only\n## Headings\n", "text/markdown").text == "Only\n\nHeadings"


def test_html_inline_markup_adds_no_spaces_and_buttons_are_not_text() -> None:
    """Words are joined as the page writes them: "<code>path.format()</code>." is
    "path.format().", not "path.format() ." (Node's and Sphinx's pages read "console . log
    (process. env . PATH )" in their highlighted code), a <pre> keeps its lines and their
    indentation, and a control's label ("copy" after every code block) is no text."""
    html = b"""<body><h2>path.format()</h2>
    <p>Call <code>path.format()</code>. It returns <em>a</em> <strong>string</strong>,
    not <a href="#x">an object</a>!</p>
    <pre><code><span class="k">const</span> p = <span class="f">path</span>.<span>format</span>({
  <span>root</span>: <span class="s">'/'</span>,
});</code></pre><button class="copy-button">copy</button>
    <p>Done.</p></body>"""
    doc = parse(html, "text/html")
    blocks = doc.text.split("\n\n")
    assert blocks[1] == "Call path.format(). It returns a string, not an object!"
    assert blocks[2] == "const p = path.format({\n  root: '/',\n});"
    assert blocks[3:] == ["Done."]
    # Minified: a <br> or a block's edge parts two words with no whitespace between them; a
    # <br> in a <pre> is a line break. An accordion's question, a <button> in a heading, is
    # text.
    minified = (
        b"<body><h3><button aria-expanded='false'>Is it safe?</button></h3><div>one<br>two"
        b"<section>three</section>four</div><pre>a<br>b</pre></body>"
    )
    assert parse(minified, "text/html").text.split("\n\n") == [
        "Is it safe?",
        "one two three four",
        "a\nb",
    ]
    # A text node's edges are found without a regex that backtracks over runs of spaces
    # inside it (quadratic: 200,000 spaces would take minutes)
    spaced = b"<p>" + b"a" + b" " * 200_000 + b"b </p>"
    assert parse(spaced, "text/html").text == "a b"


def test_html_table_rows_and_list_items_keep_their_boundaries() -> None:
    html = b"""<body><h1>Staff</h1>
    <table><tr><th>Name</th><th>Role</th></tr>
    <tr><td>Ann</td><td><p>Pump engineer</p></td></tr><tr><td>Bo</td><td>Diver</td></tr></table>
    <ul><li>Fruits<ul><li>apple</li><li>pear</li></ul></li><li>Vegetables</li></ul></body>"""
    doc = parse(html, "text/html")
    blocks = doc.text.split("\n\n")
    # A row is one block, its cells in order; no cell is repeated as a block of its own. The
    # header row (<th> cells) is the rows' section path, as a Markdown table's is.
    assert blocks[1:3] == ["Ann | Pump engineer", "Bo | Diver"]
    assert doc.section_at(doc.text.index("Bo")) == "Staff > Name | Role"
    assert "table" in doc.flags_at(doc.text.index("Ann"))
    # A list item that holds a nested list keeps its own words; each item is its own block.
    assert blocks[3:] == ["Fruits", "apple", "pear", "Vegetables"]
    assert doc.section_at(doc.text.index("Fruits")) == "Staff"
    assert "table" not in doc.flags_at(doc.text.index("Fruits"))
    # A chunk holds whole rows: the chunker never cuts between a row's cells.
    rows = {"Ann | Pump engineer", "Bo | Diver"}
    for chunk in Chunker(word_offsets, max_tokens=12, overlap_tokens=0).chunk(doc):
        pieces = chunk.text.split("\n\n")
        assert all(p in rows for p in pieces if "|" in p), chunk.text


def test_contextual_text_puts_the_title_and_section_before_the_chunk() -> None:
    from shared.ingest.chunking import contextual_text

    assert contextual_text("It smiles.", "Quokka", "Habits", "none") == "It smiles."
    assert contextual_text("It smiles.", "Quokka", "Habits", "title") == "Quokka\n\nIt smiles."
    assert (
        contextual_text("It smiles.", "Quokka", "Habits", "title_section")
        == "Quokka\nHabits\n\nIt smiles."
    )
    assert contextual_text("It smiles.", "", "", "title_section") == "It smiles."


def test_nested_html_is_read_in_one_pass_each_text_once() -> None:
    """Each row's cells, each block's own words: a text node is read once however deep it
    sits. Asking every element for its ancestors and descendants made 17 KB of nested tables
    a gigabyte of text, and 100 KB of nested divs a minute of parsing."""
    tables = b"<table><tr><td>" * 300 + b"x" * 2000
    doc = parse(tables, "text/html")
    assert doc.text == "x" * 2000  # each outer row's own cells are empty: no line of its own
    divs = b"<div>" * 20_000 + b"deep" + b"</div>" * 20_000
    assert parse(divs, "text/html").text == "deep"
    headings = b"<h1>" * 3000 + b"y" * 3000
    assert parse(headings, "text/html").text == "y" * 3000
    nested = b"""<body><table><tr><td>outer <table><tr><td>inner</td><td>cell</td></tr></table>
    tail</td><td>last</td></tr></table><h2>Head <p>in heading</p></h2></body>"""
    assert parse(nested, "text/html").text.split("\n\n") == [
        "outer tail | last",
        "inner | cell",
        "Head in heading",
    ]
    # Cells whose </td> is left out (valid HTML; html.parser nests each in the one before)
    unclosed = b"<table><tr><th>Name<th>Age<tr><td>Ann<td>31<tr><td>Bob<td>42</table>"
    assert parse(unclosed, "text/html").text.split("\n\n") == [
        "Name | Age",
        "Ann | 31",
        "Bob | 42",
    ]
    # Words after a heading inside a block are in that heading's section, after it.
    after = parse(b"<div><p>Before</p><h2>Intro</h2>Loose words</div>", "text/html")
    assert after.text.split("\n\n") == ["Before", "Intro", "Loose words"]
    assert after.section_at(after.text.index("Loose")) == "Intro"


def test_json_records_are_counted_as_intake_counts_them_and_bounded() -> None:
    from shared.parsing import MAX_JSON_RECORDS

    # U+2028 is a line separator to str.splitlines, not to JSON Lines: inside a string it is
    # text, and records separated by it are one (invalid) line, as intake counted them.
    inside = json.dumps({"text": "one\u2028record"}, ensure_ascii=False).encode()
    assert parse(inside + b"\n", "application/x-ndjson").text == "one\u2028record"
    two = '{"text": "a"}\u2028{"text": "b"}'.encode()
    with pytest.raises(ParseError, match="invalid JSON on line 1"):
        parse(two, "application/x-ndjson")
    # "\r\n" and a lone "\r" end a line, here and in intake's count.
    from shared.parsing import jsonl_line_count

    crlf = b'{"text": "a"}\r\n{"text": "b"}\r{"text": "c"}'
    assert parse(crlf, "application/x-ndjson").text.split("\n\n") == ["a", "b", "c"]
    assert jsonl_line_count(crlf) == 3 and jsonl_line_count(two) == 1
    array = json.dumps(["w"] * (MAX_JSON_RECORDS + 1)).encode()
    with pytest.raises(ParseError, match=f"the limit is {MAX_JSON_RECORDS}"):
        parse(array, "application/json")
    assert len(parse(json.dumps(["w"] * 3).encode(), "application/json").sections) == 3


def test_a_heading_sits_under_the_nearest_heading_above_its_level() -> None:
    """Not under whichever came before: a page whose headings start at h2 has its h2s side by
    side, and a heading of a higher level ends the deeper ones."""
    html = b"<h2>Title</h2><p>a</p><h2>Next</h2><p>b</p><h3>Deep</h3><p>c</p><h1>Top</h1><p>d</p>"
    doc = parse(html, "text/html")
    assert [doc.section_at(doc.text.index(w)) for w in "abcd"] == [
        "Title",
        "Next",
        "Next > Deep",
        "Top",
    ]
    markdown = parse(b"## A\nx\n## B\ny\n#### C\nz\n### D\nw\n", "text/markdown")
    assert [s.path for s in markdown.sections] == ["A", "B", "B > C", "B > D"]


def test_commonmark_setext_headings_front_matter_comments_and_tables() -> None:
    md = (
        "---\nsection: 1\ndescription: front matter\n---\n\n"
        "Stage\n=====\n\nIntro of `npm stage`.\n\n<!-- YAML\nadded: v1\n-->\n\n"
        "Flags\n-----\n\n| Flag | Default |\n| --- | --- |\n| `--otp` | null |\n"
        "| `--json` | false |\n\nAfter the table.\n"
    )
    doc = parse(md.encode(), "text/markdown")
    assert "front matter" not in doc.text and "YAML" not in doc.text and "=====" not in doc.text
    assert doc.section_at(doc.text.index("Intro")) == "Stage"
    row = doc.text.index("`--json`")
    assert doc.section_at(row) == "Stage > Flags > | Flag | Default |"
    assert "table" in doc.flags_at(row) and "| Flag |" not in doc.text  # the header: in the path
    assert doc.section_at(doc.text.index("After")) == "Stage > Flags"
    assert "table" not in doc.flags_at(doc.text.index("After"))


def test_a_table_is_chunked_by_whole_rows_each_chunk_under_its_header() -> None:
    rows = "".join(f"| `--flag-{i}` | value {i} of the flag |\n" for i in range(40))
    doc = parse(f"# Flags\n\n| Flag | Meaning |\n|---|---|\n{rows}".encode(), "text/markdown")
    chunks = Chunker(word_offsets, max_tokens=40, overlap_tokens=0).chunk(doc)
    assert len(chunks) > 3
    for chunk in chunks:
        assert chunk.section == "Flags > | Flag | Meaning |" and "table" in chunk.flags
        assert all(line.startswith("| `--flag-") and line.endswith("|") for line in
                   chunk.text.splitlines())  # fmt: skip
    assert sum(len(c.text.splitlines()) for c in chunks) == 40


def test_an_html_tables_header_row_names_every_chunk_of_it() -> None:
    """Before, a long HTML table (Sphinx, DocBook) was chunked as prose: the header row in
    the first chunk only, the rows after it with no column names."""
    rows = "".join(
        f"<tr><td><code>--flag-{i}</code></td><td>value {i} of it</td></tr>" for i in range(40)
    )
    html = f"""<h2>Options</h2><table><thead><tr><th>Flag</th><th>Meaning</th></tr></thead>
    <tbody>{rows}</tbody></table><p>After the table.</p>""".encode()
    doc = parse(html, "text/html")
    chunks = Chunker(word_offsets, max_tokens=40, overlap_tokens=0).chunk(doc)
    in_table = [c for c in chunks if "--flag-" in c.text]
    assert len(in_table) > 3
    for chunk in in_table:
        assert chunk.section == "Options > Flag | Meaning" and "table" in chunk.flags
        assert all(p.startswith("--flag-") for p in chunk.text.split("\n\n")), chunk.text
    assert doc.section_at(doc.text.index("After")) == "Options"


def test_a_stub_chunk_joins_a_neighbour_and_no_chunk_is_a_heading_alone() -> None:
    md = (
        "# NAME\ngrep - print lines.\n\n# DESCRIPTION\n"
        + "Grep searches each file. " * 8
        + "\n\n# NOTES\nSee also.\n"
    )
    doc = parse(md.encode(), "text/markdown")
    unmerged = Chunker(word_offsets, max_tokens=60, overlap_tokens=0, min_tokens=0).chunk(doc)
    assert unmerged[0].text == "grep - print lines."
    chunks = Chunker(word_offsets, max_tokens=60, overlap_tokens=0, min_tokens=12).chunk(doc)
    assert all(c.token_count >= 12 for c in chunks), [(c.text, c.token_count) for c in chunks]
    assert chunks[0].text.startswith("grep - print lines.") and chunks[0].section == "NAME"
    assert chunks[-1].text.endswith("See also.")  # the last section's stub joined the one before
    for chunk in chunks:
        assert doc.text[chunk.char_start : chunk.char_end] == chunk.text


def test_a_man_page_has_its_sections_and_no_running_header_or_justified_spaces() -> None:
    page = (
        "GREP(1)                    User Commands                    GREP(1)\n\n"
        "NAME\n       grep - print lines that match patterns\n\n"
        "OPTIONS\n   Generic Program Information\n       --help Output  a  usage  message.\n\n"
        "   Matching Control\n       -i, --ignore-case\n              Ignore  case.\n\n"
        "GNU grep 3.8                  2019-12-29                   GREP(1)\n"
    )
    doc = parse(page.encode(), "text/plain")
    assert "GREP(1)" not in doc.text and "Output a usage message." in doc.text
    assert doc.section_at(doc.text.index("grep - print")) == "NAME"
    assert doc.section_at(doc.text.index("--help")) == "OPTIONS > Generic Program Information"
    assert doc.section_at(doc.text.index("Ignore case")) == "OPTIONS > Matching Control"


def test_underlined_headings_in_plain_text_are_sections_by_style() -> None:
    rst = (
        "=======\nJansson\n=======\n\nA C library.\n\nBuilding\n--------\n\nRun cmake.\n\n"
        "Documentation\n-------------\n\nSee the docs.\n\nA line\n-- not a heading\n"
    )
    doc = parse(rst.encode(), "text/plain")
    assert doc.section_at(doc.text.index("A C library")) == "Jansson"
    assert doc.section_at(doc.text.index("Run cmake")) == "Jansson > Building"
    assert doc.section_at(doc.text.index("See the docs")) == "Jansson > Documentation"
    assert "-- not a heading" in doc.text and "=======" not in doc.text


def test_a_pdf_page_drawing_forms_within_forms_is_refused_not_the_worker_lost() -> None:
    """PDFium is C: in the worker's own process this page took 27 s and 8 GB in one call that
    no soft time limit interrupts. In its bounded child process it is a ParseError."""
    from shared.parsing.document import ParseOptions
    from tests.helpers import pdf_drawing_nested_forms, pdf_with_pages

    with pytest.raises(ParseError, match=r"within 2048 MB .* forms within forms"):  # 3 s here
        parse(pdf_drawing_nested_forms(), "application/pdf")
    # each bound holds, and says which setting it is
    tight = ParseOptions(pdf_text_timeout_s=0.001)
    with pytest.raises(ParseError, match="CONCORD_PDF_TEXT_TIMEOUT_S"):
        parse(pdf_drawing_nested_forms(depth=3), "application/pdf", tight)
    assert parse(pdf_drawing_nested_forms(depth=3), "application/pdf").text == "x"
    with pytest.raises(ParseError, match=r"over 5 characters .CONCORD_PDF_TEXT_MAX_CHARS"):
        parse(pdf_with_pages(["Six chars"]), "application/pdf", ParseOptions(pdf_text_max_chars=5))
    # the reader a bound stopped is not the next PDF's: a new one reads it
    assert parse(pdf_with_pages(["Read again."]), "application/pdf").text == "Read again."
    # a shallow nesting of the same kind is an ordinary page
    assert parse(pdf_drawing_nested_forms(depth=3), "application/pdf").text == "x"


def test_a_failed_pdfium_child_is_said_as_what_ended_it() -> None:
    """Killed by a signal or out of memory: the document's bound. PDFium missing: the
    server's fault (not a ParseError, so the job is not failed as the file's). Anything
    else: the reader's own last line."""
    from shared.parsing.document import ParseOptions
    from shared.parsing.pdf import PdfiumUnavailable, _child_failure

    options = ParseOptions()
    killed = _child_failure(-9, b"", options)
    assert isinstance(killed, ParseError)
    assert "within 2048 MB (CONCORD_PDF_TEXT_MEMORY_MB; the reader ended by signal 9)" in str(
        killed
    )
    assert "ended by MemoryError" in str(_child_failure(1, b"...\nMemoryError\n", options))
    missing = _child_failure(1, b"ModuleNotFoundError: No module named 'pypdfium2'\n", options)
    assert isinstance(missing, PdfiumUnavailable) and not isinstance(missing, ParseError)
    stopped = _child_failure(-15, b"", options)  # SIGTERM: a person's, not the file's
    assert isinstance(stopped, PdfiumUnavailable) and "signal 15" in str(stopped)
    other = _child_failure(1, b"Traceback\nValueError: odd page\n", options)
    assert str(other) == "the PDF could not be read (ValueError: odd page)"


def test_one_pdfium_reader_reads_a_process_s_pdfs_one_after_another() -> None:
    """Starting the reader costs 44 ms, more than a short PDF: it is kept from one PDF to
    the next (and a new one started every READER_DOCUMENTS)."""
    from shared.parsing import pdfium_reader
    from tests.helpers import pdf_with_pages

    reader = pdfium_reader.PdfiumReader()
    pids = set()
    for i in range(3):
        answer = reader.read(pdf_with_pages([f"Page {i}."]), 2048, 1000, 60.0)
        assert answer == {"pages": [f"Page {i}."], "unread": [], "error": None}
        assert reader._process is not None
        pids.add(reader._process.pid)
    assert len(pids) == 1
    # a reader that ended between two PDFs (stopped, or killed by the system) is not the
    # next PDF's fault: a new one reads it
    process = reader._process
    assert process is not None
    process.terminate()
    process.wait()
    assert reader.read(pdf_with_pages(["After."]), 2048, 1000, 60.0)["pages"] == ["After."]
    reader.close()
    assert reader._process is None


def test_pdf_refusals_say_what_to_do() -> None:
    import io

    from pypdf import PdfWriter

    from shared.documents.screening import screen_upload
    from tests.helpers import pdf_of, pdf_with_pages

    writer = PdfWriter(clone_from=io.BytesIO(pdf_with_pages(["Secret minutes."])))
    writer.encrypt(user_password="hunter2", owner_password="owner")
    locked = io.BytesIO()
    writer.write(locked)
    for refuse in (screen_upload, parse):
        with pytest.raises(ParseError, match="password-protected: upload it without"):
            refuse(locked.getvalue(), "application/pdf")
    no_pages = pdf_of(
        [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [] /Count 0 >>"]
    )
    with pytest.raises(ParseError, match="no pages"):
        parse(no_pages, "application/pdf")


def test_a_pdf_line_end_hyphen_joins_only_a_lowercase_word() -> None:
    """PDFium joins every word hyphenated at a line's end; a name keeps its hyphen."""
    from tests.helpers import pdf_with_lines

    raw = pdf_with_lines(["the GPL-", "3 licence, the manip-", "ulation of x86-", "64 code"])
    assert " ".join(parse(raw, "application/pdf").text.split()) == (
        "the GPL- 3 licence, the manipulation of x86- 64 code"
    )


def test_a_groff_manual_page_pdf_reads_as_words_not_kerned_pieces() -> None:
    """groff sets "key", "validity" and "-V option" with kerning: pypdf's text layer split
    them ("k ey", "v alidity", "-Voption"); PDFium's keeps them whole, hyphenated words
    joined across lines."""
    from pathlib import Path

    files = Path(__file__).parents[3] / "evaluation/devsets/real-docs/files"
    raw = (files / "man-ssh-keygen.pdf").read_bytes()
    text = " ".join(parse(raw, "application/pdf").text.split())
    assert "Finally, certificates may be defined with a validity lifetime. The -V option" in text
    assert "the CA public key must be trusted by sshd(8)" in text
    # a few remain split where bold type meets roman ("a CA k ey resides"): 63 with pypdf
    assert len(re.findall(r"\bk ey\b", text)) * 10 < len(re.findall(r"\bkey\b", text))
    assert not re.search(r"\ufffe|\r", text)


def test_pdf_text_is_normalized_and_running_lines_dropped() -> None:
    from shared.parsing.pdf import _pdf_text, _running_lines, _without_running_lines

    assert _pdf_text("e\ufb03cient de\ufb01nition of the manip-\nulation in GPL-\n3") == (
        "efficient definition of the manipulation in GPL-\n3"
    )
    # words a wide letter spacing split (seen in a paper's text layer: "retrie vals"), and
    # pairs that are two words as much as one, which stay apart
    assert _pdf_text("Dense retrie vals, the ab stract and its infor mation.") == (
        "Dense retrievals, the abstract and its information."
    )
    unchanged = "Put it in to the box be fore some thing else; run ls dir then rm rf tmp."
    assert _pdf_text(unchanged) == unchanged
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]
    pages = [
        f"Chapter 4: Functions {10 + i}\n{w} opens the page.\nThe {w} middle.\n"
        f"More of {w}.\n{w} ends the page.\n{10 + i}"
        for i, w in enumerate(words)
    ]
    pages.append("A last page without the header.\nIts text.")
    running = _running_lines(pages)
    assert running == {"Chapter #: Functions #", "#"}
    cleaned = _without_running_lines(pages[2], running)
    assert (
        cleaned == "gamma opens the page.\nThe gamma middle.\nMore of gamma.\ngamma ends the page."
    )
    assert _without_running_lines(pages[-1], running) == pages[-1]


def test_a_code_block_is_one_chunk_where_it_fits_and_cut_between_lines_where_not() -> None:
    code = "".join(f"    step_{i}(); // then the next step\n" for i in range(6))
    md = f"# Build\n\nRun this.\n\n```c\n{code}```\n\nThen stop. " + "More prose. " * 30
    doc = parse(md.encode(), "text/markdown")
    chunks = Chunker(word_offsets, max_tokens=80, overlap_tokens=0, min_tokens=0).chunk(doc)
    holding = [c for c in chunks if "step_0" in c.text]
    assert len(holding) == 1 and all(f"step_{i}" in holding[0].text for i in range(6))
    assert "code" in holding[0].flags
    small = Chunker(word_offsets, max_tokens=24, overlap_tokens=0, min_tokens=0).chunk(doc)
    for chunk in small:
        if "code" in chunk.flags:
            assert all(
                line.strip().startswith(("step_", "```")) for line in chunk.text.splitlines()
            )


def test_a_long_blocks_last_lines_are_no_stub_of_their_own() -> None:
    """Before, a code block a little longer than a chunk left its closing lines (a comment
    and a brace) as a chunk of their own, ranked among the first results. The last two
    chunks of a region now share its lines evenly."""
    body = "".join(f"  step_{i}(closure, value_{i});\n" for i in range(14))
    md = f"# Closure example\n\n```c\nint main() {{\n{body}  return 0;\n}}\n```\n".encode()
    doc = parse(md, "text/markdown")
    chunker = Chunker(word_offsets, max_tokens=40, overlap_tokens=0, min_tokens=24)
    counts = [c.token_count for c in chunker.chunk(doc)]
    # Greedy packing made 37, 35, 39 and 3 ("return 0; }"): the last two now share 42.
    assert counts == [37, 35, 21, 21], counts
    assert "".join(c.text for c in chunker.chunk(doc)).count("step_") == 14  # each line once


def test_a_one_line_description_joins_its_synopsis_block() -> None:
    """npm's command pages give each subcommand a one-line description and a code
    block: before, each was a stub of its own (5 and 16 tokens), ranked among the first results."""
    md = (
        b"# npm stage list\n\nList all staged package versions\n\n## Synopsis\n\n"
        b"```bash\nnpm stage list [<package-spec>]\n```\n\n## Flags\n\n"
        b"| Flag | Default |\n|---|---|\n| `--json` | false |\n"
    )
    chunks = Chunker(word_offsets, max_tokens=60, overlap_tokens=0, min_tokens=24).chunk(
        parse(md, "text/markdown")
    )
    [described] = [c for c in chunks if "List all staged" in c.text]
    assert "npm stage list [<package-spec>]" in described.text
    assert all("List all staged" not in c.text for c in chunks if "table" in c.flags)
