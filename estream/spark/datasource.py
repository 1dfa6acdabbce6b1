"""The ``estream`` Spark data source class: the format name, the schema, and which reader
or writer Spark gets for ``spark.read``, ``spark.readStream`` and ``df.writeStream``.

Side effect: none itself; its readers and writer talk to the cluster.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from estream.spark.options import SourceOptions
from estream.spark.sink import EstreamStreamWriter
from estream.spark.source import SCHEMA, EstreamBatchReader, EstreamStreamReader

NAME = "estream"


class EstreamDataSource(DataSource):
    """The ``estream`` format. Columns: ``stream string, offset long, timestamp timestamp,
    headers map<string,string>, value binary, key binary`` (``key``: null but for
    records with one, such as Kafka's)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        # Spark asks for the schema at ``load()``: a bad read option fails there, with its
        # InvalidArgument. In the streaming reader's constructor it reached the user as
        # PySpark's own UnboundLocalError (its runner's cleanup names a reader never made).
        SourceOptions.parse(self.options)
        return SCHEMA

    def reader(self, schema: StructType) -> EstreamBatchReader:
        return EstreamBatchReader(self.options)

    def streamReader(self, schema: StructType) -> EstreamStreamReader:
        return EstreamStreamReader(self.options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> EstreamStreamWriter:
        return EstreamStreamWriter(self.options, schema)
