#!/usr/bin/env python3
"""A transparent TCP relay that delays what it carries (this
kernel has no netem). It runs in one host's network namespace behind an
iptables REDIRECT of that host's TCP connections to a peer (netns.c,
hx_net_delay): each connection it accepts goes on to its original
destination (SO_ORIGINAL_DST), every byte held --delay-ms in each
direction, at most --window bytes held per direction (beyond that it
stops reading, as a full socket buffer would). Its own connections carry
SO_MARK --mark, which the REDIRECT rule skips. It prints
"listening on 0.0.0.0:PORT" once ready and runs until killed.
"""
import argparse
import asyncio
import socket
import struct
import sys
import time

SO_ORIGINAL_DST = 80
SO_MARK = 36
READ = 65536


async def pump(reader, writer, delay, window):
    """Copies reader to writer, each read released `delay` s after it
    arrived; then half-closes the writer."""
    queue = asyncio.Queue(maxsize=max(1, window // READ))

    async def take():
        while True:
            data = await reader.read(READ)
            await queue.put((time.monotonic() + delay, data))
            if not data:
                return

    taker = asyncio.ensure_future(take())
    try:
        while True:
            due, data = await queue.get()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        taker.cancel()


async def relay(args, creader, cwriter):
    sock = cwriter.get_extra_info("socket")
    try:
        dst = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
        port, raw = struct.unpack("!2xH4s8x", dst)
        out = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        out.setsockopt(socket.SOL_SOCKET, SO_MARK, args.mark)
        out.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        out.setblocking(False)
        await asyncio.get_running_loop().sock_connect(
            out, (socket.inet_ntoa(raw), port))
        sreader, swriter = await asyncio.open_connection(sock=out)
    except OSError:
        cwriter.close()
        return
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    delay = args.delay_ms / 1000.0
    await asyncio.gather(pump(creader, swriter, delay, args.window),
                         pump(sreader, cwriter, delay, args.window),
                         return_exceptions=True)
    for w in (cwriter, swriter):
        w.close()


async def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--delay-ms", type=float, required=True)
    p.add_argument("--window", type=int, default=4 << 20)
    p.add_argument("--mark", type=lambda s: int(s, 0), default=0x66)
    args = p.parse_args()
    server = await asyncio.start_server(
        lambda r, w: relay(args, r, w), "0.0.0.0", 0)
    port = server.sockets[0].getsockname()[1]
    print("listening on 0.0.0.0:%d" % port, flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
