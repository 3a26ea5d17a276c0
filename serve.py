"""Entry point `testbed-serve` (or `python serve.py`): `python run.py mode=serve`, with a few flags for the server keys.

testbed-serve --port 8000 --api-key KEY model=tiny
"""

from __future__ import annotations

import sys

FLAGS = {
    "--host": "server.host",
    "--port": "server.port",
    "--api-key": "server.api_key",
    "--max-waiting": "server.max_waiting",
}


def cli(argv: list[str] | None = None) -> None:
    """`testbed-serve [--host H] [--port P] [--api-key K] [--max-waiting N] [hydra overrides...]`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides, i = ["mode=serve"], 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in FLAGS:
            if not eq:
                if i + 1 >= len(argv):
                    raise SystemExit(f"{name} needs a value")
                value, i = argv[i + 1], i + 1
            overrides.append(f"{FLAGS[name]}={value}")
        elif arg in ("-h", "--help"):
            print(cli.__doc__)
            print("Hydra overrides as for run.py, e.g. model=tiny cache.num_blocks=4096 server.graceful_timeout_s=5")
            return
        else:
            overrides.append(arg)
        i += 1
    sys.argv = [sys.argv[0], *overrides]
    # the same as `python run.py ...`
    import runpy

    import run

    runpy.run_path(run.__file__, run_name="__main__")


if __name__ == "__main__":
    cli()
