"""``neuron-prof view RUN``: the browser viewer (a Streamlit server on 127.0.0.1)."""
from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("view", help="open a run in the browser viewer",
                       description="Starts the viewer (Streamlit) on 127.0.0.1, prints its address and opens "
                                   "the browser. The run is read on the server: no upload, no size limit.")
    p.add_argument("run", type=Path, help="run directory")
    p.add_argument("--compare", "--diff", dest="diff", type=Path, metavar="RUN2",
                   help="a second run for the Compare page (--diff: the same)")
    p.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; anything else exposes your run to the network)")
    p.add_argument("--no-browser", action="store_true", help="print the address, don't open a browser")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from neuron_prof.viewer.server import serve
    return serve(args.run, port=args.port, host=args.host, diff=args.diff, browser=not args.no_browser)
