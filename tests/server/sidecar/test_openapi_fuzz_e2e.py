"""The fuzz suite (docs/limits.md, issue 9): schemathesis against the real sidecar's ``GET /api/openapi.json``,
every route it describes, with cases that fit each route's schema (positive) and cases that break it
(negative), sent with a valid token.

Asserted for every case: no 5xx; an error answer is ``{"error": "<text>"}`` and never shows the
server's home path; a negative case is refused with a 4xx (schemathesis's ``negative_data_rejection``);
no answer takes longer than ``response_bound`` (``RESPONSE_BOUND_S``, or a multiple of this machine's own
time for the heaviest route, a static estimate, measured in the same test). Run ids (and worker names) in the paths of positive cases are, one case in two, those of real runs (finished, so a long-poll or an
event stream ends at once; never for DELETE), so the run routes are exercised past their 404s. The number of cases
that ran is printed (``-s``) and asserted to cover every operation in both modes.

``XPUFLEET_FUZZ_OPERATIONS`` (comma-separated pieces of ``"METHOD /path"``, e.g. ``/api/pools,/api/sweeps``)
narrows the run to the operations that contain one of them; the coverage checks then hold for those.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
import sidecar_harness as harness  # registered by tests/server/conftest.py

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

import schemathesis  # noqa: E402 - a declared test dependency: missing fails, never skips
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import negative_data_rejection  # noqa: E402

RESPONSE_BOUND_S = 5.0  # no answer slower than this on a quiet machine (typical: milliseconds)
# ... or than this many times the slowest route's own time measured in the same test (POST /api/estimates
# of a small graph, after its one-off torch import), so a loaded machine does not decide the verdict
RESPONSE_BOUND_RATIO = 20.0
EXAMPLES = {GenerationMode.POSITIVE: 30, GenerationMode.NEGATIVE: 20}  # per operation
SKIPPED = {("GET", "/api/agents/ws")}  # the agents' WebSocket: fuzzed by the protocol's own tests
WORKER = "fuzz-worker"
ONLY = [p.strip() for p in os.environ.get("XPUFLEET_FUZZ_OPERATIONS", "").split(",") if p.strip()]


def selected(method: str, path: str) -> bool:
    """Whether the run covers this operation (every one unless XPUFLEET_FUZZ_OPERATIONS narrows it)."""
    return not ONLY or any(piece in f"{method.upper()} {path}" for piece in ONLY)


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory):
    sc = harness.Sidecar(tmp_path_factory.mktemp("fuzz-home")).start()
    agent = harness.AgentProcess(sc, WORKER)  # a real worker, so the worker routes get past their 404s
    try:
        harness.wait_until(lambda: any(w["name"] == WORKER and w["status"] == "Online"
                                       for w in sc.client.request("GET", "/api/workers")["workers"]),
                           f"worker {WORKER} online")
        yield sc
    finally:
        agent.stop()
        sc.stop()


def test_every_route_survives_schemathesis(sidecar):
    ok = sidecar.submit(harness.iris_graph(1), name="fuzz-ok")
    sidecar.finish(ok)
    bad = harness.iris_graph(1)
    bad["4"]["inputs"]["hidden"] = "not-a-layer-list"  # fails when it runs
    failed = sidecar.submit(bad, name="fuzz-failed")
    sidecar.finish(failed)
    real_runs = [ok, failed]
    real = real_objects(sidecar)

    # Every case carries the valid token: the token checks have their own tests (test_auth.py).
    config = schemathesis.Config.from_dict({"generation": {"with-security-parameters": False}})
    schema = schemathesis.openapi.from_url(f"{sidecar.url}/api/openapi.json", config=config)
    auth = {"Authorization": f"Bearer {sidecar.info['token']}"}
    operations = []
    for result in schema.get_all_operations():
        op = result.ok()
        if (op.method.upper(), op.path) not in SKIPPED and selected(op.method, op.path):
            operations.append(op)
    assert len(operations) >= (1 if ONLY else 25), [f"{o.method} {o.path}" for o in operations]

    check = Checker(sidecar, auth, real_runs, real, response_bound(sidecar))
    for op in operations:
        check.documented_examples(schema, op)
        for mode, examples in EXAMPLES.items():
            check.run(op, mode, examples)
    ran, slowest, problems = check.ran, check.slowest, check.problems
    total = sum(ran.values())
    slowest.sort(reverse=True)
    print(f"\nschemathesis: {total} cases over {len(operations)} operations "
          f"({sum(v for lbl, v in ran.items() if 'positive' in lbl)} positive, "
          f"{sum(v for lbl, v in ran.items() if 'negative' in lbl)} negative); "
          f"slowest answers: {', '.join(f'{t * 1000:.0f} ms {lbl}' for t, lbl in slowest[:3])}")
    for label in sorted({lbl for lbl, _ in check.statuses}):
        print(f"  {label}: " + ", ".join(f"{code} x{n}" for (lbl, code), n in sorted(check.statuses.items())
                                         if lbl == label))
    assert not problems, "\n".join(problems[:30]) + f"\n({len(problems)} problems)"
    if not ONLY:
        assert ran["POST /api/runs [examples]"] >= 1 and ran["POST /api/predict [examples]"] >= 1, ran
    every = [f"{o.method.upper()} {o.path} [{m.value}]" for o in operations for m in EXAMPLES]
    assert all(ran[label] > 0 for label in every if label not in check.nothing_to_break), ran
    # Only operations without a body or a query to break (a path id of any text) have no negative cases.
    with_inputs = ["POST /api/runs", "POST /api/predict", "POST /api/runs/{run_id}/cancel", "GET /api/runs",
                   "POST /api/workers/join-tokens", "PUT /api/workers/{name}/devices/{device}/mode",
                   "GET /api/runs/{run_id}/events", "GET /api/runs/{run_id}/logs", "GET /api/workers/{name}"]
    with_inputs += ["POST /api/pools", "POST /api/services", "PUT /api/services/{name}", "POST /api/sweeps",
                    "POST /api/studies", "POST /api/estimates", "GET /api/sweeps", "GET /api/studies",
                    "GET /api/services/{name}/export"]
    assert all(ran[f"{label} [negative]"] > 0 for label in with_inputs if selected(*label.split(" ", 1))), ran
    assert sidecar.client.run(ok)["status"] == "succeeded"  # nothing a fuzzed call did broke the runs
    json.dumps(sidecar.client.request("GET", "/api/status"))


def response_bound(sidecar: harness.Sidecar) -> float:
    """The slowest answer allowed: RESPONSE_BOUND_S, or RESPONSE_BOUND_RATIO x a small graph's estimate
    timed here (the second call: the first pays the estimator's one-off torch import)."""
    times = []
    for _ in range(2):
        started = time.monotonic()
        sidecar.client.request("POST", "/api/estimates", body={"graph": harness.iris_graph(1)})
        times.append(time.monotonic() - started)
    bound = max(RESPONSE_BOUND_S, RESPONSE_BOUND_RATIO * times[-1])
    print(f"\nresponse bound {bound:.1f} s (a small estimate took {times[-1] * 1000:.0f} ms here)")
    return bound


def real_objects(sidecar: harness.Sidecar) -> dict[str, str]:
    """A pool, a sweep and a study that exist (the sweep and the study finished: one iris run each), so
    the positive cases of their routes get past the 404s, as the run routes do with real runs."""
    found: dict[str, str] = {}
    if selected("GET", "/api/pools/{name}"):
        found["pool"] = sidecar.client.request("POST", "/api/pools", body={"name": "fuzz-pool"})["name"]
    if selected("GET", "/api/sweeps/{sweep_id}"):
        sweep = sidecar.client.request("POST", "/api/sweeps", body={
            "name": "fuzz-sweep", "graph": harness.iris_graph(1), "objective": {"metric": "val_accuracy"},
            "parameters": {"5.lr": [0.01]}, "seeds": 1})
        found["sweep_id"] = sweep["sweep_id"]
    if selected("GET", "/api/studies/{study_id}"):
        study = sidecar.client.request("POST", "/api/studies", body={
            "name": "fuzz-study", "graph": harness.iris_graph(1), "objective": {"metric": "val_accuracy"},
            "n_trials": 1, "parameters": {"5.lr": {"low": 0.001, "high": 0.1, "log": True}}})
        found["study_id"] = study["study_id"]
    for kind, path in (("sweep_id", "/api/sweeps/"), ("study_id", "/api/studies/")):
        if kind in found:
            harness.wait_until(lambda p=path + found[kind]: sidecar.client.request("GET", p)["status"] not in
                               ("queued", "running", "cancelling"), f"{kind} finished", timeout=180)
    return found


@dataclass
class Checker:
    """Sends the cases of one operation and mode, and keeps what each answer broke: the cases that ran
    and the statuses they got (by label), the answers' times, the problems, the operations with nothing
    to break."""

    sidecar: harness.Sidecar
    auth: dict[str, str]
    real_runs: list[str]
    real: dict[str, str]
    bound_s: float = RESPONSE_BOUND_S
    ran: Counter[str] = field(default_factory=Counter)
    statuses: Counter[tuple[str, int]] = field(default_factory=Counter)
    slowest: list[tuple[float, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    nothing_to_break: list[str] = field(default_factory=list)

    def run(self, op: Any, mode: GenerationMode, examples: int) -> None:
        label = f"{op.method.upper()} {op.path} [{mode.value}]"

        @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                  phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy(generation_mode=mode))
        def fuzz(case: Any) -> None:
            self.one(case, mode, label)

        try:
            fuzz()
        except Unsatisfiable:  # nothing of this operation can be made to break its schema (no inputs)
            if mode is GenerationMode.POSITIVE or self.ran[label]:
                raise
            self.nothing_to_break.append(label)

    def documented_examples(self, schema: Any, op: Any) -> None:
        """The examples the document gives (a real graph for POST /api/runs): each must be accepted."""
        label = f"{op.method.upper()} {op.path} [examples]"
        for strategy in schema.get_strategies_from_examples(op):
            @settings(max_examples=1, deadline=None, database=None, derandomize=True,
                      phases=[Phase.generate], suppress_health_check=list(HealthCheck))
            @given(case=strategy)
            def example(case: Any) -> None:
                response = self.one(case, GenerationMode.POSITIVE, label)
                if response.status_code >= 400:
                    self.problems.append(f"documented example refused: {response.status_code} {response.text[:200]}")

            example()

    def one(self, case: Any, mode: GenerationMode, label: str) -> Any:
        n = self.ran[label]
        params = case.path_parameters or {}
        # One positive case in two names a real run / worker (a negative one keeps what breaks it).
        if mode is GenerationMode.POSITIVE and n % 2 == 0 and case.method.upper() != "DELETE":
            if "run_id" in params:
                params["run_id"] = self.real_runs[n // 2 % len(self.real_runs)]
                if "path" in params and n % 4 == 0:
                    params["path"] = "spec.json"
            if "name" in params:
                params["name"] = self.real["pool"] if case.path.startswith("/api/pools/") else WORKER
                if "device" in params:
                    params["device"] = "cpu"
            for kind in ("sweep_id", "study_id"):
                if kind in params and kind in self.real:
                    params[kind] = self.real[kind]
        self.ran[label] += 1
        url = self.sidecar.url
        started = time.monotonic()
        response = case.call(base_url=url, headers=self.auth, timeout=self.bound_s * 4)
        took = time.monotonic() - started
        self.slowest.append((took, label))
        self.statuses[(label, response.status_code)] += 1
        where = f"{label}: {case.as_curl_command(headers=self.auth, base_url=url)[:300]}"
        if response.status_code >= 500:
            self.problems.append(f"{response.status_code} {response.text[:200]} <- {where}")
        if took > self.bound_s:
            self.problems.append(f"{took:.1f} s <- {where}")
        if response.status_code >= 400:
            try:
                body = response.json()
            except ValueError:
                body = None
            if not (isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"]):
                self.problems.append(f"{response.status_code} without {{\"error\"}}: {response.text[:120]} <- {where}")
            if str(self.sidecar.home) in response.text:
                self.problems.append(f"the server's path in an error answer <- {where}")
        # schemathesis's own checks: no 5xx; a negative case (one that breaks the schema even after
        # it is serialised into a query string or a body) refused with a 4xx
        try:
            case.validate_response(response, checks=[not_a_server_error, negative_data_rejection])
        except Exception as exc:  # noqa: BLE001 - schemathesis's failure (group): kept with the case
            self.problems.append(f"{type(exc).__name__}: {str(exc)[:400]} <- {where}")
        return response
