"""``neuron-prof``: one module per command (record, report, compare, export, import, inspect,
view, port-check, trigger, demo); a command never imports another, and nothing imports a command
but the entry point ``main``. The top layer: a command parses its flags and calls the library.
``demo`` alone trains on the emulated device (``testing``) and runs an example.

May import: viewer, export, reports, analysis, importers, capture, collectors, backends, recording, store, testing, examples.
"""
from __future__ import annotations

import argparse
import sys
from typing import NoReturn, Sequence

from neuron_prof.errors import NeuronProfError


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error: what was wrong and where to read the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    from neuron_prof.cli import compare, demo, export, importer, inspect, port_check, record, report, trigger, view
    parser = _Parser(prog="neuron-prof", description="Profile PyTorch training: ops, steps, sync points.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    for module in (record, report, compare, export, importer, inspect, view, port_check, trigger, demo):
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except NeuronProfError as exc:
        print(f"neuron-prof: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
