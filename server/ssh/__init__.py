"""SSH workers (docs/workers.md): the sidecar reaches a host through the user's OpenSSH set-up, puts the same
xpufleet there in a folder of its own, starts the agent and brings its connection back through the
ssh tunnel, so no port opens on either machine.

* ``commands``: the ssh command lines and the small Python scripts run on the host (pure);
* ``bundle``: the running package as a tarball, and its build id (a version mismatch updates the host);
* ``supervisor``: one SSH worker's connection: probe, install, tunnel, reconnect with backoff;
* ``records``: the ``ssh_workers`` table (:class:`~.records.SshEntry`: how to reach the host, the agent's
  options and credential, disabled or not);
* ``manager``: every SSH worker (persisted), add / disable / enable / remove, the Workers data.
"""
