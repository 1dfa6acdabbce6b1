"""A ``local[2]`` Spark session with the estream source and sink registered, for the Spark
tests and bench_spark (PySpark is optional: imported only when a session is made).

Workers run on this interpreter and the driver binds to loopback; the UI is off.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def spark_env() -> dict[str, str]:
    """What PySpark needs here: workers on this interpreter, the driver on loopback."""
    return {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }


def new_spark(app: str = "estream-tests", conf: dict[str, str] | None = None) -> Any:
    """A new (or the running) local session; stop it when done."""
    os.environ.update(spark_env())
    from pyspark.sql import SparkSession

    import estream.spark

    builder = (
        SparkSession.builder.master("local[2]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    estream.spark.register(spark)
    return spark
