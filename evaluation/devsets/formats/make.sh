#!/usr/bin/env bash
# Builds the formats dev set (files/ and questions.jsonl) and its baseline, formats-originals/
# (the same questions on the same documents in the format they were published in), from real
# documents with real, independent tools, never with Concord:
#
#   * documents of the real-docs set (evaluation/devsets/real-docs, licences in its SOURCE.md),
#     each converted to one other format: Word, OpenDocument text, RTF, EPUB and PowerPoint by
#     pandoc; OpenDocument presentations by LibreOffice from pandoc's decks; e-mail by Python's
#     email package (an HTML body, a plain-text body); scanned PDFs by LibreOffice (print to
#     PDF), poppler's pdftoppm (pages to 110-dpi greyscale JPEGs, as a scanner delivers them)
#     and LibreOffice again (each image a PDF page), joined by pdfunite;
#   * tables of real data shipped by Debian: distro-info-data's Debian and Ubuntu release
#     tables (ISC) and tzdata's country and zone tables (public domain), as Excel and
#     OpenDocument workbooks by LibreOffice, and as CSV and TSV.
#
# Each converted document takes its source's answerable questions (formal and casual, both
# halves of the real-docs split, with the same answer quotes); the tables' questions are in
# sheet-questions.jsonl, written from the tables before Concord read any of them.
# Needs Debian 12's pandoc, libreoffice-{writer,calc,impress}-nogui and poppler-utils.
# Run from the repository root: bash evaluation/devsets/formats/make.sh
set -euo pipefail
here=evaluation/devsets/formats
originals=evaluation/devsets/formats-originals
outlook=evaluation/devsets/formats-outlook
source_dir=evaluation/devsets/real-docs/files
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf "$here/files" "$originals/files" "$outlook/files"
mkdir -p "$here/files" "$originals/files" "$outlook/files"
echo 'function Image() return {} end' >"$work/no-images.lua"

# source document -> the format it is converted to
conversions=(
  "node-events.html docx" "npm-scripts.md docx"
  "valgrind-memcheck.html odt" "redis-readme.md odt"
  "man-db-news.md rtf" "npm-install.md rtf"
  "node-url.html epub" "valgrind-core-manual.html epub"
  "openssl-news.md pptx" "containerd-hosts.md pptx"
  "pip-dependency-resolution.md odp" "systemd-environment.md odp"
  "time-manual.html eml" "nettle-news.txt eml"
  "man-xargs.txt scan" "man-timeout.txt scan"
)
for pair in "${conversions[@]}"; do
  read -r name format <<<"$pair"
  stem=${name%.*}
  from=$([[ $name == *.html ]] && echo html || echo gfm)
  ln -s "../../real-docs/files/$name" "$originals/files/$name"
  case $format in
    docx|odt|rtf|epub|pptx)
      pandoc -f "$from" "$source_dir/$name" -s --metadata title="$stem" \
        --lua-filter "$work/no-images.lua" -o "$here/files/$stem.$format" ;;
    odp)
      pandoc -f "$from" "$source_dir/$name" -s --metadata title="$stem" \
        --lua-filter "$work/no-images.lua" -o "$work/$stem.pptx"
      (cd "$work" && soffice --headless --convert-to odp "$stem.pptx" >/dev/null)
      cp "$work/$stem.odp" "$here/files/" ;;
    eml)
      python3 - "$source_dir/$name" "$here/files/$stem.eml" <<'PY'
import sys
from email.message import EmailMessage
from pathlib import Path

source, out = Path(sys.argv[1]), Path(sys.argv[2])
message = EmailMessage()
message["From"] = "Docs bot <docs@example.org>"
message["To"] = "Team <team@example.org>"
message["Subject"] = f"Fwd: {source.stem}"
message["Date"] = "Tue, 01 Dec 2026 08:00:00 +0000"
if source.suffix == ".html":
    message.set_content("This message is HTML only.")
    message.make_alternative()
    message.get_payload().pop(0)  # an HTML-only message, as many newsletters are
    message.add_alternative(source.read_text(), subtype="html")
else:
    message.set_content(source.read_text())
out.write_bytes(bytes(message))
PY
      # The same message as Outlook saves it (.msg), converted from the .eml by
      # aspose-email-foss 26.3 (a pure-Python MSG writer, in a virtualenv of its own:
      # ASPOSE_PYTHON names its python; Concord reads .msg with extract-msg), into a set of
      # its own (../formats-outlook): beside the .eml, the same text twice in one corpus
      # would compete for the same top 5.
      "${ASPOSE_PYTHON:-python3}" - "$here/files/$stem.eml" "$outlook/files/$stem.msg" <<'PY'
import email
import email.policy
import sys
from pathlib import Path

from aspose.email_foss import msg

parsed = email.message_from_bytes(Path(sys.argv[1]).read_bytes(), policy=email.policy.default)
msg.MapiMessage.from_email_message(parsed).save(sys.argv[2])
PY
      ;;
    scan)
      cp "$source_dir/$name" "$work/$stem.txt"
      (cd "$work" && soffice --headless --convert-to pdf "$stem.txt" >/dev/null \
        && pdftoppm -r 110 -gray -jpeg -jpegopt quality=55 "$stem.pdf" "$stem-page" \
        && for page in "$stem"-page-*.jpg; do soffice --headless --convert-to pdf "$page" >/dev/null; done \
        && pdfunite $(ls "$stem"-page-*.pdf | sort -V) "$stem-scanned.pdf")
      cp "$work/$stem-scanned.pdf" "$here/files/" ;;
  esac
done

# Tables of real data: each as a workbook or delimited file, and its plain original.
cp /usr/share/distro-info/debian.csv "$work/debian-releases.csv"
cp /usr/share/distro-info/ubuntu.csv "$work/ubuntu-releases.csv"
{ printf 'code\tcountry\n'; grep -v '^#' /usr/share/zoneinfo/iso3166.tab; } >"$work/countries.tsv"
{ printf 'countries\tcoordinates\ttimezone\tcomments\n'; grep -v '^#' /usr/share/zoneinfo/zone1970.tab; } \
  >"$work/timezones.tsv"
(cd "$work" && soffice --headless --convert-to xlsx debian-releases.csv >/dev/null \
  && soffice --headless --convert-to ods ubuntu-releases.csv >/dev/null)
cp "$work/debian-releases.xlsx" "$work/ubuntu-releases.ods" "$here/files/"
tr '\t' ',' <"$work/countries.tsv" >"$here/files/countries.csv"  # no country name has a comma
cp "$work/timezones.tsv" "$here/files/timezones.tsv"
cp "$work/debian-releases.csv" "$work/ubuntu-releases.csv" "$work/countries.tsv" "$originals/files/"
cp "$work/timezones.tsv" "$originals/files/timezones.tsv"

# The questions: each converted document's source questions, named for the converted file.
python3 - "$here" "$originals" "${conversions[@]}" <<'PY'
import json
import sys
from pathlib import Path

here, originals = Path(sys.argv[1]), Path(sys.argv[2])
renamed = {}
for pair in sys.argv[3:]:
    name, fmt = pair.split()
    stem = name.rsplit(".", 1)[0]
    renamed[name] = f"{stem}-scanned.pdf" if fmt == "scan" else f"{stem}.{fmt}"
converted, baseline, outlook = [], [], []
for line in Path("evaluation/devsets/real-docs/questions.jsonl").read_text().splitlines():
    question = json.loads(line)
    if question["kind"] == "answerable" and question["file"] in renamed:
        baseline.append(question)
        converted.append({**question, "file": renamed[question["file"]]})
        if renamed[question["file"]].endswith(".eml"):  # the same message as Outlook's .msg
            outlook.append({**question, "id": question["id"] + "-msg",
                            "file": renamed[question["file"]][:-4] + ".msg"}
                           | ({"paraphrase_of": question["paraphrase_of"] + "-msg"}
                              if "paraphrase_of" in question else {}))
sheets = [json.loads(line) for line in (here / "sheet-questions.jsonl").read_text().splitlines()]
originals_of = {"debian-releases.xlsx": "debian-releases.csv",
                "ubuntu-releases.ods": "ubuntu-releases.csv",
                "countries.csv": "countries.tsv", "timezones.tsv": "timezones.tsv"}
converted += sheets
baseline += [{**q, "file": originals_of[q["file"]]} for q in sheets]
for folder, questions in ((here, converted), (originals, baseline)):
    (folder / "questions.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions))
(here.parent / "formats-outlook" / "questions.jsonl").write_text(
    "".join(json.dumps(q, ensure_ascii=False) + "\n" for q in outlook))
print(f"{len(converted)} questions on {len(renamed) + 4} files; {len(outlook)} on the .msg files")
PY
ls -l "$here/files"
