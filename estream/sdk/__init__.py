"""The SDK's shell: :class:`~estream.sdk.client.Client`, the writer and the reader.

These are asyncio drivers of the pure cores in :mod:`estream.core`; users reach them
through ``estream.connect`` (see :mod:`estream`). No server imports this package.
"""
