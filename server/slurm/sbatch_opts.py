"""``slurm.sbatch_args`` read the way ``sbatch`` 22.05 reads its command line, then held to an allow-list.

sbatch parses its options with glibc's ``getopt_long``: a long option may be any unique prefix of its name
(``--wra=CMD`` is ``--wrap``), a required value comes after ``=`` or as the next item (whatever it starts
with), an optional one only after ``=``; short options may be bundled (``-Wq long``) and take a value
glued (``-qlong``) or as the next item. A deny-list of option names misses the prefixes, so each item is
resolved against sbatch's own table and only options on :data:`ALLOWED` pass. What is stored and given
to sbatch is the canonical ``--name=value`` form, so sbatch has nothing left to interpret.

The table was read from the real sbatch 22.05.8 (each letter's "ambiguous; possibilities" list, and each
option's "requires an argument" / "doesn't allow an argument" answer).
"""

from __future__ import annotations

from collections.abc import Sequence

REQ, NONE, OPT = "required", "none", "optional"

# sbatch 22.05's long options and whether each takes a value (getopt's has_arg)
_OPT_NAMES = {"exclusive", "get-user-env", "nice", "no-kill", "propagate"}
_NO_ARG = {"contiguous", "help", "hold", "ignore-pbs", "no-requeue", "overcommit", "oversubscribe", "parsable",
           "quiet", "reboot", "requeue", "spread-job", "test-only", "use-min-nodes", "usage", "verbose", "version",
           "wait"}
_REQ_NAMES = (
    "account acctg-freq array batch begin bb bbf cluster-constraint chdir cluster clusters comment container "
    "context constraint core-spec cores-per-socket cpu-freq cpus-per-gpu cpus-per-task deadline delay-boot "
    "dependency distribution error exclude export export-file extra-node-info gid gpu-bind gpu-freq gpus "
    "gpus-per-node gpus-per-socket gpus-per-task gres gres-flags hint input job-name kill-on-invalid-dep licenses "
    "mail-type mail-user mcs-label mem mem-bind mem-per-cpu mem-per-gpu mincpus network nodefile nodelist nodes "
    "ntasks ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket ntasks-per-tres open-mode output "
    "partition power prefer priority profile qos reservation signal sockets-per-node switches tasks-per-node thread-spec "
    "threads-per-core time time-min tmp uid wait-all-nodes wckey wrap").split()
LONG: dict[str, str] = {**{n: REQ for n in _REQ_NAMES}, **{n: NONE for n in _NO_ARG},
                        **{n: OPT for n in _OPT_NAMES}}
# sbatch's short options and the long option each stands for
SHORT: dict[str, str] = {
    "a": "array", "A": "account", "b": "begin", "B": "extra-node-info", "c": "cpus-per-task", "C": "constraint",
    "d": "dependency", "D": "chdir", "e": "error", "F": "nodefile", "G": "gpus", "h": "help", "H": "hold",
    "i": "input", "J": "job-name", "k": "no-kill", "L": "licenses", "m": "distribution", "M": "clusters",
    "n": "ntasks", "N": "nodes", "o": "output", "O": "overcommit", "p": "partition", "q": "qos", "Q": "quiet",
    "s": "oversubscribe", "S": "core-spec", "t": "time", "v": "verbose", "V": "version", "w": "nodelist",
    "W": "wait", "x": "exclude"}
_SAME = {"cluster": "clusters"}  # one option under two names (getopt does not call their prefixes ambiguous)

# What a pool may add: resources and scheduling hints. Nothing here changes what the job runs (--wrap,
# --export, --container, --uid), where it reads or writes (--chdir, --output, --input), which account,
# partition, cluster or time it is billed to (the pool's own fields), or how the sidecar tracks it.
ALLOWED: dict[str, str] = {
    "qos": "the QOS, e.g. --qos=long",
    "mem": "memory per node, e.g. --mem=32G",
    "mem-per-cpu": "memory per CPU",
    "mem-per-gpu": "memory per GPU",
    "cpus-per-task": "CPUs for the agent, e.g. --cpus-per-task=8",
    "cpus-per-gpu": "CPUs per GPU",
    "constraint": "node features, e.g. --constraint=a100",
    "exclude": "nodes to avoid (names, not a file)",
    "nodelist": "nodes to use (names, not a file)",
    "reservation": "a reservation's name",
    "comment": "a comment shown by squeue",
    "mail-type": "mail the submitting user on BEGIN, END, FAIL, ...",
    "exclusive": "whole nodes (--exclusive, --exclusive=user or mcs)",
    "licenses": "licenses the job needs",
    "tmp": "minimum temporary disk",
    "nice": "a lower priority (--nice=100)",
}
# Forbidden options the pool sets through its own field: the 400 says which
_OWN_FIELD = {"partition": "partition", "account": "account", "time": "time_limit", "gres": "gres",
              "gpus": "gres", "job-name": "(set by the sidecar)", "output": "(set by the sidecar)",
              "error": "(set by the sidecar)", "parsable": "(set by the sidecar)", "wrap": "(the sidecar's script)",
              "chdir": "workdir", "array": "(one job per run)"}


class OptionError(ValueError):
    """An sbatch option a pool may not use; the text names it and the allow-list."""


def _allowed_text() -> str:
    return ", ".join(f"--{name}" for name in ALLOWED)


def _refuse(given: str, name: str | None, why: str) -> OptionError:
    own = _OWN_FIELD.get(name or "")
    hint = ""
    if own:
        hint = f" (use the pool's {own} field)" if not own.startswith("(") else f" {own}"
    return OptionError(f"slurm.sbatch_args: {given!r} {why}{hint}; allowed: {_allowed_text()}")


def resolve_long(name: str) -> str:
    """The option getopt_long takes ``--name`` for: an exact name, else the one option it is a prefix of."""
    if name in LONG:
        return _SAME.get(name, name)
    found = {_SAME.get(n, n) for n in LONG if n.startswith(name)}
    if not found:
        raise OptionError(f"slurm.sbatch_args: --{name} is not an sbatch option; allowed: {_allowed_text()}")
    if len(found) > 1:
        raise OptionError(f"slurm.sbatch_args: --{name} is ambiguous (sbatch could read it as "
                          f"{', '.join('--' + n for n in sorted(found))}); write the full name; "
                          f"allowed: {_allowed_text()}")
    return found.pop()


def _check_value(name: str, value: str | None) -> None:
    if value is None:
        return
    if value == "" or value != value.strip():
        raise OptionError(f"slurm.sbatch_args: --{name} needs a value without surrounding spaces")
    if value.startswith("-"):  # getopt would take it as the value; a user who wrote it meant an option
        raise OptionError(f"slurm.sbatch_args: --{name} would take {value!r} as its value; write --{name}=VALUE")
    if name in ("nodelist", "exclude") and "/" in value:  # sbatch reads a value with '/' as a file of names
        raise OptionError(f"slurm.sbatch_args: --{name}={value!r} names a file; give node names")
    if name == "exclusive" and value not in ("user", "mcs"):
        raise OptionError(f"slurm.sbatch_args: --exclusive takes no value, user or mcs, got {value!r}")
    if name == "nice" and not value.isdigit():  # a negative nice is the operator's
        raise OptionError(f"slurm.sbatch_args: --nice takes a whole number from 0, got {value!r}")


def parse_sbatch_args(args: Sequence[str]) -> tuple[str, ...]:
    """``args`` read as sbatch reads them; each allowed option as ``--name[=value]``, else OptionError."""
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(args):
        item = args[i]
        i += 1
        if item == "--" or not item.startswith("-") or item == "-":
            raise OptionError(f"slurm.sbatch_args: {item!r} is not an option (sbatch would take it as the job "
                              f"script or its arguments, which are the sidecar's); allowed: {_allowed_text()}")
        if item.startswith("--"):
            given, eq, glued = item[2:].partition("=")
            name = resolve_long(given)
            kind = LONG[name]
            value: str | None = glued if eq else None
            if kind == NONE and eq:
                raise OptionError(f"slurm.sbatch_args: --{name} takes no value, got {item!r}")
            if kind == REQ and not eq:
                if i >= len(args):
                    raise OptionError(f"slurm.sbatch_args: --{name} needs a value")
                value, i = args[i], i + 1  # getopt takes the next item whatever it is
            if name not in ALLOWED:
                raise _refuse(item, name, f"is --{name}, which a pool may not set")
            out.append((name, value))
            continue
        pos = 1
        while pos < len(item):  # bundled short options: -Wq long, -qlong
            letter = item[pos]
            pos += 1
            name = SHORT.get(letter)
            if name is None:
                raise OptionError(f"slurm.sbatch_args: -{letter} (in {item!r}) is not an sbatch option; "
                                  f"allowed: {_allowed_text()}")
            kind = LONG[name]
            value = None
            if kind != NONE and pos < len(item):
                value, pos = item[pos:], len(item)
            elif kind == REQ:
                if i >= len(args):
                    raise OptionError(f"slurm.sbatch_args: -{letter} needs a value")
                value, i = args[i], i + 1
            if name not in ALLOWED:
                raise _refuse(item, name, f"holds -{letter} (--{name}), which a pool may not set")
            out.append((name, value))
    for name, value in out:
        _check_value(name, value)
    return tuple(f"--{name}" if value is None else f"--{name}={value}" for name, value in out)
