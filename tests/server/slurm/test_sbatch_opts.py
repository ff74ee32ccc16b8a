"""slurm.sbatch_args read the way sbatch 22.05 reads them (server/slurm/sbatch_opts.py) and held to the
allow-list; slurm.workdir confined to the pool's folder or an operator's root (issue 29, item 6)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xpufleet.server.slurm.sbatch_opts import ALLOWED, LONG, SHORT, OptionError, resolve_long
from xpufleet.server.slurm.spec import SpecError, confine_workdir, parse_spec

# The probe's repro (each answered 201 and --wra=CMD ran as --wrap), then more shapes of our own
REPRO = ["--wra=touch /tmp/x", "--outp=/root/.ssh/x", "--err=/tmp/e", "--arr=1-1000", "--job-n=other",
         "--parti=debug", "--acc=lab", "--tim=1"]
MORE = ["--wr=id", "--w=id", "--wrap=id", "--outpu=/x", "--o=/x", "--chd=/root", "--chdir=/", "--exp=ALL,LD_PRELOAD=x",
        "--expo=ALL", "--export-f=/etc/passwd", "--inp=/etc/shadow", "--uid=0", "--gi=0", "--contai=x", "--dep=afterok:1",
        "--get-user-env", "--get=60", "--clusters=other", "--clu=x", "--M=x", "--account=lab", "--partition=gpu",
        "--gres=gpu:8", "--gpus=8", "--parsable", "--test-only", "--wait", "--hold", "--open-mode=append",
        "--mail-user=evil@example", "--nodefile=/etc/passwd", "--sig=9", "--requeue", "--time-min=1", "--unknown",
        "--tas=1", "--", "script.sh", "-"]
SHORTS = [["-J", "x"], ["-Jx"], ["-o/x"], ["-e", "/x"], ["-D/root"], ["-a1-9"], ["-p", "gpu"], ["-A", "lab"],
          ["-t1"], ["-W"], ["-qlong", "-W"], ["-Hq", "x"], ["-i/etc/shadow"], ["-M", "other"], ["-Z"],
          ["-G", "4"], ["-F/etc/passwd"]]


@pytest.mark.parametrize("arg", REPRO + MORE)
def test_a_forbidden_ambiguous_or_unknown_long_option_is_refused_naming_it_and_the_allow_list(arg):
    with pytest.raises(SpecError) as err:
        parse_spec({"sbatch_args": [arg]})
    text = str(err.value)
    assert text.startswith("slurm.sbatch_args") and "--qos, --mem" in text, text
    shown = arg.split("=", 1)[0]
    assert shown in text or repr(arg) in text, text


@pytest.mark.parametrize("args", SHORTS)
def test_short_options_bundles_and_glued_values_are_read_as_sbatch_reads_them(args):
    with pytest.raises(SpecError, match="slurm.sbatch_args"):
        parse_spec({"sbatch_args": args})


@pytest.mark.parametrize("abbrev,full", [("wra", "wrap"), ("outp", "output"), ("err", "error"), ("arr", "array"),
                                         ("job-n", "job-name"), ("parti", "partition"), ("qo", "qos"),
                                         ("mem-per-c", "mem-per-cpu"), ("reser", "reservation"), ("cluster", "clusters")])
def test_a_unique_prefix_resolves_to_its_option_as_getopt_long_does(abbrev, full):
    assert resolve_long(abbrev) == full


@pytest.mark.parametrize("abbrev", ["acc", "tim", "me", "mem-per", "ex", "c", "no", "clu"])
def test_a_prefix_of_several_options_is_ambiguous(abbrev):
    with pytest.raises(OptionError, match="ambiguous"):
        resolve_long(abbrev)


@pytest.mark.parametrize("given,stored", [
    (["--qos=long", "--mem=8G"], ("--qos=long", "--mem=8G")),
    (["--qo=long"], ("--qos=long",)),
    (["-q", "long", "--mem", "32G"], ("--qos=long", "--mem=32G")),
    (["-qlong", "-c8", "-Ca100", "-x", "n1,n2", "-wnode[1-4]"],
     ("--qos=long", "--cpus-per-task=8", "--constraint=a100", "--exclude=n1,n2", "--nodelist=node[1-4]")),
    (["--mem-per-g=10G", "--exclusive", "--exclusive=user", "--nice=10", "--comment", "a = b", "--mail-t=END,FAIL"],
     ("--mem-per-gpu=10G", "--exclusive", "--exclusive=user", "--nice=10", "--comment=a = b", "--mail-type=END,FAIL")),
    (["--reservation=maint", "-Lmatlab:1", "--tmp=10G", "--cpus-per-gpu=4"],
     ("--reservation=maint", "--licenses=matlab:1", "--tmp=10G", "--cpus-per-gpu=4")),
])
def test_allowed_options_are_stored_in_their_canonical_form(given, stored):
    assert parse_spec({"sbatch_args": given}).sbatch_args == stored


@pytest.mark.parametrize("args,why", [
    (["--qos", "--wrap=id"], "would take"),  # getopt takes the next item as the value
    (["--mem"], "needs a value"),
    (["-q"], "needs a value"),
    (["--mem="], "value"),
    (["--nodelist=/etc/hosts"], "file"),  # sbatch reads a value with '/' as a file of node names
    (["-x/etc/passwd"], "file"),
    (["--exclusive=topo"], "exclusive"),
    (["--nice=-10"], "nice"),
    (["--exclusive", "x"], "not an option"),  # an optional value only follows '='
    (["--qos=a\nb"], "control character"),
])
def test_bad_values_of_allowed_options_are_refused(args, why):
    with pytest.raises(SpecError, match=why):
        parse_spec({"sbatch_args": args})


def test_the_table_holds_every_allowed_option_and_each_short_one():
    assert set(ALLOWED) <= set(LONG)
    assert set(SHORT.values()) <= set(LONG)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet="-=abcdeilmnopqrstuwxACDJW/ 0123456789", max_size=12), max_size=4))
def test_whatever_is_accepted_is_only_allowed_options_in_canonical_form(args):
    try:
        spec = parse_spec({"sbatch_args": args})
    except SpecError as exc:
        assert str(exc).startswith("slurm.sbatch_args")
        return
    for item in spec.sbatch_args:
        name = item[2:].split("=", 1)[0]
        assert item.startswith("--") and name in ALLOWED, item


def test_a_workdir_must_lie_inside_one_of_the_roots(tmp_path):
    root = tmp_path / "home" / "slurm" / "p"
    root.mkdir(parents=True)
    confine_workdir(str(root), [str(root)])
    confine_workdir(str(root / "sub" / "deeper"), [str(root)])
    for bad in ("/root/.ssh", str(root) + "-other", str(root / ".." / "q"), "/"):
        with pytest.raises(SpecError, match="outside"):
            confine_workdir(bad, [str(root)])
    os.symlink("/root", root / "link")  # a symlink out of the root is judged by where it leads
    with pytest.raises(SpecError, match="that is /root"):
        confine_workdir(str(root / "link" / ".ssh"), [str(root)])
