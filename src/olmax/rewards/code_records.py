"""The code verifier's side of its child's report: the records, read as they arrive, up to bounds.

The sandbox's runner (olmax.rewards.code_runner `record`) writes, for each test, one record "<kind> <index>
<length>\\n" and `length` bytes of reason: "p" (passed), "f" (failed), "r" (refused: it used no name of
the program's), "t" (out of time), or one "error 0 <length>" (the sandbox could not be entered). Only the
runner holds the descriptor (no process of the program's or of a test's does), and it writes each record
in one write(2) of at most PIPE_BUF bytes: a runner killed midway leaves whole records. Still, nothing
here trusts more than the form: the reader holds at most one record (HEADER_BYTES + RECORD_BYTES) at a
time, and anything else (a header that is not one, an unknown kind, a record past RECORD_BYTES, a second
record for one test, more than `report_bytes` in all) is an overflow: the child is killed and every test
fails.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import time

HEADER_BYTES = 64  # "<kind> <index> <length>\n"
RECORD_BYTES = 512  # one test's record: its verdict's reason (code_harness.REASON_CHARS, and room)
_KINDS = frozenset((b"p", b"f", b"r", b"t", b"error"))
_PER_TEST = 1


def report_bytes(tests: int) -> int:
    """The most the verifier reads of a child's output for a run of `tests` tests (a time bound: it holds
    one record at a time). A child that writes more is killed, its tests "overflow"."""
    return HEADER_BYTES + RECORD_BYTES + tests * _PER_TEST * (HEADER_BYTES + RECORD_BYTES)


class Records:
    """The child's output, cut into records as it arrives; each is handed to `on_record(kind, index,
    payload)`. `bad` says why the output stopped being records (then nothing more is read)."""

    def __init__(self, tests: int, on_record):
        self.tests, self.on_record = tests, on_record
        self.buffer = bytearray()
        self.header: tuple | None = None  # (kind, index, length) of the record being read
        self.counts = [0] * tests
        self.read = 0
        self.bad = ""

    def _header(self, line: bytes) -> tuple | None:
        parts = line.split(b" ")
        if len(parts) != 3 or parts[0] not in _KINDS or not parts[1].isdigit() or not parts[2].isdigit():
            return None
        index, length = int(parts[1]), int(parts[2])
        if index >= max(self.tests, 1) or length > RECORD_BYTES:
            return None
        return parts[0].decode(), index, length

    def feed(self, chunk: bytes) -> None:
        self.read += len(chunk)
        if self.read > report_bytes(self.tests):
            self.bad = f"more than {report_bytes(self.tests)} bytes"
            return
        self.buffer += chunk
        while not self.bad:
            if self.header is None:
                end = self.buffer.find(b"\n", 0, HEADER_BYTES)
                if end < 0:
                    if len(self.buffer) >= HEADER_BYTES:
                        self.bad = "a line that is no record's header"
                    return
                self.header = self._header(bytes(self.buffer[:end]))
                del self.buffer[: end + 1]
                if self.header is None:
                    self.bad = "a line that is no record's header"
                    return
            kind, index, length = self.header
            if len(self.buffer) < length:
                return
            payload = bytes(self.buffer[:length])
            del self.buffer[:length]
            self.header = None
            if kind != "error":
                self.counts[index] += 1
                if self.counts[index] > _PER_TEST:
                    self.bad = f"more than {_PER_TEST} records for test {index}"
                    return
            self.on_record(kind, index, payload)


def exchange(child: subprocess.Popen, job: bytes, records: Records, bound: float) -> str:
    """Write `job` to the child's stdin while its stdout is fed to `records`, until it closes its stdout and
    exits ("eof"), `bound` seconds pass ("timeout"), or its output stops being records ("overflow": the
    caller kills it)."""
    deadline = time.monotonic() + bound
    pending, state = memoryview(job), "timeout"
    os.set_blocking(child.stdin.fileno(), False)
    with selectors.DefaultSelector() as selector:
        selector.register(child.stdout, selectors.EVENT_READ)
        selector.register(child.stdin, selectors.EVENT_WRITE)
        while state == "timeout" and time.monotonic() < deadline:
            for key, _ in selector.select(deadline - time.monotonic()):
                if key.fileobj is child.stdin:
                    try:
                        pending = pending[os.write(child.stdin.fileno(), pending[: 1 << 16]) :]
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:  # the child is gone: what it wrote is still read
                        pending = pending[:0]
                    if not pending:
                        selector.unregister(child.stdin)
                        child.stdin.close()
                    continue
                chunk = os.read(child.stdout.fileno(), 1 << 16)
                if not chunk:
                    state = "eof"
                    break
                records.feed(chunk)
                if records.bad:
                    return "overflow"
    if state == "eof":  # as communicate() did: the run is over when the child has exited, within the bound
        try:
            child.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            state = "timeout"
    return state
