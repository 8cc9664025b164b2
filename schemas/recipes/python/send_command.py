"""Start a workflow or raise an event on a Turnstile engine, knowing only schemas/Command.avsc
(fastavro and confluent-kafka; no engine code):

    python send_command.py start|raise BOOTSTRAP TOPIC INSTANCE_ID NAME JSON

NAME is the workflow (start) or the event (raise); JSON its input. The schema is read from
$COMMAND_AVSC (default schemas/Command.avsc).
"""

import io
import json
import os
import sys
import uuid

import fastavro
from confluent_kafka import Producer
from fastavro.schema import fingerprint, to_parsing_canonical_form

BODIES = {"start": "io.turnstile.command.StartWorkflow", "raise": "io.turnstile.command.RaiseEvent"}


def main(kind: str, bootstrap: str, topic: str, instance_id: str, name: str, data: str) -> None:
    with open(os.environ.get("COMMAND_AVSC", "schemas/Command.avsc"), encoding="utf-8") as f:
        schema = fastavro.parse_schema(json.load(f))
    # The single-object encoding: C3 01, the schema's CRC-64-AVRO fingerprint, the record.
    # (fastavro prints the fingerprint's bytes in the order the header carries them.)
    header = fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO")
    out = io.BytesIO(b"\xc3\x01" + bytes.fromhex(header))
    out.seek(0, io.SEEK_END)
    # A fresh request id per command: reuse it only to retry the same command.
    request_id = uuid.uuid4().hex
    # StartWorkflow and RaiseEvent both have name, input and request_id; unset fields take
    # their defaults. A union value is (branch name, value).
    body = {"name": name, "input": {"data": data.encode()}, "request_id": request_id}
    record = {"instance_id": instance_id, "body": (BODIES[kind], body)}
    fastavro.schemaless_writer(out, schema, record)

    # Key: the instance id; partitioner: murmur2 like Java's (librdkafka's default differs).
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    sent = []
    producer.produce(
        topic, out.getvalue(), instance_id.encode(), on_delivery=lambda *r: sent.append(r)
    )
    producer.flush(30)
    if not sent or sent[0][0] is not None:
        sys.exit(f"send_command: not delivered: {sent[0][0] if sent else 'timed out'}")
    message = sent[0][1]
    print(
        f"{BODIES[kind].rsplit('.', 1)[1]} {instance_id} request_id={request_id} "
        f"partition={message.partition()} offset={message.offset()}"
    )


if __name__ == "__main__":
    if len(sys.argv) != 7 or sys.argv[1] not in BODIES:
        sys.exit("usage: send_command.py start|raise BOOTSTRAP TOPIC INSTANCE_ID NAME JSON")
    main(*sys.argv[1:])
