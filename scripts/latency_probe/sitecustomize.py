"""A latency probe for overhead runs (scripts/overhead.py), not part of specgate: on
PYTHONPATH with LAT_OUT set, the API process of `vllm serve` and of the gateway each
write `LAT_OUT/<pid>.json`, one row per request that ran alone (concurrency 1):

    way in        uvicorn has the whole request -> `add_request_async` (to the EngineCore)
    engine first  -> the first `OutputProcessor.process_outputs` after it
    cadence       the mean time between the request's `process_outputs` calls
    way out       the first `process_outputs` -> the first body write to the socket
    writes        the mean time between the request's body writes

all in ms, then the counts of outputs and writes (the file is rewritten every eighth
row: up to seven last rows are not in it). Both servers run the same uvicorn
and vLLM code below and above the gateway, so the rows compare the gateway's own path
with `vllm serve`'s:

    PYTHONPATH=$PWD/scripts/latency_probe LAT_OUT=/tmp/lat .venv/bin/python scripts/overhead.py \\
      --concurrency 1 --passes 1 --output-len 8 --prompts 1:16 --control --out /tmp/lat-run
    python3 scripts/latency_probe/summary.py /tmp/lat
"""

import json
import os
import sys
import time

OUT = os.environ.get("LAT_OUT")
ARGV = " ".join(sys.orig_argv)


def _install(out: str) -> None:
    from uvicorn.protocols.http import httptools_impl
    from vllm.v1.engine import core_client, output_processor

    # One request at a time: the state is the process's, and a request that overlapped
    # another (an arrival while it ran) gives no row.
    st: dict = {"rows": [], "inflight": 0, "first_out": None}
    path = os.path.join(out, f"{os.getpid()}.json")
    os.makedirs(out, exist_ok=True)

    on_message_complete = httptools_impl.HttpToolsProtocol.on_message_complete

    def arrived(self):  # type: ignore[no-untyped-def]
        st["inflight"] += 1
        st.update(arrive=time.perf_counter(), add=None, first_out=None, last_out=None, n_out=0)
        st.update(first_write=None, last_write=None, n_write=0, solo=st["inflight"] == 1)
        return on_message_complete(self)

    add_request_async = core_client.AsyncMPClient.add_request_async

    async def added(self, request):  # type: ignore[no-untyped-def]
        if st.get("arrive") is not None and st.get("add") is None:
            st["add"] = time.perf_counter()
        return await add_request_async(self, request)

    process_outputs = output_processor.OutputProcessor.process_outputs

    def outputs(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if st.get("add") is not None:
            now = time.perf_counter()
            if st["first_out"] is None:
                st["first_out"] = now
            st["last_out"] = now
            st["n_out"] += 1
        return process_outputs(self, *args, **kwargs)

    send = httptools_impl.RequestResponseCycle.send

    async def sent(self, message):  # type: ignore[no-untyped-def]
        body = message["type"] == "http.response.body"
        last = body and not message.get("more_body", False)
        if body and st["first_out"] is not None:
            now = time.perf_counter()
            if message.get("body"):  # vllm serve ends a stream with an empty message
                if st["first_write"] is None:
                    st["first_write"] = now
                st["last_write"] = now
                st["n_write"] += 1
            if last and st["solo"] and st["n_out"] > 1 and st["n_write"] > 1:
                _row(st, path)
        if last:
            st["inflight"] -= 1
        return await send(self, message)

    httptools_impl.HttpToolsProtocol.on_message_complete = arrived
    core_client.AsyncMPClient.add_request_async = added
    output_processor.OutputProcessor.process_outputs = outputs
    httptools_impl.RequestResponseCycle.send = sent


def _row(st: dict, path: str) -> None:
    """The request's row; every eighth, the file again (a few hundred bytes)."""
    ms = 1e3
    st["rows"].append(
        [
            (st["add"] - st["arrive"]) * ms,
            (st["first_out"] - st["add"]) * ms,
            (st["last_out"] - st["first_out"]) * ms / (st["n_out"] - 1),
            (st["first_write"] - st["first_out"]) * ms,
            (st["last_write"] - st["first_write"]) * ms / (st["n_write"] - 1),
            st["n_out"],
            st["n_write"],
        ]
    )
    st["first_out"] = None
    if len(st["rows"]) % 8 == 0:
        with open(path, "w") as f:
            json.dump({"argv": ARGV[:120], "rows": st["rows"]}, f)


if OUT and ("vllm.entrypoints" in ARGV or " app serve" in ARGV):
    _install(OUT)
