"""The wire ring: what bytes mean, shared by every process.

Pure code only (no asyncio, sockets, files or clocks) and no import of any other estream
package: typed errors and their codes (:mod:`errors`), every limit with its unit
(:mod:`limits`), the catalog model (:mod:`meta`), records and record batches with their
codec and columnar views (:mod:`record`), frames, opcodes and the frame decoder
(:mod:`protocol`), the object tier's object format (:mod:`objectformat`) and the rule
that picks a time among record timestamps (:mod:`timestamps`).
"""
