#!/usr/bin/env bash
# Makes this folder's documents from real text with real, independent tools (never with
# Concord): the zstd README (BSD; evaluation/devsets/real-docs/files/zstd-readme.md, from
# Debian 12's zstd package) by pandoc and LibreOffice, and Debian's release table (ISC;
# distro-info-data's /usr/share/distro-info/debian.csv) by LibreOffice. Needs Debian 12's
# pandoc, libreoffice-{writer,calc,impress}-nogui. The files are committed: tests do not run
# this. Run from the repository root: bash tests/data/formats/make.sh
set -euo pipefail
here=tests/data/formats
readme=evaluation/devsets/real-docs/files/zstd-readme.md
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The README's badges and logo are remote images, which pandoc would fetch: left out.
echo 'function Image() return {} end function RawInline() return {} end' >"$work/no-images.lua"
for format in docx odt rtf epub pptx; do
  pandoc -f gfm "$readme" -s --metadata title="Zstandard" --lua-filter "$work/no-images.lua" \
    -o "$here/zstd-readme.$format"
done
cp "$here/zstd-readme.pptx" "$work/zstd-readme.pptx"
(cd "$work" && soffice --headless --convert-to odp zstd-readme.pptx >/dev/null)
cp "$work/zstd-readme.odp" "$here/"
cp /usr/share/distro-info/debian.csv "$here/debian-releases.csv"
tr ',' '\t' < /usr/share/distro-info/debian.csv > "$here/debian-releases.tsv"
(cd "$here" && soffice --headless --convert-to xlsx debian-releases.csv >/dev/null \
  && soffice --headless --convert-to ods debian-releases.csv >/dev/null)
ls -l "$here"

# An e-mail as a mail client saves one (RFC 822, by Python's standard email package): the
# README's first section as its text, the release table as a CSV attachment, and a picture
# Concord does not read, listed by name.
python3 - "$readme" "$here" <<'PY'
import sys
from email.message import EmailMessage
from pathlib import Path

readme, here = Path(sys.argv[1]), Path(sys.argv[2])
body = readme.read_text().split("## Benchmarks")[0].split("</p>", 1)[1]
message = EmailMessage()
message["From"] = "Release team <releases@example.org>"
message["To"] = "Packaging list <packaging@example.org>"
message["Subject"] = "What Zstandard is, and the Debian release table"
message["Date"] = "Mon, 30 Nov 2026 09:30:00 +0000"
message.set_content(body)
message.add_attachment(
    Path("/usr/share/distro-info/debian.csv").read_bytes(),
    maintype="text", subtype="csv", filename="debian.csv",
)
message.add_attachment(b"\x89PNG\r\n\x1a\n", maintype="image", subtype="png", filename="logo.png")
(here / "zstd-announcement.eml").write_bytes(bytes(message))
PY

# The same message as Outlook saves one (.msg, an OLE file of MAPI properties), converted from
# the .eml by aspose-email-foss (pip install aspose-email-foss==26.3, in a virtualenv of its
# own: a pure-Python MSG writer, independent of extract-msg, which Concord reads it with).
python3 - "$here" <<'PY'
import email
import email.policy
import sys
from pathlib import Path

from aspose.email_foss import msg

here = Path(sys.argv[1])
parsed = email.message_from_bytes(
    (here / "zstd-announcement.eml").read_bytes(), policy=email.policy.default
)
msg.MapiMessage.from_email_message(parsed).save(str(here / "zstd-announcement.msg"))
PY

# A password-protected Word file, encrypted by msoffcrypto-tool (pip install msoffcrypto-tool)
# as Office does it (an OLE file holding the encrypted package).
msoffcrypto-tool -e -p secret "$here/zstd-readme.docx" "$here/encrypted.docx"

# Scanned pages: the Word file printed to PDF by LibreOffice, its first two pages rendered to
# greyscale JPEGs at 110 dpi by poppler's pdftoppm (as a scanner would deliver them), each
# wrapped in a PDF of its own by LibreOffice (ImageMagick's policy forbids writing PDF), the
# two joined by pdfunite: PDFs with no text layer.
cp "$here/zstd-readme.docx" "$work/"
(cd "$work" && soffice --headless --convert-to pdf zstd-readme.docx >/dev/null \
  && pdftoppm -r 110 -gray -jpeg -jpegopt quality=55 -f 1 -l 2 zstd-readme.pdf page \
  && soffice --headless --convert-to pdf page-1.jpg >/dev/null \
  && soffice --headless --convert-to pdf page-2.jpg >/dev/null \
  && pdfunite page-1.pdf page-2.pdf scanned.pdf)
cp "$work/page-1.jpg" "$here/zstd-readme-page-1.jpg"
cp "$work/page-1.pdf" "$here/zstd-readme-scanned-page-1.pdf"
cp "$work/scanned.pdf" "$here/zstd-readme-scanned.pdf"
