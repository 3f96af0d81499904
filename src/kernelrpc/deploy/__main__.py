"""``python -m kernelrpc.deploy``: emulated boards, root file systems and the device bundle.

  emulate --arch ARCH [--cpu CPU] [--bundle PYZ] SERVER-FLAGS...
      start a device server on an emulated board (qemu-user); every other flag goes to
      ``python -m kernelrpc.server`` (--tracker HOST:PORT --key KEY, --port, --host, ...)
  rootfs ARCH...      prepare (or find in the cache) the root file systems, print their paths
  bundle --out FILE   write the device server zipapp (python3 FILE --tracker HOST:PORT --key KEY)

Architectures: aarch64 (Debian 12 arm64), armv7 (Debian 12 armhf), riscv64 (Debian 13).
Roots are cached in $KERNELRPC_ROOTFS_CACHE (default ~/.cache/kernelrpc/rootfs).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

from .. import cli
from .bundle import BundleError, build_bundle
from .rootfs import ARCHES, RootfsError, prepare


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m kernelrpc.deploy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log-level", default="INFO")
    commands = parser.add_subparsers(dest="command", required=True)
    emulate = commands.add_parser("emulate", help="run a device server on an emulated board",
                                  description="Run a device server under qemu-user; flags not listed "
                                              "here are passed to python -m kernelrpc.server.")
    emulate.add_argument("--arch", required=True, choices=sorted(ARCHES))
    emulate.add_argument("--cpu", default=None,
                         help="qemu -cpu model (default: aarch64 cortex-a72, armv7 cortex-a7; "
                              "cortex-r5f is an armv7 without NEON)")
    emulate.add_argument("--bundle", default=None, metavar="PYZ",
                         help="run this device bundle instead of kernelrpc's source")
    rootfs = commands.add_parser("rootfs", help="prepare root file systems and print their paths")
    rootfs.add_argument("arch", nargs="+", choices=sorted(ARCHES))
    rootfs.add_argument("--refresh", action="store_true", help="download and unpack again")
    bundle = commands.add_parser("bundle", help="write the device server zipapp")
    bundle.add_argument("--out", default="kernelrpc-device.pyz")
    return parser


def main(argv=None) -> int:
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if rest and args.command != "emulate":
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    try:
        if args.command == "emulate":
            from .emulate import exec_server

            if "--log-level" not in rest:
                rest += ["--log-level", args.log_level]
            exec_server(args.arch, rest, cpu=args.cpu, bundle=args.bundle)
        elif args.command == "rootfs":
            for name in args.arch:
                print(prepare(name, refresh=args.refresh).path)
        else:
            out = build_bundle(args.out)
            print(f"{out} ({os.path.getsize(out) // 1024} KB): python3 {out.name} --tracker HOST:PORT --key KEY")
            cli.report_output("kernelrpc.deploy bundle", f"wrote the device bundle to {out.resolve()}",
                              "kernelrpc.deploy", ["bundle", "--out", str(out.resolve())])
    except (RootfsError, BundleError, FileNotFoundError, OSError) as exc:
        print(f"kernelrpc.deploy {args.command}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(cli.run_main("kernelrpc.deploy", main))
