"""python3 -m kvrail: a few verbs of the `kvrail` CLI (tools/kvrail), over the Python client.

  python3 -m kvrail [--socket PATH] [--json] status
  python3 -m kvrail [--socket PATH] [--json] regions
  python3 -m kvrail [--socket PATH] [--json] transfers [--state STATE ...] [--limit N]

Exit codes: 0 success, 1 a kvrail error (printed as CODE: message), 2 usage.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional, Sequence

from google.protobuf import json_format

from kvrail.client import connect
from kvrail.errors import KvrailError
from kvrail.proto import transfer_pb2


def _table(rows: List[Sequence[str]]) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _state_name(state: int) -> str:
    return transfer_pb2.TransferState.Name(state).replace("TRANSFER_STATE_", "")


def _status(client, as_json: bool) -> str:
    stats = client.stats()
    if as_json:
        return json.dumps(json_format.MessageToDict(stats, preserving_proto_field_name=True))
    return _table([["version", stats.version], ["node", stats.node_id],
                   ["regions", stats.regions],
                   ["transfers", f"{stats.transfers_submitted} submitted, "
                                 f"{stats.transfers_succeeded} succeeded, "
                                 f"{stats.transfers_failed} failed, "
                                 f"{stats.transfers_cancelled} cancelled, "
                                 f"{stats.transfers_active} active"],
                   ["bytes moved", stats.bytes_moved]])


def _regions(client, as_json: bool) -> str:
    regions = client.list_regions()
    if as_json:
        return json.dumps([json_format.MessageToDict(r, preserving_proto_field_name=True)
                           for r in regions])
    rows = [["ID", "NAME", "KIND", "BYTES", "LAYOUT", "WRITABLE", "SESSION"]]
    for r in regions:
        rows.append([r.region_id, r.spec.name, "cuda" if r.spec.memory_kind == 2 else "host",
                     r.spec.size_bytes, r.spec.WhichOneof("layout") or "-",
                     "yes" if r.spec.writable else "no", r.session_id])
    return _table(rows)


def _transfers(client, as_json: bool, states: Sequence[str], limit: int) -> str:
    wanted = [transfer_pb2.TransferState.Value("TRANSFER_STATE_" + s.upper()) for s in states]
    transfers = client.list_transfers(wanted, limit)
    if as_json:
        return json.dumps([json_format.MessageToDict(t, preserving_proto_field_name=True)
                           for t in transfers])
    rows = [["ID", "STATE", "BYTES", "PATH", "ENGINE", "LABEL", "ERROR"]]
    for t in transfers:
        rows.append([t.transfer_id, _state_name(t.state), f"{t.bytes_done}/{t.bytes_total}",
                     transfer_pb2.Path.Name(t.path).replace("PATH_", "").lower(), t.engine or "-",
                     t.spec.label or "-", t.error_message or "-"])
    return _table(rows)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m kvrail", description=__doc__.splitlines()[0])
    parser.add_argument("--socket", default=None,
                        help="daemon socket or host:port (default $KVRAIL_SOCKET, else "
                             "/run/kvrail/kvrail.sock)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    verbs = parser.add_subparsers(dest="verb", required=True)
    verbs.add_parser("status", help="daemon summary")
    verbs.add_parser("regions", help="registered regions")
    transfers = verbs.add_parser("transfers", help="recent transfers, newest first")
    transfers.add_argument("--state", action="append", default=[],
                           choices=["queued", "running", "succeeded", "failed", "cancelled"])
    transfers.add_argument("--limit", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        with connect(args.socket) as client:
            if args.verb == "status":
                out = _status(client, args.json)
            elif args.verb == "regions":
                out = _regions(client, args.json)
            else:
                out = _transfers(client, args.json, args.state, args.limit)
    except KvrailError as e:
        print(f"{e.code.name}: {e.message}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
