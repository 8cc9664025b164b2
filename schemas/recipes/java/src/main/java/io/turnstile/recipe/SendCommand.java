package io.turnstile.recipe;

import java.io.File;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.UUID;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.generic.GenericRecordBuilder;
import org.apache.avro.message.BinaryMessageEncoder;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Start a workflow or raise an event on a Turnstile engine, knowing only schemas/Command.avsc.
 *
 * <pre>java -jar send-command.jar start|raise BOOTSTRAP TOPIC INSTANCE_ID NAME JSON</pre>
 *
 * NAME is the workflow (start) or the event (raise); JSON its input. The schema is read from
 * $COMMAND_AVSC (default schemas/Command.avsc).
 */
public final class SendCommand {
    private static final Map<String, String> BODIES =
            Map.of("start", "io.turnstile.command.StartWorkflow", "raise", "io.turnstile.command.RaiseEvent");

    public static void main(String[] args) throws Exception {
        if (args.length != 6 || !BODIES.containsKey(args[0])) {
            System.err.println("usage: send-command start|raise BOOTSTRAP TOPIC INSTANCE_ID NAME JSON");
            System.exit(2);
        }
        String bootstrap = args[1], topic = args[2], instanceId = args[3], name = args[4], json = args[5];
        String path = System.getenv().getOrDefault("COMMAND_AVSC", "schemas/Command.avsc");
        Schema command = new Schema.Parser().parse(new File(path));
        Schema union = command.getField("body").schema();
        Schema body = union.getTypes().get(union.getIndexNamed(BODIES.get(args[0])));
        Schema payload = body.getField("input").schema().getTypes().get(1); // ["null", Payload]

        // StartWorkflow and RaiseEvent both have name, input and request_id; unset fields
        // take their defaults. A fresh request id per command: reuse it only for a retry.
        String requestId = UUID.randomUUID().toString();
        GenericRecord record = new GenericRecordBuilder(command)
                .set("instance_id", instanceId)
                .set("body", new GenericRecordBuilder(body)
                        .set("name", name)
                        .set("input", new GenericRecordBuilder(payload)
                                .set("data", ByteBuffer.wrap(json.getBytes(StandardCharsets.UTF_8)))
                                .build())
                        .set("request_id", requestId)
                        .build())
                .build();
        // The single-object encoding: C3 01, the schema's CRC-64-AVRO fingerprint, the record.
        ByteBuffer value = new BinaryMessageEncoder<GenericRecord>(GenericData.get(), command).encode(record);

        Map<String, Object> config = Map.of("bootstrap.servers", bootstrap); // default partitioner: murmur2
        try (KafkaProducer<byte[], byte[]> producer =
                new KafkaProducer<>(config, new ByteArraySerializer(), new ByteArraySerializer())) {
            byte[] key = instanceId.getBytes(StandardCharsets.UTF_8);
            byte[] bytes = new byte[value.remaining()];
            value.get(bytes);
            RecordMetadata sent = producer.send(new ProducerRecord<>(topic, key, bytes)).get();
            System.out.printf("%s %s request_id=%s partition=%d offset=%d%n",
                    body.getName(), instanceId, requestId, sent.partition(), sent.offset());
        }
    }
}
