"""The Kafka gateway: Kafka clients produce to and fetch from estream streams.

Pure modules (no I/O): ``protocol`` (frames, headers, versions, responses over kio),
``records`` (Kafka record batches, compression), ``topics`` (topic/partition to stream),
``convert`` (Kafka records to estream records and back). The asyncio server that serves
connections through the SDK is ``estream.kafka.shell``. docs/KAFKA.md is the user's page.
"""
