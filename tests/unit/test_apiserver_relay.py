"""The relay that carries pods' connections to the loopback apiserver (tests/cluster/
apiserver_relay.py): bytes both ways, unchanged, for several connections at once."""

from __future__ import annotations

import asyncio
import contextlib
import socket

from tests.cluster.apiserver_relay import serve


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def _exchange(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(payload)
    await writer.drain()
    writer.write_eof()
    data = await reader.read()
    writer.close()
    return data


async def _run() -> list[bytes]:
    async def upper(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write((await reader.read()).upper())
        await writer.drain()
        writer.close()

    target = await asyncio.start_server(upper, "127.0.0.1", 0)
    target_port = target.sockets[0].getsockname()[1]
    relay_port = _free_port()
    relay = asyncio.create_task(serve(("127.0.0.1", relay_port), ("127.0.0.1", target_port)))
    try:
        for _ in range(100):  # until it listens
            with contextlib.suppress(OSError):
                _, probe = await asyncio.open_connection("127.0.0.1", relay_port)
                probe.close()
                break
            await asyncio.sleep(0.02)
        big = b"x" * 300_000
        return await asyncio.wait_for(asyncio.gather(_exchange(relay_port, b"hello"), _exchange(relay_port, big)), 10)
    finally:
        relay.cancel()
        target.close()


def test_bytes_cross_the_relay_both_ways_unchanged() -> None:
    small, big = asyncio.run(_run())
    assert small == b"HELLO"
    assert big == b"X" * 300_000
