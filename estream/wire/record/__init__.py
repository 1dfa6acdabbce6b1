"""Records and record batches: the model and its pure byte codec.

A record batch is the unit that travels and is stored: the writer encodes it once, every
hop verifies its checksum (or MAC), the range server writes it to its log unchanged, and
readers decode it. This package's face holds the public names; by concept:
:mod:`.layout` (constants, model, digests), :mod:`.encode`, :mod:`.decode` (verifying
untrusted bytes) and :mod:`.columns` (columnar reads). The byte layout and what the MAC
covers are in docs/ARCHITECTURE.md 3.1.

Pure: no I/O.
"""

from estream.wire.record.columns import (
    BatchColumns,
    BatchView,
    decode_columns,
    decode_views,
    uniform_value_bytes,
    view_batch,
)
from estream.wire.record.decode import (
    check_records,
    compute_checksum,
    decode_batch,
    decode_header,
    decode_system,
    is_hmac_batch,
    iter_batches,
    producer_id_starts,
    verify_batch,
    verify_digest,
    verify_mac,
)
from estream.wire.record.encode import (
    encode_batch,
    encode_record_head,
    encode_records,
    encode_system,
    is_extended_head,
    restamp,
    section_of_parts,
    with_system,
    wrap_records,
)
from estream.wire.record.layout import (
    BATCH_HEADER_BYTES,
    BATCH_MAGIC,
    BATCH_VERSION,
    DIGEST_CRC32C,
    DIGEST_HMAC_SHA256,
    DIGEST_NAMES,
    DIGEST_XXH3,
    DIGESTS,
    EXTENDED_HEAD,
    FLAG_KEYED,
    FLAG_SYSTEM,
    MAC_BYTES,
    MAC_VERSION,
    RECORD_PREFIX_BYTES,
    SEQUENCE_CONSECUTIVE,
    SEQUENCE_LISTED,
    SEQUENCE_NONE,
    SYSTEM_PREFIX_BYTES,
    BatchHeader,
    BatchSystem,
    EncodedRecords,
    Record,
    RecordBatch,
    digest_kind,
    records_at,
    stream_key,
)

__all__ = [
    "BATCH_HEADER_BYTES", "BATCH_MAGIC", "BATCH_VERSION", "DIGESTS", "DIGEST_CRC32C",
    "DIGEST_HMAC_SHA256", "DIGEST_NAMES", "DIGEST_XXH3", "EXTENDED_HEAD", "FLAG_KEYED",
    "FLAG_SYSTEM", "MAC_BYTES", "MAC_VERSION", "RECORD_PREFIX_BYTES", "SEQUENCE_CONSECUTIVE",
    "SEQUENCE_LISTED", "SEQUENCE_NONE", "SYSTEM_PREFIX_BYTES", "BatchColumns", "BatchHeader",
    "BatchSystem", "BatchView", "EncodedRecords", "Record", "RecordBatch", "check_records",
    "compute_checksum", "decode_batch", "decode_columns", "decode_header", "decode_system",
    "decode_views", "digest_kind", "encode_batch", "encode_record_head", "encode_records",
    "encode_system", "is_extended_head", "is_hmac_batch", "iter_batches", "producer_id_starts",
    "records_at", "restamp", "section_of_parts", "stream_key", "uniform_value_bytes",
    "verify_batch", "verify_digest", "verify_mac", "view_batch", "with_system", "wrap_records",
]
