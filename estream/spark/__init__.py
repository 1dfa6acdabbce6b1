"""estream as a Spark data source: ``estream.spark.register(spark)``, then
``spark.readStream.format("estream")``, ``spark.read.format("estream")`` and
``df.writeStream.format("estream")``.

Needs the ``spark`` extra (pyspark 4.3, pyarrow) only when registering: the pure modules
``planning`` (offsets and partitions), ``commit`` (the sink's exactly-once decisions) and
``options`` import without it. The shell: ``source`` (readers), ``sink`` (the streaming
writer), ``datasource`` (the format). See docs/spark.md.

Side effect: :func:`register` registers the data source in a Spark session.
"""

from __future__ import annotations

from typing import Any

NAME = "estream"


def register(spark: Any) -> None:
    """Register the ``estream`` format in ``spark`` (a SparkSession)."""
    from estream.spark.datasource import EstreamDataSource

    spark.dataSource.register(EstreamDataSource)


__all__ = ["NAME", "register"]
