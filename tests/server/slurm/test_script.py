"""The sbatch command line and job script (server/slurm/script.py): every user value quoted, none can
add a line or a command (Hypothesis over every field: the script's lines, `bash -n`, values intact)."""

from __future__ import annotations

import shlex
import shutil
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xpufleet.server.slurm.script import JobPaths, instance_name, job_cards, job_script, sbatch_argv
from xpufleet.server.slurm.spec import SpecError, parse_spec

BASE = job_script(parse_spec({}), "pool", JobPaths.under("/w"))


def _assignments(script: str) -> dict[str, str]:
    """``name=value`` lines at the top of the script, parsed as the shell would."""
    out = {}
    for line in script.splitlines():
        words = shlex.split(line, comments=True)
        if len(words) == 1 and "=" in words[0] and not line.startswith(("if", "for", " ")):
            name, value = words[0].split("=", 1)
            out[name] = value
    return out


def test_argv_has_every_option_as_one_item():
    spec = parse_spec({"partition": "gpu", "account": "lab", "time_limit": "01:00:00", "gres": "gpu:a100:1",
                       "sbatch_args": ["--qos=long", "--mem=8G"]})
    argv = sbatch_argv(spec, "t1", JobPaths.under("/w"), 2)
    assert argv == ["sbatch", "--parsable", "--job-name=xpufleet-t1", "--output=/w/job-%j.out", "--gres=gpu:a100:2",
                    "--partition=gpu", "--account=lab", "--time=01:00:00", "--qos=long", "--mem=8G"]


def test_job_cards_take_a_ddp_device_set_whole():
    spec = parse_spec({"gres": "gpu:1"})
    assert job_cards(spec, ["auto"]) == 1
    assert job_cards(spec, ["cuda:0", "cuda:1"]) == 2
    assert job_cards(parse_spec({"gres": "gpu:4"}), ["cuda:0"]) == 4
    assert instance_name("p" * 64, "123") == "p" * 44 + "-slurm123"


def test_the_script_reads_the_credential_from_its_file_and_never_holds_it():
    script = job_script(parse_spec({"python": "/opt/venv/bin/python"}), "spot", JobPaths.under("/shared/x"))
    assert 'XPUFLEET_AGENT_JOIN_TOKEN=$(cat "$credential_file")' in script
    assert _assignments(script)["credential_file"] == "/shared/x/credential"
    assert "--join" not in script  # the agent takes the credential from its environment


@pytest.mark.parametrize("field,value", [("partition", "gpu\nrm -rf /"), ("gres", "gpu;1"), ("time_limit", "1h"),
                                         ("sbatch_args", ["--job-name=x"]), ("sbatch_args", ["script.sh"]),
                                         ("python", "py\nthon"), ("workdir", "relative"), ("max_jobs", 0),
                                         ("server_url", "ftp://x"), ("nope", 1)])
def test_bad_settings_are_refused_naming_the_field(field, value):
    with pytest.raises(SpecError, match=field):
        parse_spec({field: value})


_text = st.text(min_size=1, max_size=40)


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is needed to check the script's syntax")
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(partition=_text, account=_text, gres=_text, time_limit=_text, python=_text, workdir=_text,
       extra=st.lists(_text, max_size=3), server_url=_text)
def test_arbitrary_values_never_inject_a_line_or_a_command(partition, account, gres, time_limit, python, workdir,
                                                            extra, server_url):
    raw = {"partition": partition, "account": account, "gres": gres, "time_limit": time_limit, "python": python,
           "workdir": "/" + workdir, "sbatch_args": ["--" + e for e in extra], "server_url": server_url}
    try:
        spec = parse_spec(raw)
    except SpecError as exc:
        assert str(exc).startswith("slurm.")  # refused, naming the field
        return
    paths = JobPaths.under(spec.workdir or "/w")
    script = job_script(spec, "pool", paths)
    assert len(script.splitlines()) == len(BASE.splitlines())  # no value added a line
    got = _assignments(script)
    assert got["python"] == spec.python and got["workdir"] == paths.workdir  # values intact
    assert got["credential_file"] == paths.credential and got["server_file"] == paths.server
    check = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stderr
    argv = sbatch_argv(spec, "tag", paths, 1)
    assert argv[-len(spec.sbatch_args):] == list(spec.sbatch_args) if spec.sbatch_args else True
    assert all("\n" not in a for a in argv)


_line = st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=60).filter(str.strip)  # blank: refused


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is needed to check the script's syntax")
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(python=_line, workdir=_line, pool=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", fullmatch=True))
def test_any_one_line_python_and_folder_reach_the_script_intact(python, workdir, pool):
    """Quotes, $(...), backticks, ; and spaces in the values the script holds: accepted and kept literally."""
    spec = parse_spec({"python": python, "workdir": "/" + workdir})
    paths = JobPaths.under(spec.workdir)
    script = job_script(spec, pool, paths)
    assert len(script.splitlines()) == len(BASE.splitlines())
    got = _assignments(script)
    assert got["python"] == spec.python and got["workdir"] == paths.workdir and got["pool"] == pool
    check = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stderr
