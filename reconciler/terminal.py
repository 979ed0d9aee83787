"""Text for a terminal: control characters made visible, so that what a job printed, or what
anyone pushed to the status branch, cannot drive the terminal of whoever reads it.

The CLI wraps its standard streams with :func:`guard` when they are terminals (as OpenSSH and
git do for remote output); ``--raw`` passes bytes through for pipes that want them. Pure apart
from writing to the stream it is given.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import re
import sys
from collections.abc import Iterator
from typing import BinaryIO, TextIO

# Every C0 control except tab and newline, DEL, and the C1 controls (U+0080..U+009F, which some
# terminals obey as 8-bit CSI/OSC even when they arrive UTF-8 encoded).
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _visible(m: re.Match[str]) -> str:
    """``cat -v`` notation: ``^[`` for ESC, ``^?`` for DEL, ``M-^[`` for U+009B."""
    code = ord(m.group(0))
    if code < 0x20:
        return "^" + chr(code + 0x40)
    if code == 0x7F:
        return "^?"
    return "M-^" + chr(code - 0x80 + 0x40)


def escape(text: str) -> str:
    """Return ``text`` with every control character other than newline and tab written in
    ``cat -v`` notation (``\\x1b[2J`` becomes ``^[[2J``, a carriage return ``^M``)."""
    return _CONTROLS.sub(_visible, text)


class _EscapingBytes(io.RawIOBase):
    """A binary stream that decodes UTF-8 as it arrives (a character split across writes is
    held back), escapes it and writes it to ``out``; undecodable bytes become U+FFFD."""

    def __init__(self, out: TextIO) -> None:
        super().__init__()
        self._out = out
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        self._out.write(escape(self._decoder.decode(bytes(data))))
        return len(data)

    def flush(self) -> None:
        self._out.flush()

    def close(self) -> None:
        if not self.closed:
            self._out.write(escape(self._decoder.decode(b"", final=True)))
            self._out.flush()
        super().close()


class EscapingStream(io.TextIOBase):
    """A text stream that writes :func:`escape`\\ d text to ``out``; ``buffer`` takes bytes."""

    def __init__(self, out: TextIO) -> None:
        super().__init__()
        self._out = out
        self.buffer: BinaryIO = _EscapingBytes(out)  # type: ignore[assignment]

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._out.write(escape(text))
        return len(text)

    def flush(self) -> None:
        self._out.flush()

    def isatty(self) -> bool:
        return self._out.isatty()

    def fileno(self) -> int:
        return self._out.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._out.encoding


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or odd stream is not a terminal
        return False


@contextlib.contextmanager
def guard(*, raw: bool = False) -> Iterator[None]:
    """Within the block, ``sys.stdout`` and ``sys.stderr`` escape control characters when they
    are terminals (each decided on its own) unless ``raw``. Yields nothing; restores both."""
    saved = sys.stdout, sys.stderr
    wrapped: list[EscapingStream] = []
    if not raw:
        if _is_terminal(sys.stdout):
            sys.stdout = EscapingStream(saved[0])
            wrapped.append(sys.stdout)
        if _is_terminal(sys.stderr):
            sys.stderr = EscapingStream(saved[1])
            wrapped.append(sys.stderr)
    try:
        yield
    finally:
        for stream in wrapped:
            stream.buffer.close()  # a UTF-8 sequence cut off at the end is written as U+FFFD
        sys.stdout, sys.stderr = saved
