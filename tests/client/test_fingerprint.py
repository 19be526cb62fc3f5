"""Replica fingerprints: the digest (``healthsvc_client.digest``) is deterministic and sees one flipped bit;
``Run.fingerprint`` sends it as ``param_digest`` and every read format gives it back."""
from __future__ import annotations

import copy
import io

import pyarrow.csv as pacsv
import pyarrow.ipc as ipc
import pytest

torch = pytest.importorskip("torch")

import healthsvc_client  # noqa: E402
from healthsvc_client.digest import due, param_digest  # noqa: E402
from tests.barriers import wait_until  # noqa: E402


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(300, 300), torch.nn.ReLU(), torch.nn.Linear(300, 4))


def flip(t: torch.Tensor, index: int, bit: int) -> None:
    t.data.view(-1).view(torch.int32)[index] ^= 1 << bit


def test_equal_bits_give_equal_digests_and_one_flipped_bit_changes_it():
    a, b = model(), model()
    assert param_digest(a) == param_digest(b) == param_digest(copy.deepcopy(a))
    assert len(param_digest(a)) == 16 and int(param_digest(a), 16) >= 0
    for index, bit in [(0, 0), (12345, 22), (89_999, 31)]:   # lowest mantissa bit, top one, sign
        flip(b[0].weight, index, bit)
        assert param_digest(b) != param_digest(a)
        flip(b[0].weight, index, bit)
    assert param_digest(b) == param_digest(a)


def test_two_changes_that_cancel_in_a_plain_sum_still_change_the_digest():
    a, b = model(), model()
    bits = b[0].weight.data.view(-1).view(torch.int32)
    bits[10] += 1 << 4     # +16 here, -16 there: the same sum of the bits
    bits[11] -= 1 << 4
    assert param_digest(a) != param_digest(b)


def test_the_optimizer_state_is_included_on_request():
    a, b = model(), model()
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (a, b)]
    for m, opt in zip((a, b), opts):
        m(torch.ones(2, 300)).sum().backward()
        opt.step()
    assert param_digest(a, optimizer=opts[0]) == param_digest(b, optimizer=opts[1])
    flip(opts[1].state[b[0].weight]["exp_avg_sq"], 7, 22)
    assert param_digest(a) == param_digest(b)
    assert param_digest(a, optimizer=opts[0]) != param_digest(b, optimizer=opts[1])


def test_fingerprints_are_due_at_checkpoint_steps():
    assert [s for s in range(60) if due(s, 20)] == [19, 39, 59]
    assert not any(due(s, 0) for s in range(10))


def test_the_digest_reaches_the_server_and_reads_back_in_every_format(server, http):
    # Nothing is sent before finish() (a flush between the log and the fingerprint of step 9,
    # under load, sent that step's fields in two records: the test is of the wire format).
    run = healthsvc_client.Run(server.url, "fp-wire", rank=1, host="node-7", flush_interval_s=3600,
                      heartbeat_interval_s=0)
    m = model()
    run.log(loss=1.0, step=9)
    digest = run.fingerprint(m, step=9, replica_group=2)
    assert digest == param_digest(m)
    run.log(loss=0.9, data_cursor=80, step=10)
    assert run.finish(10.0)
    cols = http.get("/v1/runs/fp-wire/metrics").json()["columns"]
    assert cols["param_digest"] == [digest, None] and cols["replica_group"] == [2.0, None]
    assert cols["data_cursor"] == [None, 80.0] and cols["loss"] == [1.0, 0.9]
    only = http.get("/v1/runs/fp-wire/metrics", params={"fields": "param_digest"}).json()
    assert only["fields"] == ["param_digest"] and only["columns"]["param_digest"] == [digest, None]
    arrow = ipc.open_stream(io.BytesIO(http.get("/v1/runs/fp-wire/metrics?format=arrow").content)).read_all()
    assert arrow.column("param_digest").to_pylist() == [digest, None]
    csv = pacsv.read_csv(io.BytesIO(http.get("/v1/runs/fp-wire/metrics?format=csv").content),
                         convert_options=pacsv.ConvertOptions(column_types={"param_digest": "string"}))
    assert csv.column("param_digest").to_pylist()[0] == digest
    # The analysts' reader gives strings back, in both of its formats.
    from healthsvc_client.read import Reader
    for fmt in ("arrow", "csv"):
        df = Reader(server.url).metrics("fp-wire", format=fmt)
        assert df["param_digest"].tolist()[0] == digest and df["param_digest"].isna().tolist() == [False, True]
        assert df["data_cursor"].isna().tolist() == [True, False]
    # The contract is documented: the field and its meaning are in the OpenAPI schema.
    schema = http.get("/openapi.json").json()["components"]["schemas"]["MetricRecord"]["properties"]
    assert "after the update" in schema["param_digest"]["description"]
    assert "identical parameters" in schema["replica_group"]["description"] and "sampler" in schema["data_cursor"]["description"]


def test_a_fingerprint_never_raises_into_the_training_loop():
    run = healthsvc_client.Run(None, "fp-offline", rank=0, mode="disabled")
    assert run.fingerprint(model()) is None
    live = healthsvc_client.Run("http://127.0.0.1:9", "fp-bad", rank=0, heartbeat_interval_s=0, max_attempts=1)
    assert live.fingerprint(object()) is None            # not a model: counted, not raised
    wait_until(lambda: live.stats().last_error is not None, timeout_s=5)
    assert "fingerprint" in live.stats().last_error
    live.finish(0.5)
