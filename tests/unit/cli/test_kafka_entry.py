"""``estream kafka`` starts without importing hypothesis (kio would, for test strategies
only: about half of the gateway's import time), and leaves it importable."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

_PROBE = """
import contextlib, io, json, sys
from estream.cli.main import main
with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):
    main(["kafka", "--help"])
from estream.kafka.shell.gateway import Gateway
import kio.static._phantom as phantom
seen = {"gateway": Gateway.__name__, "loaded": "hypothesis" in sys.modules,
        "kio_sees": phantom.hypothesis is not None}
import hypothesis
seen["importable"] = hypothesis.__name__
print(json.dumps(seen))
"""


def test_the_gateway_starts_without_hypothesis() -> None:
    done = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=True)
    seen = json.loads(done.stdout)
    assert seen == {"gateway": "Gateway", "loaded": False, "kio_sees": False,
                    "importable": "hypothesis"}
