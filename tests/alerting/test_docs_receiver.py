"""The receiver snippet of docs/alerting.md verifies what the delivery
worker sends."""
from __future__ import annotations

import re
import threading
import time
from http.server import HTTPServer
from pathlib import Path

import pytest

from healthsvc.alerting.delivery import Backoff, DeliveryWorker
from healthsvc.store.outbox import Outbox
from healthsvc.alerting.signing import generate_secret

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("DOC", [ROOT / "docs" / "alerting.md"], ids=["docs"])
def test_docs_receiver_accepts_signed_and_rejects_forged(capsys, DOC):
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S) if "class Hook" in b]
    secret = generate_secret()
    code = code.replace('SECRET = "whsec_..."', f"SECRET = {secret!r}")
    code = code.replace('HTTPServer(("0.0.0.0", 9000), Hook).serve_forever()', "")
    ns: dict = {}
    exec(compile(code, str(DOC), "exec"), ns)
    server = HTTPServer(("127.0.0.1", 0), ns["Hook"])
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        ob = Outbox(":memory:")
        good = ob.enqueue("s", url, secret, b'{"status":"firing","alerts":[{"labels":{"alertname":"stall"},'
                                            b'"annotations":{"summary":"all ranks silent"}}]}', now=time.time())
        forged = ob.enqueue("s", url, generate_secret(), b'{"alerts":[]}', now=time.time())
        DeliveryWorker(ob, backoff=Backoff(0.01, 0.02)).run_once()
        assert ob.get(good).state == "delivered"
        assert (ob.get(forged).state, ob.get(forged).last_status) == ("failed", 401)
        assert "firing stall all ranks silent" in capsys.readouterr().out
    finally:
        server.shutdown()
        server.server_close()
