"""uvicorn's HTTP/1.1 protocol (h11) with a timeout on reading the request head.

uvicorn times out idle keep-alive connections but not a client that opens a connection and sends its
request line and headers slowly or never (slowloris): such a connection would be held for ever. Here a
timer runs from the connection's start, and from the first byte of each later request, until the whole
head has arrived; when it fires the connection gets 408 and is closed. (Body reads are bounded by
body_limits.py.)"""

from __future__ import annotations

import asyncio
from typing import cast

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

TIMEOUT_RESPONSE = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class HeaderTimeoutH11Protocol(H11Protocol):
    header_timeout_s: float = 20.0  # set per server by `with_header_timeout`
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._head_timer = None
        self._arm()

    def _arm(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.transport.is_closing():
            self._disarm()
        elif self.conn.their_state is h11.IDLE:  # no complete request head yet
            self._arm()
        else:
            self._disarm()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.logger.info("closing a connection that sent no complete request head in %gs", self.header_timeout_s)
            self.transport.write(TIMEOUT_RESPONSE)
            self.transport.close()


def with_header_timeout(header_timeout_s: float) -> type[HeaderTimeoutH11Protocol]:
    """The protocol class for uvicorn.Config(http=...), with this server's timeout."""
    subclass = type("HeaderTimeoutH11Protocol", (HeaderTimeoutH11Protocol,), {"header_timeout_s": header_timeout_s})
    return cast(type[HeaderTimeoutH11Protocol], subclass)
