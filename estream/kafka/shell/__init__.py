"""The Kafka gateway's shell: the asyncio server (``gateway``), its HTTP endpoints
(``http``) and the ``estream kafka`` command (``cli``)."""
