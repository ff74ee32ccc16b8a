"""Every body is validated by its contract model first (server/sidecar/routes/common.py ``body``); the
rules that need more (a graph's inputs, a worker's cards, a Slurm cluster's names) keep field lists of
their own as a guard for a direct caller (SshManager.add, slurm's parse_spec). Those lists are taken from
the models, or held to them here, so the two cannot drift."""

from __future__ import annotations

from xpufleet.predictor.service import OPTION_NAMES as PREDICT_OPTIONS
from xpufleet.server.contracts import misc, services, sweeps, workers
from xpufleet.server.slurm import spec as slurm_spec
from xpufleet.server.ssh.manager import FIELDS as SSH_FIELDS
from xpufleet.server.sweeps import spec as sweep_spec
from xpufleet.server.units import spec as unit_spec


def test_hand_checked_bodies_have_the_models_fields():
    assert set(workers.SshWorker.model_fields) == SSH_FIELDS
    assert tuple(workers.SlurmPool.model_fields) == slurm_spec.FIELDS
    assert tuple(misc.PredictOptions.model_fields) == PREDICT_OPTIONS
    assert unit_spec.TOP_FIELDS == tuple(services.ServiceSpec.model_fields)
    assert sweep_spec.SWEEP_FIELDS == tuple(sweeps.SweepSubmit.model_fields)
    assert sweep_spec.STUDY_FIELDS == tuple(sweeps.StudySubmit.model_fields)


def test_the_hand_checked_rules_refuse_what_the_models_refuse():
    """The service rules take their nested field lists from the models: an unknown field is refused in
    both, with the rule's own text."""
    body = {"name": "svc", "program": {"model": {"path": "m.safetensors"}}, "restart": {"tries": 1}}
    try:
        unit_spec.parse_service(body)
    except unit_spec.SpecError as exc:
        assert str(exc) == "restart: unknown field(s) tries; known: max_restarts, window_s, backoff_s, backoff_max_s"
    else:
        raise AssertionError("an unknown restart field was accepted")
    assert "tries" not in services.Restart.model_fields and services.Restart.model_config["extra"] == "forbid"
