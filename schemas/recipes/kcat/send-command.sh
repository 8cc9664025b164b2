#!/usr/bin/env bash
# Start a workflow or raise an event on a Turnstile engine with kcat, knowing only
# schemas/Command.avsc:
#
#   send-command.sh start|raise BOOTSTRAP TOPIC INSTANCE_ID NAME JSON
#
# NAME is the workflow (start) or the event (raise); JSON its input (ASCII; write other
# characters as \u escapes). Needs kcat, java and Apache Avro's avro-tools jar
# (org.apache.avro:avro-tools on Maven Central) at $AVRO_TOOLS; the schema is read from
# $COMMAND_AVSC (default schemas/Command.avsc).
set -euo pipefail
if [ $# -ne 6 ] || { [ "$1" != start ] && [ "$1" != raise ]; }; then
    echo "usage: send-command.sh start|raise BOOTSTRAP TOPIC INSTANCE_ID NAME JSON" >&2
    exit 2
fi
kind=$1 bootstrap=$2 topic=$3 instance_id=$4 name=$5
schema=${COMMAND_AVSC:-schemas/Command.avsc}
avro_tools=${AVRO_TOOLS:-avro-tools.jar}
request_id=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')  # fresh per command; reuse to retry
input=$(printf '%s' "$6" | tr '\n\r\t' '   ' | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g')

# The record in Avro's JSON encoding, which names union branches and lists every field.
payload="{\"io.turnstile.Payload\": {\"data\": \"$input\", \"encoding\": \"json\"}}"
if [ "$kind" = start ]; then
    body="{\"io.turnstile.command.StartWorkflow\": {\"name\": \"$name\", \"input\": $payload,
        \"version\": \"\", \"reuse_policy\": \"ERROR_IF_RUNNING\", \"request_id\": \"$request_id\",
        \"scheduled_start_ms\": null, \"tags\": {}, \"parent_instance_id\": null,
        \"parent_generation\": null, \"parent_task_id\": null, \"concurrency_key\": \"\",
        \"parent_run_id\": \"\", \"execution_timeout_ms\": 0, \"run_timeout_ms\": 0}}"
else
    body="{\"io.turnstile.command.RaiseEvent\": {\"name\": \"$name\", \"input\": $payload,
        \"request_id\": \"$request_id\"}}"
fi

# The single-object encoding: C3 01, the schema's CRC-64-AVRO fingerprint, the record.
value=$(mktemp)
trap 'rm -f "$value"' EXIT
fingerprint=$(java -jar "$avro_tools" fingerprint "$schema" | cut -d' ' -f1)
printf "\\xc3\\x01$(printf '%s' "$fingerprint" | sed 's/../\\x&/g')" > "$value"
printf '{"instance_id": "%s", "body": %s}' "$instance_id" "$body" |
    java -jar "$avro_tools" jsontofrag --schema-file "$schema" - >> "$value"

# Key: the instance id; partitioner: murmur2, as the Java client's (librdkafka's default differs).
kcat -P -b "$bootstrap" -t "$topic" -k "$instance_id" -X partitioner=murmur2_random "$value"
echo "$kind $instance_id request_id=$request_id"
