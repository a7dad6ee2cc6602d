"""OCR throughput: pages per second of scanned PDFs and page images parsed as the ingest worker
parses them (shared/parsing: pypdf finds the page's image, Tesseract reads it), and the text
formats' parse time per MB beside it, one run on this machine.

    .venv/bin/python bench/ocr.py [--repeat 2]

Reads the formats dev set's scans (evaluation/devsets/formats/files/*-scanned.pdf) and the
test files (tests/data/formats); prints JSON and writes bench/results/ocr.json."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from shared.parsing import parse, resolve_content_type

ROOT = Path(__file__).resolve().parent.parent
SCANS = sorted((ROOT / "evaluation/devsets/formats/files").glob("*-scanned.pdf"))
TEXT_FORMATS = sorted(
    p
    for p in (ROOT / "tests/data/formats").iterdir()
    if p.suffix in (".docx", ".odt", ".pptx", ".odp", ".xlsx", ".ods", ".epub", ".rtf", ".eml")
    and not p.name.startswith("encrypted")
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/ocr.json")
    args = parser.parse_args()
    pages = 0
    started = time.perf_counter()
    for _ in range(args.repeat):
        for path in SCANS:
            doc = parse(path.read_bytes(), "application/pdf")
            pages += sum(1 for s in doc.sections if "ocr" in s.flags)
    ocr_s = time.perf_counter() - started
    parsed_bytes = 0
    started = time.perf_counter()
    for _ in range(args.repeat * 10):
        for path in TEXT_FORMATS:
            raw = path.read_bytes()
            parse(raw, resolve_content_type(None, path.name, raw))
            parsed_bytes += len(raw)
    text_s = time.perf_counter() - started
    figures = {
        "ocr_pages": pages,
        "ocr_seconds": round(ocr_s, 1),
        "ocr_pages_per_s": round(pages / ocr_s, 3),
        "office_files_mb_per_s": round(parsed_bytes / 1e6 / text_s, 2),
        "office_files_parsed": len(TEXT_FORMATS) * args.repeat * 10,
    }
    print(json.dumps(figures, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
