"""Slurm pool settings by allow-list, against the real test Slurm (issue 29, item 6; docs/slurm-and-k8s.md):

* sbatch_opts' table is the installed sbatch's own: every letter's "ambiguous; possibilities" answer;
* an allowed option, written as an abbreviation, reaches sbatch (squeue shows the job's comment);
* a forbidden abbreviation (--wra=, --outp=, ...) is a 400 before anything is written: no pool, no folder,
  no job, no marker file; a workdir outside the pool's folder and the operator's roots likewise, and one
  inside XPUFLEET_SLURM_WORKDIR_ROOTS is taken.
"""

from __future__ import annotations

import re
import subprocess

import fleet_harness as fh
import pytest
import slurm_harness as sh

from xpufleet.server.slurm.sbatch_opts import LONG

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture(autouse=True)
def _cluster():
    sh.require_slurm()


def _possibilities(prefix: str) -> set[str]:
    out = subprocess.run(["sbatch", f"--{prefix}"], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    return set(re.findall(r"'--([a-z-]+)'", out.stderr.split("possibilities:", 1)[1])) if "possibilities" in out.stderr else set()


def test_the_option_table_is_the_installed_sbatchs_own():
    for letter in "abcdeghimnopqrstuvw":  # the letters with more than one option
        assert _possibilities(letter) == {n for n in LONG if n.startswith(letter)}, letter


def test_an_allowed_abbreviation_reaches_sbatch_and_forbidden_ones_are_refused_before_anything_is_written(fleet):
    sc = fleet.sidecar()
    marker = fleet.home.parent / "wrap-ran"
    before = sh.slurm("squeue", "-h", "-o", "%i").split()
    for arg in (f"--wra=touch {marker}", f"--outp={marker}", "--err=/tmp/x", "--arr=1-1000", "--job-n=x",
                "--parti=debug", "--acc=root", "--tim=1", "--exp=ALL", "-Jx", "-D/tmp"):
        code, out = sc.call("POST", "/api/pools", sh.pool_body("slforbid", sbatch_args=[arg]))
        assert code == 400 and "allowed: --qos" in out["error"], (arg, code, out)
    outside = fleet.home.parent / "outside"
    code, out = sc.call("POST", "/api/pools", sh.pool_body("slforbid", workdir=str(outside)))
    assert code == 400 and "outside the folders a pool may use" in out["error"], out
    assert sc.call("GET", "/api/pools/slforbid")[0] == 404
    assert not (fleet.home / "slurm" / "slforbid").exists() and not outside.exists() and not marker.exists()
    assert sh.slurm("squeue", "-h", "-o", "%i").split() == before

    blocker = sh.Blocker()  # the pool's job stays pending while squeue is read
    try:
        sc.ok("POST", "/api/pools", sh.pool_body("slok", sbatch_args=["--comm", "from-xpufleet", "--nic=3"]), 201)
        pool = sc.ok("GET", "/api/pools/slok")
        assert pool["slurm"]["sbatch_args"] == ["--comment=from-xpufleet", "--nice=3"]
        run = sc.submit(fh.iris_graph(), target={"pool": "slok"})
        waiting = sc.wait_reason(run, "PENDING", timeout=60)
        job_id = waiting["waiting_reason"].split("Slurm job ")[1].split(":")[0]
        shown = sh.slurm("squeue", "-h", "-j", job_id, "-o", "%k|%y").strip()
        assert shown == "from-xpufleet|3", shown
        sc.ok("POST", f"/api/runs/{run}/cancel")
    finally:
        blocker.release()
        subprocess.run(["scancel", f"--name={pool['slurm']['job_name']}"], capture_output=True, timeout=30)


def test_a_workdir_inside_an_operators_root_is_taken_and_one_through_a_symlink_out_is_not(fleet):
    shared = fleet.home.parent / "shared"
    shared.mkdir()
    (shared / "escape").symlink_to(fleet.home.parent / "elsewhere", target_is_directory=True)
    sc = fleet.sidecar(XPUFLEET_SLURM_WORKDIR_ROOTS=str(shared))
    code, out = sc.call("POST", "/api/pools", sh.pool_body("slesc", workdir=str(shared / "escape" / "w")))
    assert code == 400 and "outside" in out["error"] and not (fleet.home.parent / "elsewhere").exists(), out
    sc.ok("POST", "/api/pools", sh.pool_body("slroot", workdir=str(shared / "pools" / "a")), 201)
    cred = shared / "pools" / "a" / "credential"
    assert cred.exists() and oct(cred.stat().st_mode & 0o777) == "0o600"
    # the pool's own folder needs no root
    sc.ok("POST", "/api/pools", sh.pool_body("slown", workdir=str(fleet.home / "slurm" / "slown" / "jobs")), 201)
    assert (fleet.home / "slurm" / "slown" / "jobs" / "credential").exists()
