"""`python -m hf2triton_openai --triton HOST:PORT [--host H] [--port P] [--keys-file F]
[-- TRITONSERVER ARGS...]`: the API on uvicorn.

Keys are taken as sha256 hashes (hex), one per line in `--keys-file` or comma-separated in
$HF2TRITON_OPENAI_KEY_SHA256: the keys themselves never reach this process. With a command after
`--` (the serving image's entrypoint), it runs that tritonserver as its child, serves the API
beside it and ends with it: the container stops when Triton stops, and a stop signal stops both.
$HF2TRITON_OPENAI=off runs only the command; $HF2TRITON_OPENAI_ARGS adds arguments."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

KEYS_ENV = "HF2TRITON_OPENAI_KEY_SHA256"
SWITCH_ENV = "HF2TRITON_OPENAI"
ARGS_ENV = "HF2TRITON_OPENAI_ARGS"  # more arguments (the serving image's limits)
HASH = re.compile(r"^[0-9a-f]{64}$")


def key_hashes(keys_file: Path | None) -> tuple[str, ...]:
    found = [h.strip().lower() for h in os.environ.get(KEYS_ENV, "").split(",") if h.strip()]
    if keys_file is not None:
        found += [
            line.strip().lower() for line in keys_file.read_text().splitlines() if line.strip()
        ]
    bad = [h for h in found if not HASH.match(h)]
    if bad:
        sys.exit(
            f"hf2triton_openai: {len(bad)} key hash(es) are not sha256 hex digests: give "
            f"hashes, never the keys (sha256sum of each key)"
        )
    return tuple(found)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    command: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, command = argv[:at], argv[at + 1 :]
    argv = [*argv, *shlex.split(os.environ.get(ARGS_ENV, ""))]
    parser = argparse.ArgumentParser(prog="hf2triton_openai", description=__doc__.splitlines()[0])
    parser.add_argument("--triton", required=True, help="Triton's gRPC endpoint, host:port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--keys-file", type=Path, help="sha256 hashes of the accepted keys")
    parser.add_argument("--max-body-mb", type=float, default=4.0)
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument(
        "--remote-image-host",
        action="append",
        default=[],
        help="a host whose image URLs the API may fetch (repeat for more; default: none)",
    )
    return parser.parse_args(argv), command


async def serve(args: argparse.Namespace, command: list[str]) -> int:
    import uvicorn

    from .app import create_app

    app = create_app(
        args.triton,
        key_hashes(args.keys_file),
        int(args.max_body_mb * (1 << 20)),
        args.timeout_s,
        tuple(args.remote_image_host),
    )
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=30,
        lifespan="on",
    )
    server = uvicorn.Server(config)
    if not command:
        await server.serve()
        return 0
    child = subprocess.Popen(command)
    loop = asyncio.get_running_loop()

    async def follow() -> None:  # Triton ends: the API ends with it
        await loop.run_in_executor(None, child.wait)
        server.should_exit = True

    watcher = asyncio.create_task(follow())
    try:
        await server.serve()  # until a stop signal, or Triton's end
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(loop.run_in_executor(None, child.wait), 60)
            except TimeoutError:
                child.kill()
        await watcher
    return child.returncode or 0


def main(argv: list[str] | None = None) -> None:
    args, command = parse(list(sys.argv[1:] if argv is None else argv))
    if command and os.environ.get(SWITCH_ENV, "on").lower() in ("off", "0", "false", "no"):
        os.execvp(command[0], command)
    sys.exit(asyncio.run(serve(args, command)))


if __name__ == "__main__":
    main()
