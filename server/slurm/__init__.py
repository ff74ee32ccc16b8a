"""Pools that Slurm starts (docs/slurm-and-k8s.md): the sidecar submits one job per waiting run; each
job runs a one-shot agent that joins the pool with the cards Slurm gave it.

Pure parts: :mod:`.spec` (settings), :mod:`.script` (sbatch argv and job script), :mod:`.squeue`
(parsing), :mod:`.scaling` (what to submit/cancel, retry backoff). I/O: :mod:`.slurmctl` (the Slurm
CLI) and :mod:`.manager` (SQLite, the loop).
"""
