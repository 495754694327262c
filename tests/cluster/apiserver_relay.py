"""A TCP relay from the Nodes' network to the apiserver on loopback, so that pods reach the
apiserver as pods of a real cluster do: through the ``kubernetes`` Service (ClusterIP 10.0.0.1,
``KUBERNETES_SERVICE_HOST`` in every pod), whose endpoint is this relay's address.

The apiserver listens on 127.0.0.1 only (nothing of the control plane is exposed beyond the
machine) and a Service's endpoint may not be a loopback address: the relay is the one door,
bound to an address on the Nodes' bridge. It copies bytes; TLS stays end to end (the
apiserver's certificate names 10.0.0.1 and ``kubernetes.default.svc``).

    python -m tests.cluster.apiserver_relay LISTEN_HOST LISTEN_PORT TARGET_HOST TARGET_PORT

Test code: nothing here ships in the wheel.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def serve(listen: tuple[str, int], target: tuple[str, int]) -> None:
    async def relay(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*target)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(_pipe(client_reader, upstream_writer), _pipe(upstream_reader, client_writer))

    server = await asyncio.start_server(relay, *listen, reuse_address=True)
    print(f"relaying {listen[0]}:{listen[1]} -> {target[0]}:{target[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__.strip().splitlines()[-3].strip(), file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve((argv[0], int(argv[1])), (argv[2], int(argv[3]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
