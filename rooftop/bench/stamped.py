"""A socket transport whose every read carries the kernel's receive time (Linux SO_TIMESTAMPNS).

Both ends of a calibration read through it: the synthetic server stamps a request's arrival, the load
client each chunk's. A stamp is when the bytes reached the socket, however late the process got to
them, so an event loop's own queue (or a CPU shared with other processes) stays out of the timings.
Without kernel stamps a read is stamped when it is made.

One limit: TCP hands over one stamp per read, the newest bytes'. Bytes that waited in the socket for
a read that came late take the stamp of the last bytes that joined them.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import sys
import time
from typing import Protocol

# Linux's SO_TIMESTAMPNS: each recvmsg carries the kernel's receive time (CLOCK_REALTIME). Python does
# not always name it; 35 is its number on Linux, and on other systems no stamp is asked for.
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35) if sys.platform.startswith("linux") else None
_CMSG_SPACE = socket.CMSG_SPACE(16)
_READ_BYTES = 1 << 16
_TIMESPEC = struct.Struct("qq")


class Receiver(Protocol):
    def connection_lost(self, exc: BaseException | None) -> None: ...

    def data_received_at(self, data: bytes, stamp_ns: int) -> None: ...


def realtime_offset_ns() -> int:
    """CLOCK_REALTIME minus CLOCK_MONOTONIC (perf_counter_ns), read between two monotonic reads; of
    three tries the tightest, so a preemption between the reads cannot skew it."""
    best_gap, offset = None, 0
    for _ in range(3):
        t0 = time.perf_counter_ns()
        real = time.time_ns()
        t1 = time.perf_counter_ns()
        if best_gap is None or t1 - t0 < best_gap:
            best_gap, offset = t1 - t0, real - (t0 + t1) // 2
        if best_gap < 2_000:
            break
    return offset


# The offset is read again when it is older than this: between reads NTP can slew CLOCK_REALTIME by at
# most 500 ppm, 5 µs in 10 ms, where reading it on every read costs ~1.5 µs of a ~15 µs chunk.
_OFFSET_MAX_AGE_NS = 10_000_000
_offset = [0, -_OFFSET_MAX_AGE_NS]  # the offset, and when it was read (perf_counter_ns)


def _current_offset_ns(now_ns: int) -> int:
    if now_ns - _offset[1] >= _OFFSET_MAX_AGE_NS:
        _offset[0], _offset[1] = realtime_offset_ns(), now_ns
    return _offset[0]


class StampedTransport:
    """The few transport calls a connection needs, over a non-blocking socket read with recvmsg.

    `protocol.data_received_at(data, stamp_ns)` gets each read with its kernel receive time as a
    perf_counter_ns value; `protocol.connection_lost(None)` when the socket closes or fails.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, protocol: Receiver):
        self.loop, self.sock, self.protocol = loop, sock, protocol
        self.fd = sock.fileno()
        self.wbuf = b""
        self.closing = False
        self.kernel_stamps = False  # True once a read has come with the kernel's stamp
        if SO_TIMESTAMPNS is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        loop.add_reader(self.fd, self._read_ready)

    def _read_ready(self) -> None:
        while not self.closing:
            try:
                data, ancillary, _, _ = self.sock.recvmsg(_READ_BYTES, _CMSG_SPACE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._finish()
                return
            if not data:
                self._finish()
                return
            now = time.perf_counter_ns()
            stamp = now
            for level, kind, raw in ancillary:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(raw) >= 16:
                    sec, nsec = _TIMESPEC.unpack_from(raw)
                    # Never later than the read that delivered it (the clocks are not read atomically).
                    stamp = min(sec * 1_000_000_000 + nsec - _current_offset_ns(now), now)
                    self.kernel_stamps = True
            self.protocol.data_received_at(data, stamp)
            if len(data) < _READ_BYTES:
                return  # drained (bytes that come now wake the loop again): spare a read that would fail

    def write(self, data: bytes) -> None:
        if self.closing and not self.wbuf:
            return
        if self.wbuf:
            self.wbuf += data
            return
        try:
            sent = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._finish()
            return
        if sent < len(data):
            self.wbuf = data[sent:]
            self.loop.add_writer(self.fd, self._write_ready)

    def _write_ready(self) -> None:
        try:
            sent = self.sock.send(self.wbuf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._finish()
            return
        self.wbuf = self.wbuf[sent:]
        if not self.wbuf:
            self.loop.remove_writer(self.fd)
            if self.closing:
                self._finish()

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True
        if not self.wbuf:
            self._finish()

    def _finish(self) -> None:
        if self.fd < 0:
            return
        self.closing = True
        self.loop.remove_reader(self.fd)
        self.loop.remove_writer(self.fd)
        self.sock.close()
        self.fd = -1
        self.protocol.connection_lost(None)
