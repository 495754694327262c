"""A pod's output as text lines: bytes as they arrive -> whole, bounded lines.

``LineSplitter`` splits one stream (a line capped at 64 KiB, a carriage-return progress line
reduced to its latest state); ``RankLineSplitter`` reassembles each rank's lines from mpiexec's
tagged pieces. Both backends read the master's output with them (``logcursor`` adds the
Kubernetes log's timestamps and resume). Pure.
"""

from __future__ import annotations

import codecs
import re

MAX_LINE_BYTES = 64 * 1024  # a longer "line" (a progress bar without newlines) is cut here
CUT_MARK = " [... line cut at 64 KiB]"
# mpiexec --tag-output's tag ``[job,rank]<stream>:``, as bytes in the master's output, and any start
# of one (a chunk may end in it). Its numbers have at most 9 digits: a rank's text shaped like a
# tag with thousands of digits is text (int() refuses 4301 digits or more).
TAG_BYTES = re.compile(rb"\[(0|[1-9]\d{0,8}),(0|[1-9]\d{0,8})\]<std(?:out|err|diag)>:")
TAG_START_BYTES = re.compile(rb"\[\d*(?:,\d*(?:\](?:<[a-z]{0,7}>?)?)?)?")
MAX_TAG_BYTES = 40
# The job index mpiexec tags its (first and only) job's output with: ``[1,rank]``.
MPIEXEC_JOB = 1
# Ranks a tag may name when the job's size is not known (the spec's upper bound of mpi.np).
MAX_TAG_RANKS = 65536


def is_rank_tag(job: bytes | str, rank: bytes | str, np: int | None) -> bool:
    """A tag of the job's own ranks: job index 1 and a rank in 0..np-1. Any other tag-shaped
    text is something a rank printed, and stays text of the stream it came in."""
    return int(job) == MPIEXEC_JOB and int(rank) < (np if np is not None else MAX_TAG_RANKS)


def rank_pattern(np: int) -> str:
    """A regular expression of the numbers 0..np-1 as Open MPI prints them (no leading zeros),
    so one pass over a batch checks every line's rank."""
    top = str(max(np - 1, 0))
    shorter = [r"\d" if width == 1 else rf"[1-9]\d{{{width - 1}}}" for width in range(1, len(top))]
    same = []
    for index, digit in enumerate(top):
        low = 1 if index == 0 and len(top) > 1 else 0
        if int(digit) > low:
            rest = len(top) - index - 1
            same.append(f"{top[:index]}[{low}-{int(digit) - 1}]" + (rf"\d{{{rest}}}" if rest else ""))
    return "(?:" + "|".join([*shorter, *same, top]) + ")"


class PartialLine(str):
    """The latest state of a line still being written (a progress bar between its carriage
    returns): shown at a bounded rate, never counted as a line (it is not one yet)."""


class LineSplitter:
    """Bytes as they arrive (any chunking) -> complete text lines, without the newline and any
    trailing ``\r``. A line rewritten with carriage returns (a progress bar) keeps only its latest
    state, returned as ``"\r" + state`` so readers can tell it from a plain line; ``progress()``
    gives that state while the line is still being written. A line (or one state of it) longer
    than ``max_bytes`` keeps its first ``max_bytes`` and ends with ``CUT_MARK``; the rest, up to
    its next ``\r`` or newline, is dropped, so memory stays bounded (two states at most) whatever
    a process prints. ``max_bytes=None``: no cap (watch events, whose size the API server bounds).
    """

    def __init__(self, max_bytes: int | None = MAX_LINE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._partial = bytearray()  # the current state: since the line began or its last \r
        self._cut = False  # the current state is past max_bytes: drop until its \r or newline
        self._state: str | None = None  # the last finished state (ended by a \r) of this line
        self._states = 0  # finished states of this line
        self._reported = 0  # of them, how many ``progress()`` has seen

    def feed(self, chunk: bytes) -> list[str]:
        """The lines this chunk completes."""
        pieces = chunk.split(b"\n")
        rest = pieces.pop()
        if not pieces:
            self._keep(rest)
            return []
        self._keep(pieces[0])  # ends the line earlier chunks began
        first = self._end_line()
        self._keep(rest)
        pieces[0] = b""  # replaced by ``first`` below; the other pieces are whole lines
        limit = self.max_bytes
        if b"\r" in chunk:
            lines = [_render_line(piece, limit) for piece in pieces]
        elif limit is None or len(chunk) <= limit:
            lines = [piece.decode("utf-8", "replace") for piece in pieces]
        else:
            lines = [
                piece.decode("utf-8", "replace") if len(piece) <= limit else _cut_text(piece[:limit])
                for piece in pieces
            ]
        lines[0] = first
        return lines

    def flush(self) -> list[str]:
        """The last line when the stream ended without a newline ([] when it ended with one)."""
        if not self._partial and not self._cut and not self._states:
            return []
        return [self._end_line()]

    def progress(self) -> PartialLine | None:
        """The latest finished state of the line being written, once per new state; None when
        there is none (no ``\r`` yet, or nothing has followed the first: a ``\r\n`` may be
        splitting across chunks)."""
        if self._states == self._reported or (self._states == 1 and not (self._partial or self._cut)):
            return None
        self._reported = self._states
        return PartialLine("\r" + (self._state or ""))

    @property
    def idle(self) -> bool:
        """True between lines: nothing of a line is kept."""
        return not (self._partial or self._cut or self._states)

    def _keep(self, piece: bytes) -> None:
        if b"\r" in piece:
            first, *states = piece.split(b"\r")
            self._append(first)
            for state in states:
                self._finish_state()
                self._append(state)
        else:
            self._append(piece)

    def _append(self, piece: bytes) -> None:
        if self._cut or not piece:
            return
        room = len(piece) if self.max_bytes is None else self.max_bytes - len(self._partial)
        if len(piece) > room:
            self._partial += piece[:room]
            self._cut = True
        else:
            self._partial += piece

    def _finish_state(self) -> None:
        """A \r ends the current state; an empty one (``\r\r``) changes nothing."""
        if self._partial or self._cut:
            self._state = self._text()
            self._states += 1
            self._partial, self._cut = bytearray(), False

    def _text(self) -> str:
        return _cut_text(self._partial) if self._cut else self._partial.decode("utf-8", "replace")

    def _end_line(self) -> str:
        if self._partial or self._cut:
            text, states = self._text(), self._states + 1
        else:
            text, states = self._state or "", self._states
        self._partial, self._cut, self._state, self._states, self._reported = bytearray(), False, None, 0, 0
        return "\r" + text if states > 1 else text


def _render_line(line: bytes, limit: int | None) -> str:
    """One whole line as ``LineSplitter`` gives it: its last non-empty ``\r`` state (marked with a
    leading ``\r`` when it overwrote earlier ones), cut at ``limit``."""
    states = [state for state in line.split(b"\r") if state]
    last = states[-1] if states else b""
    text = last.decode("utf-8", "replace") if limit is None or len(last) <= limit else _cut_text(last[:limit])
    return "\r" + text if len(states) > 1 else text


def _cut_text(head: bytes | bytearray) -> str:
    """The kept start of an overlong line: a character split by the cut is dropped, not garbled."""
    return codecs.getincrementaldecoder("utf-8")("replace").decode(head, final=False) + CUT_MARK


class RankLineSplitter:
    """The master's output (mpiexec's own lines and its ``--tag-output`` rank output) -> whole
    lines, each rank's reassembled. mpiexec tags each piece it reads from a rank (at most 4 KiB)
    and every line start, but does not end a piece with a newline: a rank's line longer than a
    piece, or written in parts (a progress bar), arrives in tagged pieces mixed with other ranks'.
    So each tag (``[job,rank]<stream>:``) gets its own ``LineSplitter``; a line comes out tagged
    once, as a rank wrote it. Untagged text (mpiexec, the launch script, ``tag_output: false``)
    is one more stream. Memory: at most two states of ``max_bytes`` per rank stream.
    """

    def __init__(self, max_bytes: int | None = MAX_LINE_BYTES, np: int | None = None) -> None:
        self.max_bytes = max_bytes
        self.np = np  # the job's world size: a tag of another rank is text (None: up to MAX_TAG_RANKS)
        # By tag; b"" for untagged text. Only streams with a line begun are kept (an idle one
        # holds nothing), so at most one per rank and stream, whatever tags the ranks print.
        self._streams: dict[bytes, LineSplitter] = {}
        self._tag = b""  # the stream the bytes now arriving belong to
        self._held = b""  # the end of the last chunk, when it may be the start of a tag
        self._touched: set[bytes] = set()  # streams fed since the last ``progress()``
        self._busy: set[bytes] = set()  # streams with a line begun (not idle)
        text = "[^\r\n]*" if max_bytes is None else f"[^\r\n]{{0,{max(0, max_bytes - MAX_TAG_BYTES)}}}"
        # Lines that each are one short tagged piece: the common case, checked in one pass.
        tag = rf"\[{MPIEXEC_JOB},{rank_pattern(np if np is not None else MAX_TAG_RANKS)}\]<std(?:out|err|diag)>:"
        self._tagged_lines = re.compile(rf"(?:{tag}{text}\n)*".encode())

    def feed(self, chunk: bytes) -> list[str]:
        """The lines this chunk completes, in the order their newlines arrived."""
        data = self._held + chunk if self._held else chunk
        start = data.rfind(b"[", max(0, len(data) - MAX_TAG_BYTES))
        if start >= 0 and TAG_START_BYTES.fullmatch(data, start):
            data, self._held = data[:start], data[start:]
        else:
            self._held = b""
        lines: list[str] = []
        if self._tag:  # the piece the last chunk ended in goes on to its newline
            newline = data.find(b"\n") + 1 or len(data)
            self._split(data[:newline], lines)
            data = data[newline:]
        end = data.rfind(b"\n") + 1
        if end:
            self._whole_lines(data[: end - 1], lines)
            data = data[end:]
        self._split(data, lines)
        return lines

    def _split(self, data: bytes, lines: list[str]) -> None:
        """The general path: every tag starts a piece of its rank stream."""
        pos = 0
        for match in TAG_BYTES.finditer(data):
            if not is_rank_tag(match.group(1), match.group(2), self.np):
                continue  # tag-shaped text a rank printed: it stays in the stream it came in
            if match.start() > pos:
                self._route(data[pos : match.start()], lines)
            self._tag = match.group()
            pos = match.end()
        if pos < len(data):
            self._route(data[pos:], lines)

    def _whole_lines(self, data: bytes, lines: list[str]) -> None:
        """Whole lines of the master (``data`` without its last newline). The fast path, for
        line-buffered ranks: a line that is one tagged piece (it starts with a tag and holds no
        other), or untagged, short, without ``\r``, whose stream has no line begun, is a rank's
        line as it is. Any other line takes the general path."""
        one_tag_each = not self._busy and data.count(b"]<std") == data.count(b"\n") + 1
        if one_tag_each and self._tagged_lines.fullmatch(data + b"\n"):  # and each short, no \r, a tag of the job
            lines += data.decode("utf-8", "replace").split("\n")  # no \n byte is inside a UTF-8 sequence
            return
        limit, match, busy = self.max_bytes, TAG_BYTES.match, self._busy
        keep = lines.append
        for piece in data.split(b"\n"):
            tag = match(piece)
            if tag is not None and not is_rank_tag(tag.group(1), tag.group(2), self.np):
                tag = None  # a line of the untagged stream that looks like a tag
            if (
                (tag.group() if tag is not None else b"") not in busy
                and b"\r" not in piece
                and (limit is None or len(piece) <= limit)
                and piece.find(b"]<std", tag.end() if tag is not None else 0) < 0
            ):
                keep(piece.decode("utf-8", "replace"))
            else:
                self._split(piece + b"\n", lines)

    def flush(self) -> list[str]:
        """Every line still unfinished when the output ended, each rank's on its own."""
        lines: list[str] = []
        if self._held:
            held, self._held = self._held, b""
            self._route(held, lines)
        for tag, stream in self._streams.items():
            lines += [_tagged(tag, line) for line in stream.flush()]
        self._busy.clear()
        return lines

    def progress(self) -> list[PartialLine]:
        """The latest state of each line being rewritten (``LineSplitter.progress``), tagged."""
        states = []
        for tag in self._touched:
            stream = self._streams.get(tag)
            state = stream.progress() if stream is not None else None
            if state is not None:
                states.append(PartialLine(_tagged(tag, state)))
        self._touched.clear()
        return states

    def _route(self, data: bytes, lines: list[str]) -> None:
        """Untagged-for-now bytes: up to the first newline they belong to the current stream;
        after it a new line of the master starts, untagged until the next tag."""
        tag = self._tag
        if tag:
            newline = data.find(b"\n")
            head, data = (data, b"") if newline < 0 else (data[: newline + 1], data[newline + 1 :])
            lines += [_tagged(tag, line) for line in self._feed(tag, head)]
            if newline < 0:
                return
            self._tag = b""
        if data:
            lines += self._feed(b"", data)

    def _feed(self, tag: bytes, data: bytes) -> list[str]:
        stream = self._streams.get(tag)
        if stream is None:
            stream = self._streams[tag] = LineSplitter(self.max_bytes)
        self._touched.add(tag)
        lines = stream.feed(data)
        if stream.idle:
            self._busy.discard(tag)
            del self._streams[tag]  # an idle stream holds nothing: the next line starts a new one
        else:
            self._busy.add(tag)
        return lines


def _tagged(tag: bytes, line: str) -> str:
    return tag.decode("ascii") + line if tag else line
