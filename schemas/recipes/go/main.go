// Command send-command starts a workflow or raises an event on a Turnstile engine, knowing
// only schemas/Command.avsc:
//
//	send-command start|raise BOOTSTRAP TOPIC INSTANCE_ID NAME JSON
//
// NAME is the workflow (start) or the event (raise); JSON its input. The schema is read
// from $COMMAND_AVSC (default schemas/Command.avsc).
package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"strings"

	"github.com/twmb/avro"
	"github.com/twmb/franz-go/pkg/kgo"
)

var bodies = map[string]string{
	"start": "io.turnstile.command.StartWorkflow",
	"raise": "io.turnstile.command.RaiseEvent",
}

func main() {
	if len(os.Args) != 7 || bodies[os.Args[1]] == "" {
		fmt.Fprintln(os.Stderr, "usage: send-command start|raise BOOTSTRAP TOPIC INSTANCE_ID NAME JSON")
		os.Exit(2)
	}
	body, bootstrap, topic, instanceID, name, input := bodies[os.Args[1]], os.Args[2], os.Args[3], os.Args[4], os.Args[5], os.Args[6]
	if err := send(body, bootstrap, topic, instanceID, name, input); err != nil {
		fmt.Fprintln(os.Stderr, "send-command:", err)
		os.Exit(1)
	}
}

func send(body, bootstrap, topic, instanceID, name, input string) error {
	path := os.Getenv("COMMAND_AVSC")
	if path == "" {
		path = "schemas/Command.avsc"
	}
	schema, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	command, err := avro.Parse(string(schema))
	if err != nil {
		return err
	}
	requestID := rand.Text() // a fresh request id per command: reuse it only to retry the same one
	// A union value is a map from the branch's full name; fields left out take their defaults.
	// StartWorkflow and RaiseEvent both have name, input and request_id.
	record := map[string]any{
		"instance_id": instanceID,
		"body": map[string]any{body: map[string]any{
			"name":       name,
			"input":      map[string]any{"io.turnstile.Payload": map[string]any{"data": []byte(input)}},
			"request_id": requestID,
		}},
	}
	// The single-object encoding: C3 01, the schema's CRC-64-AVRO fingerprint, the record.
	value, err := command.AppendSingleObject(nil, record)
	if err != nil {
		return err
	}
	client, err := kgo.NewClient(
		kgo.SeedBrokers(strings.Split(bootstrap, ",")...),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)), // nil: Kafka's murmur2, like Java
	)
	if err != nil {
		return err
	}
	defer client.Close()
	sent, err := client.ProduceSync(context.Background(),
		&kgo.Record{Topic: topic, Key: []byte(instanceID), Value: value}).First()
	if err != nil {
		return err
	}
	fmt.Printf("%s %s request_id=%s partition=%d offset=%d\n",
		body[strings.LastIndex(body, ".")+1:], instanceID, requestID, sent.Partition, sent.Offset)
	return nil
}
