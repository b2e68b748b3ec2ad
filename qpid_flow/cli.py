"""The ``qpid-flow`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from qpid_flow import __version__
from qpid_flow.config import ConfigError, load_config

__all__ = ["main"]


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = sub.add_parser(
        "serve",
        help="run the router",
        description="Run qpid-flow: standalone (in-memory destinations) unless --broker is given.",
    )
    serve.add_argument("--config", metavar="PATH", help="TOML configuration file (qpid-flow.toml)")
    serve.add_argument("--listen", metavar="HOST:PORT", help="where clients connect (default 127.0.0.1:5673)")
    serve.add_argument(
        "--broker",
        metavar="URL",
        help="the broker to sit in front of, e.g. amqp://guest:guest@127.0.0.1:5672 (default: standalone)",
    )
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    serve.add_argument("--log-format", choices=["auto", "json", "console"])
    serve.add_argument(
        "--disable-plugin",
        action="append",
        default=None,
        metavar="NAME",
        help="do not load this plugin (repeatable)",
    )
    serve.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    overrides = {
        "listen": args.listen,
        "broker": args.broker,
        "log_level": args.log_level,
        "log_format": args.log_format,
        "disable_plugins": args.disable_plugin,
    }
    try:
        config = load_config(args.config, overrides)
    except ConfigError as exc:
        print(f"qpid-flow: configuration error: {exc}", file=sys.stderr)
        return 2
    from qpid_flow.logs import configure_logging
    from qpid_flow.server import Server

    configure_logging(config.log_level, config.log_format)
    try:
        server = Server(config)
    except ConfigError as exc:  # a plugin refused its settings
        print(f"qpid-flow: configuration error: {exc}", file=sys.stderr)
        return 2
    try:
        server.run()
    except OSError as exc:
        print(f"qpid-flow: cannot listen on {config.listen}: {exc}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qpid-flow", description="AMQP 1.0 flow-control and message-group router")
    parser.add_argument("--version", action="version", version=f"qpid-flow {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))
