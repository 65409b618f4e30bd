"""The emulated cluster's listening sockets hand out connections without Nagle's algorithm.

uvicorn writes an answer's headers and its body in two writes. On a connection that keeps Nagle's algorithm the
body waits for the client's delayed ACK of the headers, which made most answers of the emulated cluster late
by that wall time, and ``hexflow bench --live`` slower than the simulator it is compared with
(docs/benchmarks.md, "Live beside the simulator").
"""

from __future__ import annotations

import asyncio
import socket

from workers.cluster import bind_sockets


async def test_connections_accepted_by_a_cluster_socket_have_tcp_nodelay() -> None:
    (sock,) = bind_sockets("127.0.0.1", 0, 1)
    accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    class Server(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            conn = transport.get_extra_info("socket")
            accepted.set_result(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    # As uvicorn serves a socket it is given (``serve_cluster``): the loop accepts on it.
    server = await asyncio.get_running_loop().create_server(Server, sock=sock)
    try:
        port = sock.getsockname()[1]
        transport, _ = await asyncio.get_running_loop().create_connection(asyncio.Protocol, "127.0.0.1", port)
        try:
            assert await asyncio.wait_for(accepted, 10.0) != 0
        finally:
            transport.close()
    finally:
        server.close()
        await server.wait_closed()


def test_cluster_sockets_are_tcp_sockets_with_nodelay() -> None:
    sockets = bind_sockets("127.0.0.1", 0, 2)
    try:
        for s in sockets:
            assert s.proto == socket.IPPROTO_TCP  # what asyncio checks before it disables Nagle on accepted sockets
            assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        for s in sockets:
            s.close()
