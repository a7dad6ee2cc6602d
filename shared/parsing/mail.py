"""E-mail: RFC 822 messages (.eml), read by the standard ``email`` package, and Outlook's
messages (.msg, OLE files of MAPI properties), read by extract-msg.

A message reads as a header block (Subject, From, To, Cc, Date), under the subject as its
section, then its body: the plain-text part, or the HTML part through the HTML parser where
there is no plain one. Each attachment of a supported type is parsed by its own parser and kept
as a section of its own ("Attachment: report.docx"); the others are listed by name. Attached
messages are read the same way, ``MAX_DEPTH`` deep. A message and the messages attached to it
share one budget: ``MAX_ATTACHMENTS`` parts read in all, and the archives among them (Office
files, EPUB) inflating to ``MAX_INFLATED_BYTES`` in all, as one archive may; past it an
attachment is listed, not read (each archive passing on its own, a hundred of them would
inflate a hundred times as much)."""

from __future__ import annotations

import email
import email.policy
import email.utils
import mimetypes
from dataclasses import dataclass, field
from datetime import datetime
from email.message import EmailMessage
from typing import Any

from shared.errors import ParseError
from shared.parsing.containers import MAX_INFLATED_BYTES, OUTLOOK_MESSAGE, stated_inflated_bytes
from shared.parsing.document import ParsedDocument, ParseOptions, TextBuilder
from shared.parsing.html import parse_html
from shared.retry import is_retriable

MAX_DEPTH = 3  # messages attached to messages
MAX_ATTACHMENTS = 100  # parts read, in a message and those attached to it together
HEADERS = ("Subject", "From", "To", "Cc", "Date")


@dataclass
class Budget:
    """What is left to read of one uploaded message's attachments, nested ones included."""

    parts: int = field(default_factory=lambda: MAX_ATTACHMENTS)
    inflated_bytes: int = field(default_factory=lambda: MAX_INFLATED_BYTES)

    def admit(self, data: bytes) -> str | int:
        """Why the attachment ``data`` is not read, or what it reserves of the budget: its
        archive's stated inflated size (an archive is known by its central directory, found
        from the end: bytes before it do not hide one)."""
        if self.parts <= 0:
            return f"past the {MAX_ATTACHMENTS} attachments a message's are read to"
        inflated = stated_inflated_bytes(data)
        if inflated > self.inflated_bytes:
            return f"its archive would pass the {MAX_INFLATED_BYTES:,} bytes a message's inflate to"
        self.parts -= 1
        self.inflated_bytes -= inflated
        return inflated

    def release(self, inflated: int) -> None:
        """Give back what an attachment that was not read (no supported type) reserved."""
        self.parts += 1
        self.inflated_bytes += inflated


def parse_eml(raw: bytes, options: ParseOptions) -> ParsedDocument:
    return _eml(raw, options, depth=0, budget=Budget())


def _eml(raw: bytes, options: ParseOptions, depth: int, budget: Budget) -> ParsedDocument:
    message = email.message_from_bytes(raw, policy=email.policy.default)
    if not isinstance(message, EmailMessage) or not message.keys():
        raise ParseError("the file is not an e-mail message (it has no headers)")
    out = TextBuilder()
    headers = {name: str(message.get(name, "") or "") for name in HEADERS}
    body = message.get_body(preferencelist=("plain", "html"))
    text, html = "", None
    if body is not None:
        content = _text_of(body)
        if body.get_content_subtype() == "html":
            html = content
        else:
            text = content
    attachments = [
        (part.get_filename() or "unnamed", part.get_content_type(), _payload(part))
        for part in message.iter_attachments()
    ]
    _message(out, headers, text, html, attachments, options, depth, budget)
    return out.build()


def _message(
    out: TextBuilder,
    headers: dict[str, str],
    text: str,
    html: str | None,
    attachments: list[tuple[str, str, bytes]],
    options: ParseOptions,
    depth: int,
    budget: Budget,
) -> None:
    subject = " ".join(headers["Subject"].split())
    out.heading(1, subject or "(no subject)")
    out.paragraph("\n".join(f"{name}: {value}" for name, value in headers.items() if value))
    if html is not None:
        out.include(parse_html(html), 2, "")
    else:
        out.paragraph(text)
    listed: list[str] = []
    for name, content_type, data in attachments:
        reserved = budget.admit(data) if data.strip() else 0
        if isinstance(reserved, str):  # past the budget: listed with why
            listed.append(f"{name} ({reserved})")
            continue
        parsed = _attachment(name, content_type, data, options, depth, budget)
        if parsed is None:
            if data.strip():
                budget.release(reserved)
            listed.append(name)
        else:
            out.include(parsed, 2, f"Attachment: {name}")
    if listed:
        out.heading(2, "Attachments not read")
        out.paragraph("\n".join(f"- {name}" for name in listed))


def parse_msg(raw: bytes, options: ParseOptions) -> ParsedDocument:
    return _msg(raw, options, depth=0, budget=Budget())


def _msg(raw: bytes, options: ParseOptions, depth: int, budget: Budget) -> ParsedDocument:
    """An Outlook message read as an e-mail is: its subject, sender, recipients and date as
    the header block, its plain body (or its HTML one where there is none), its attachments
    (an attached Outlook message by this same reading)."""
    import extract_msg
    from extract_msg.exceptions import ExMsgBaseException
    from extract_msg.msg_classes import MessageBase

    try:
        message = extract_msg.openMsg(raw, delayAttachments=False)
    except (ExMsgBaseException, OSError, ValueError, IndexError, KeyError) as e:
        raise ParseError(f"the file is not a readable Outlook message ({type(e).__name__})") from e
    try:
        if not isinstance(message, MessageBase):
            raise ParseError("the Outlook file is not a message (a contact, task or note?)")
        sent = message.date
        headers = {
            "Subject": str(message.subject or ""),
            "From": str(message.sender or ""),
            "To": str(message.to or ""),
            "Cc": str(message.cc or ""),
            "Date": email.utils.format_datetime(sent) if isinstance(sent, datetime) else "",
        }
        text, html = str(message.body or ""), None
        if not text.strip() and message.htmlBody:
            html = message.htmlBody.decode("utf-8", "replace")
        attachments = [_msg_attachment(a) for a in message.attachments]
    finally:
        message.close()
    out = TextBuilder()
    _message(out, headers, text, html, attachments, options, depth, budget)
    return out.build()


def _msg_attachment(attachment: Any) -> tuple[str, str, bytes]:
    """(name, content type, bytes) of an Outlook attachment; an attached message as the
    bytes of its own .msg, an attachment with no data (a link, an OLE object) as none."""
    name = str(attachment.longFilename or attachment.shortFilename or attachment.displayName or "")
    data = attachment.data
    if hasattr(data, "exportBytes"):  # an attached Outlook message
        return name or "message.msg", OUTLOOK_MESSAGE, data.exportBytes()
    content_type = attachment.mimetype or mimetypes.guess_type(name)[0] or ""
    return name or "unnamed", str(content_type), data if isinstance(data, bytes) else b""


def _attachment(
    name: str, content_type: str, data: bytes, options: ParseOptions, depth: int, budget: Budget
) -> ParsedDocument | None:
    """An attachment's parse, or None where it is of no supported type or cannot be read
    (it is then listed by name: one bad attachment does not fail the message)."""
    if not data.strip() or options.parse_part is None:
        return None
    try:
        if content_type == "message/rfc822" or name.lower().endswith(".eml"):
            return _eml(data, options, depth + 1, budget) if depth < MAX_DEPTH else None
        if content_type == OUTLOOK_MESSAGE or name.lower().endswith(".msg"):
            return _msg(data, options, depth + 1, budget) if depth < MAX_DEPTH else None
        return options.parse_part(name, content_type, data)
    except Exception as e:  # the registry's ParseError, or the email package's own
        if is_retriable(e):
            raise
        return None


def _payload(part: Any) -> bytes:
    if part.get_content_type() == "message/rfc822":
        inner = part.get_payload()
        inner = inner[0] if isinstance(inner, list) and inner else inner
        return inner.as_bytes() if hasattr(inner, "as_bytes") else b""
    data = part.get_payload(decode=True)
    return data if isinstance(data, bytes) else b""


def _text_of(part: Any) -> str:
    try:
        return str(part.get_content())
    except (LookupError, ValueError):  # an unknown charset, a broken encoding
        data = part.get_payload(decode=True) or b""
        return data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
