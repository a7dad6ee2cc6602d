"""The PDFium child process (shared/parsing/_pdfium_child.py, which says why it is one) as the
worker's PDF reader: started on a process's first PDF and kept for the next ones, since
starting it costs 44 ms, more than reading a short PDF. A reader is never reused after a PDF it
did not answer in time, did not answer at all (its memory bound killed it), or was stopped in
the middle of (a task's time limit): the next PDF starts a new one. One PDF at a time a
process (a lock), and a new reader every ``READER_DOCUMENTS`` PDFs, so what PDFium's heap keeps
from one document does not add up.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

from shared.parsing._pdfium_child import LENGTH_BYTES

_CHILD = Path(__file__).with_name("_pdfium_child.py")
READER_DOCUMENTS = 200
# What a failed reader's standard error is read back for: its last line says why.
STDERR_TAIL_BYTES = 4096


class ReaderTimedOut(Exception):
    """The reader did not answer within its time; it has been stopped."""


class ReaderUnavailable(Exception):
    """No reader process could be started, or one was stopped by a signal no PDF sends (the
    server's doing, not the file's)."""


class ReaderEnded(Exception):
    """The reader ended without answering (killed by its memory bound, or failed to start)."""

    def __init__(self, returncode: int, stderr: bytes) -> None:
        super().__init__(returncode)
        self.returncode = returncode
        self.stderr = stderr


class PdfiumReader:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._bounds: tuple[int, int] | None = None  # (memory MB, max chars) it started with
        self._served = 0
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        """In a forked child: the parent's reader, and its lock as it was, are the parent's
        (another thread may have held the lock, mid-read): this process starts its own."""
        self._lock = threading.Lock()
        self._process, self._stderr, self._bounds = None, None, None

    def read(self, raw: bytes, memory_mb: int, max_chars: int, timeout_s: float) -> Any:
        """The child's JSON answer for ``raw``; ReaderTimedOut or ReaderEnded otherwise."""
        with self._lock:
            process = self._running(memory_mb, max_chars)
            answered = False
            try:
                answer = self._ask(process, raw, time.monotonic() + timeout_s)
                answered = True
            finally:
                if not answered:  # timed out, ended, or interrupted: never reused
                    self._stop()
            self._served += 1
            return json.loads(answer)

    def _running(self, memory_mb: int, max_chars: int) -> subprocess.Popen[bytes]:
        bounds = (memory_mb, max_chars)
        if self._process is not None and (
            self._bounds != bounds
            or self._served >= READER_DOCUMENTS
            or self._process.poll() is not None  # ended between PDFs: not the next PDF's fault
        ):
            self._stop()
        if self._process is None:
            self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (kept with the reader)
            try:
                self._process = subprocess.Popen(
                    [sys.executable, "-I", str(_CHILD), str(memory_mb), str(max_chars)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=self._stderr,
                    # its own session: a signal to the worker's process group (the stack's
                    # stop, a terminal's Ctrl-C) is not the reader's, mid-PDF
                    start_new_session=True,
                )
            except OSError as e:  # no process to be had (EMFILE, EAGAIN): the server's
                raise ReaderUnavailable(f"the PDF reader could not be started ({e})") from e
            self._bounds, self._served = bounds, 0
        return self._process

    def _ask(self, process: subprocess.Popen[bytes], raw: bytes, deadline: float) -> bytes:
        assert process.stdin is not None and process.stdout is not None
        try:
            process.stdin.write(len(raw).to_bytes(LENGTH_BYTES, "big") + raw)
            process.stdin.flush()
        except BrokenPipeError:
            raise self._ended(process) from None
        length = int.from_bytes(self._receive(process, LENGTH_BYTES, deadline), "big")
        return self._receive(process, length, deadline)

    def _receive(self, process: subprocess.Popen[bytes], size: int, deadline: float) -> bytes:
        assert process.stdout is not None
        received = bytearray()
        # a selector, not select(): a worker holding 1,024 descriptors is no file's fault
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            while len(received) < size:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    raise ReaderTimedOut
                part = os.read(process.stdout.fileno(), min(size - len(received), 1 << 20))
                if not part:
                    raise self._ended(process)
                received += part
        return bytes(received)

    def _ended(self, process: subprocess.Popen[bytes]) -> ReaderEnded:
        try:
            returncode = process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            returncode = process.wait()
        stderr = b""
        if self._stderr is not None:
            self._stderr.seek(0, os.SEEK_END)
            self._stderr.seek(max(0, self._stderr.tell() - STDERR_TAIL_BYTES))
            stderr = self._stderr.read()
        return ReaderEnded(returncode, stderr)

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
        if process is not None:
            for stream in (process.stdin, process.stdout):
                if stream is not None:
                    with contextlib.suppress(OSError):  # a buffer a killed reader won't take
                        stream.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def close(self) -> None:
        with self._lock:
            self._stop()


# One reader a process: a worker's PDFs go through it one at a time. (A reader left at exit
# would end by itself at the end of its input; closing it spares the warning.)
READER = PdfiumReader()
atexit.register(READER.close)
