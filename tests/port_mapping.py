"""A port mapping on loopback, as `docker run -p`, `kubectl port-forward`, `ssh -L` or a
TCP proxy make one: a listener on a port of its own that passes the bytes of each
connection to the service and back, unchanged. A client addresses the mapping, so the
Host it sends carries the mapping's port, not the one the service listens on."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from support import LOOPBACK

CHUNK_BYTES = 1 << 16
MAX_CHUNKS = 100_000  # per direction of a connection: far more than a test sends
CONNECTION_S = 30.0  # a connection through the mapping lives at most this long
CLOSE_S = 5.0


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        for _ in range(MAX_CHUNKS):
            data = await reader.read(CHUNK_BYTES)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def port_mapping(port: int, host: str = LOOPBACK) -> AsyncIterator[int]:
    """Map a free loopback port to `host:port` while the block runs; yields the
    mapping's port. Every connection through it is closed at the end."""
    writers: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        up_reader, up_writer = await asyncio.open_connection(host, port)
        writers.append(up_writer)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CONNECTION_S):
                await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(accept, LOOPBACK, 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()
        for writer in writers:
            writer.close()
        async with asyncio.timeout(CLOSE_S):
            await server.wait_closed()
