"""Count Switchboard's conversations by category, resuming where it stopped.

It reads the public event stream as an event reader (`switchboard readers add`): a durable
consumer on the events stream whose NATS user may only fetch from it and acknowledge. It
decodes `message.logged` and `exchange.categorised` with the schemas in proto/ and keeps its
counts in a JSON file. The file also records the stream sequence of the last event counted,
written before that event is acknowledged: after a crash the server hands the unacknowledged
events out again, and those the file already counted are acknowledged without counting them
twice. So a restart neither misses nor repeats an event.

    pip install -r examples/analytics/requirements.txt
    switchboard readers add bi --event message.logged --event exchange.categorised --json > bi.json
    python examples/analytics/follow.py --reader bi.json --state counts.json

Options: --idle-exit S stops after S seconds with nothing new (default: follow forever);
--stop-after N stops after N events (for trying a restart); --record-seqs keeps every counted
sequence in the state file (tests/tests/analytics_reader.rs checks a run by it).
"""

import argparse
import asyncio
import json
import os
import pathlib
import sys
import tempfile

import nats
from nats.errors import TimeoutError as NatsTimeout

HERE = pathlib.Path(__file__).resolve().parent
PROTO = HERE.parent.parent / "proto"


def load_schemas():
    """Compile proto/ to Python modules (grpc_tools' protoc) once per run; import them."""
    from grpc_tools import protoc
    import grpc_tools

    out = pathlib.Path(tempfile.mkdtemp(prefix="sb-proto-"))
    include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    files = sorted(str(p.relative_to(PROTO)) for p in PROTO.rglob("*.proto"))
    code = protoc.main(
        ["protoc", f"-I{PROTO}", f"-I{include}", f"--python_out={out}", *files]
    )
    if code != 0:
        sys.exit(f"protoc failed on {PROTO} ({code})")
    sys.path.insert(0, str(out))
    from switchboard.v1 import events_pb2

    return events_pb2


class Counts:
    """What the reader has counted, and the stream sequence it has counted through."""

    def __init__(self, path):
        self.path = pathlib.Path(path)
        data = json.loads(self.path.read_text()) if self.path.exists() else {}
        self.last_seq = data.get("last_seq", 0)
        self.events = data.get("events", 0)
        self.labels = data.get("labels", {})
        self.messages = data.get("messages", {})
        self.seqs = data.get("seqs", [])

    def save(self):
        """Atomically: a crash leaves the old file or the new one."""
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "last_seq": self.last_seq,
                    "events": self.events,
                    "labels": self.labels,
                    "messages": self.messages,
                    "seqs": self.seqs,
                },
                indent=1,
                sort_keys=True,
            )
        )
        os.replace(tmp, self.path)


def count(counts, pb, event, data):
    if event.endswith("exchange.categorised"):
        e = pb.ExchangeCategorised()
        e.ParseFromString(data)
        counts.labels[e.label] = counts.labels.get(e.label, 0) + 1
    elif event.endswith("message.logged"):
        e = pb.MessageLogged()
        e.ParseFromString(data)
        key = f"{e.direction}:{e.channel}"
        counts.messages[key] = counts.messages.get(key, 0) + 1


async def follow(args):
    reader = json.loads(pathlib.Path(args.reader).read_text())
    password = os.environ.get("SB_READER_PASSWORD") or reader["password"]
    pb = load_schemas()
    counts = Counts(args.state)
    nc = await nats.connect(
        reader["nats_url"].split(","),
        user=reader["user"],
        password=password,
        # The reader may subscribe to its own reply prefix only.
        inbox_prefix=reader["inbox_prefix"],
        max_reconnect_attempts=-1,
    )
    # The reader lives in a NATS account of its own, which imports its consumer's API under
    # this prefix (readers made before it had none: the plain $JS.API fetch works too).
    js = nc.jetstream(prefix=reader.get("api_prefix", "$JS.API"))
    sub = await js.pull_subscribe_bind(reader["consumer"], stream=reader["stream"])
    idle = 0.0
    taken = 0
    while True:
        if args.stop_after is not None and taken >= args.stop_after:
            break
        want = 32 if args.stop_after is None else min(32, args.stop_after - taken)
        try:
            msgs = await sub.fetch(want, timeout=1.0)
        # nats-py raises either, depending on where the wait ran out.
        except (NatsTimeout, asyncio.TimeoutError):
            idle += 1.0
            if args.idle_exit is not None and idle >= args.idle_exit:
                break
            continue
        idle = 0.0
        for msg in msgs:
            seq = msg.metadata.sequence.stream
            if seq > counts.last_seq:
                count(counts, pb, msg.subject, msg.data)
                counts.last_seq = seq
                counts.events += 1
                if args.record_seqs:
                    counts.seqs.append(seq)
                counts.save()
            # Counted (now or before a crash): acknowledged only after the state is on disk.
            await msg.ack_sync()
            taken += 1
    await nc.drain()
    print(
        json.dumps(
            {
                "events": counts.events,
                "labels": counts.labels,
                "last_seq": counts.last_seq,
            },
            sort_keys=True,
        )
    )


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reader", required=True, help="`switchboard readers add --json` output")
    p.add_argument("--state", required=True, help="the counts file (made if missing)")
    p.add_argument("--idle-exit", type=float, default=None)
    p.add_argument("--stop-after", type=int, default=None)
    p.add_argument(
        "--record-seqs",
        action="store_true",
        help="also keep every counted stream sequence in the state (to check a run by)",
    )
    asyncio.run(follow(p.parse_args()))


if __name__ == "__main__":
    main()
