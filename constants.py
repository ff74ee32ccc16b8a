"""One source of truth for XPU Fleet's constants, defaults and environment variable names.

Every other module imports from here; nothing re-states these numbers.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

VERSION = "0.1.0"
PLUGIN_NAME = "xpufleet"

# --- environment variables -------------------------------------------------------------------
ENV_HOME = "XPUFLEET_HOME"  # state dir (SQLite, runtime file, run dirs); default ~/.xpufleet
ENV_RUN_QUEUE_MAX_CONCURRENT = "XPUFLEET_RUN_QUEUE_MAX_CONCURRENT"  # "cuda:0=2,gpu-box/cuda:1=3"
ENV_WORKER_RESUME_GRACE_S = "XPUFLEET_WORKER_RESUME_GRACE_S"
ENV_CUDA_CONTEXT_MIB = "XPUFLEET_EXECUTION_CUDA_CONTEXT_MIB"
ENV_MODEL_DIRS = "XPUFLEET_MODEL_DIRS"  # os.pathsep-separated model folders when not hosted
ENV_MOUNTS = "XPUFLEET_MOUNTS"  # a worker run's storage mounts, JSON {"label": "/folder"} (set by the agent)
# folders graphs may read by absolute path, os.pathsep-separated (agent --data-root, or the owner's env)
ENV_DATA_ROOTS = "XPUFLEET_DATA_ROOTS"

# --- defaults ---------------------------------------------------------------------------------
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8288
HEARTBEAT_INTERVAL_S = 10.0
WORKER_RESUME_GRACE_S = 300.0
HEARTBEAT_LATE_BEATS = 3  # Degraded after this many heartbeat intervals without one
CUDA_CONTEXT_MIB = 768  # measured ~650 MiB on a CUDA 12 card; counted per run on a CUDA card
MEASURED_PEAK_HEADROOM = 1.2  # default budget = measured peak + 20%
DDP_COLLECTIVE_TIMEOUT_S = 30 * 60  # a rank waits this long in a collective (rendezvous included)
MAX_REQUEST_BODY_BYTES = 8 * 1024 * 1024

# --- slots (docs/sidecar.md) ---------------------------------------------------------------------------
ACCELERATOR_SLOT_LIMIT = 1
CPU_SLOT_LIMIT = 2

# --- run statuses (docs/sidecar.md) --------------------------------------------------------------------
RUN_STATUSES = ("queued", "assigned", "running", "succeeded", "failed", "cancelled", "interrupted")
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled", "interrupted"})
# Where a run came from (docs/canvas-runs.md): "api" = POST /api/runs (CLI, Queue on..., sweeps, studies),
# "canvas" = ComfyUI's own Run, executed in ComfyUI's process and recorded on the sidecar.
RUN_SOURCES = ("api", "canvas")
# What executes a queued run (server/comfyflow/kind.py): the fleet's executor, or a ComfyUI on the card.
RUN_KIND_GRAPH = "graph"
RUN_KIND_COMFYUI = "comfyui"
RUN_KINDS = (RUN_KIND_GRAPH, RUN_KIND_COMFYUI)
# The headless ComfyUIs that run ComfyUI runs (server/run/comfy_instances.py, docs/workers.md "Any workflow
# on a fleet card"): one per device set, started on demand, kept warm, stopped when idle.
ENV_COMFYUI = "XPUFLEET_COMFYUI"  # the ComfyUI folder an agent/sidecar uses when --comfyui is not given
ENV_COMFYUI_PYTHON = "XPUFLEET_COMFYUI_PYTHON"  # its interpreter when --comfyui-python is not given
# more arguments for every instance, split like a shell line (e.g. "--extra-model-paths-config /srv/models.yaml")
ENV_COMFYUI_ARGS = "XPUFLEET_COMFYUI_ARGS"
ENV_COMFYUI_START_TIMEOUT_S = "XPUFLEET_COMFYUI_START_TIMEOUT_S"
COMFYUI_START_TIMEOUT_S = 180.0  # a starting instance must answer GET /system_stats within this
ENV_COMFYUI_IDLE_S = "XPUFLEET_COMFYUI_IDLE_S"
COMFYUI_IDLE_S = 600.0  # an instance with no run for this long is stopped
COMFYUI_STOP_GRACE_S = 10.0  # SIGTERM to an instance's process group, SIGKILL after this
COMFYUI_DIRNAME = "comfyui"  # $XPUFLEET_HOME/comfyui/<agent or "local">/<instance key>/
COMFYUI_LOG_NAME = "comfyui.log"
COMFYUI_PROBE_KEY = "probe"  # the reading's instance (--cpu, no card)
COMFYUI_HTTP_TIMEOUT_S = 30.0  # one HTTP call to an instance (/prompt, /view, /object_info)

# --- device kinds --------------------------------------------------------------------------------
DEVICE_KINDS = ("cpu", "cuda", "xpu", "mps")
ACCELERATOR_KINDS = frozenset({"cuda", "xpu", "mps"})

# --- worker agents (docs/workers.md) ------------------------------------------------------------------
WORKER_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # worker and pool names
ENV_HEARTBEAT_INTERVAL_S = "XPUFLEET_HEARTBEAT_INTERVAL_S"  # tests shorten the 10 s heartbeat
AGENT_WS_PATH = "/api/agents/ws"
AGENT_PROTOCOL = 1  # bumped when agent<->sidecar messages change incompatibly
AGENT_HELLO_TIMEOUT_S = 10.0  # the sidecar closes a WebSocket that does not say hello in time
AGENT_RECONNECT_MAX_S = 10.0  # reconnect backoff ceiling (1, 2, 4, ... seconds)
SHUTDOWN_ACK_WAIT_S = 5.0  # a stopping agent waits at most this long for the server to ack its runs' last events
JOIN_TOKEN_TTL_S = 24 * 3600  # a one-time join token expires after a day
ENV_SSH = "XPUFLEET_SSH"  # the ssh client SSH workers use (default: ssh on PATH)
ENV_SSH_CONFIG = "XPUFLEET_SSH_CONFIG"  # an ssh config file passed (-F) to every ssh the sidecar runs
SIMULATED_UUID_PREFIX = "GPU-5e1a7ed0"  # simulated cards' UUIDs start with this (never a real one)

# --- graph nodes (docs/nodes.md) ---------------------------------------------------------------------
DEFAULT_HOME = "~/.xpufleet"  # XPUFLEET_HOME when the env var is unset
OUTPUTS_DIRNAME = "outputs"  # ModelSaver/ModelLoader relative paths: <home>/outputs (ComfyUI: output/xpufleet)
NODE_PROGRESS_INTERVAL_S = 0.25  # long nodes report progress / train_loss_batch at most this often
# Simulated cards: the per-op tensor meter counts a TrainingLoop's first this many optimizer steps (and
# its first validation) in full: the peak is reached by then (Adam makes its state at step 1, DDP rebuilds
# its buckets in step 2); it pauses over the steps that repeat them (docs/architecture.md, "Simulated cards").
MEMORY_METER_FULL_STEPS = 2
CHECKPOINTS_DIRNAME = "checkpoints"  # under the run dir
TENSORBOARD_DIRNAME = "tensorboard"  # under the run dir

# --- success-rate predictor (docs/predictor.md) ----------------------------------------------------
BYTES_PER_GB = 1024**3  # every *_gb figure is GiB (torch and NVML report bytes; docs/predictor.md's "GB")
PREDICTOR_ALPHA = 0.9  # VRAM fragmentation discount
PREDICTOR_V_EFF_FLOOR_GB = 0.1  # V_eff = max(0.1, alpha x V_reclaim)
PREDICTOR_GAMMA = {"nvidia": 4.0, "intel": 1.0}  # hard-constraint platform factor (UVM headroom)
PREDICTOR_DEFAULT_GAMMA = 1.0  # platforms not in the table nor configured (amd, apple, cpu): strict
ENV_PREDICTOR_GAMMA = "XPUFLEET_PREDICTOR_GAMMA"  # "amd=2.0,apple=1.5" adds/overrides gamma by platform
PREDICTOR_P_PEAK_FLOOR = 0.02  # P_peak never below this while D_peak > 0
# (min percent, key, colour, zh, en), best first; P_success is compared after rounding
PREDICTOR_LEVELS = (
    (95, "smooth", "#52c41a", "轻松", "Smooth"),
    (80, "safe", "#afff00", "安全", "Safe"),
    (40, "warning", "#faad14", "预警", "Warning"),
    (0, "critical", "#ff4d4f", "危险", "Critical"),
)
SNAPSHOT_TTL_S = 1.0  # device/RAM snapshots are cached this long (cheap reads for the status bar)
CONFIG_FILENAME = "config.yaml"  # under XPUFLEET_HOME: model_dirs, predictor.gamma
RUNTIME_FILENAME = "runtime.json"  # under XPUFLEET_HOME: {"url", "token"} of the running sidecar
PREDICTOR_ACTIVATION_FRACTION = 0.2  # P3 activation overhead when enabled with `true`: +20% of M_peak
PREDICTOR_CALIBRATION_FILENAME = "predictor_calibration.jsonl"  # under XPUFLEET_HOME
PREDICTOR_CALIBRATION_KEEP = 200  # newest measured-peak samples kept
PREDICTOR_CALIBRATION_RANGE = (0.25, 4.0)  # calibration factor is clamped to this

# --- sidecar (issue 3: run queue, HTTP API, CLI) ------------------------------------------------
LOCAL_PROVIDER = "local"  # the sidecar's own provider name in slots, placements and limits
ENV_ALLOWED_HOSTS = "XPUFLEET_ALLOWED_HOSTS"  # extra Host header names accepted (comma-separated)
STATE_DB_NAME = "state.db"
SIDECAR_LOG_NAME = "sidecar.log"  # stdout/stderr of a background `xpufleet start`
SIDECAR_LOCK_NAME = "sidecar.lock"  # flock: one sidecar per XPUFLEET_HOME
AGENT_SOCKET_NAME = "agents.sock"  # $XPUFLEET_HOME/agents.sock: the Unix socket SSH workers' tunnels end at
RUNS_DIR_NAME = "runs"  # $XPUFLEET_HOME/runs/<run_id>/ (spec.json, output.log, events.jsonl, artifacts)
RECORDED_OUTPUTS_DIRNAME = "recorded_outputs"  # <run dir>/recorded_outputs: record_outputs (docs/workers.md)
ENV_WARM_START = "XPUFLEET_WARM_START"  # "0": run processes start as new interpreters (no forkserver)
# The module the warm start parent imports (server/run/warm.py): it also counts what a forked run freezes.
WARM_PRELOAD_MODULE = "xpufleet.server.run.preload"
RUN_STOP_GRACE_S = 30.0  # after `stop`, a run child gets this long to write its checkpoint and exit
SIDECAR_START_TIMEOUT_S = 60.0  # `xpufleet start` waits this long for /api/health
SIDECAR_STOP_TIMEOUT_S = RUN_STOP_GRACE_S + 15.0  # `xpufleet stop` waits this long, then SIGKILL
STORE_FLUSH_ON_CLOSE_S = 10.0  # at shutdown the store's writer gets this long to write its queue to state.db
STORE_BUSY_TIMEOUT_S = 1.0  # the writer's wait on another connection's write lock before it retries (backoff)
EVENTS_LONG_POLL_MAX_S = 60.0  # GET /api/runs/{id}/events?wait= is capped at this
EVENTS_PAGE_MAX = 1000  # events per GET /api/runs/{id}/events answer
RUNS_PAGE_MAX = 1000  # runs per GET /api/runs answer
PROGRESS_EVENT_MIN_INTERVAL_S = 0.05  # a run child sends at most ~20 progress events/s per node
MAX_DEVICE_SET = 64  # devices in one target.devices

# --- input limits (issue 9): every route refuses beyond these with a 400/413 that states the limit ---
MAX_JSON_DEPTH = 64  # nesting of objects/arrays in any JSON body (a graph needs ~6)
MAX_GRAPH_NODES = 10_000  # nodes in one graph (413 beyond)
MAX_NODE_ID_CHARS = 128  # a node id ("12", or "12:5:3" inside a subgraph)
MAX_FIELD_NAME_CHARS = 256  # a class_type, an input name, any key of a graph node
MAX_GRAPH_STRING_CHARS = 65_536  # one string value in a graph (a widget value, a layer spec)
MAX_RUN_NAME_CHARS = 200  # options.name
MAX_PATH_CHARS = 1024  # a file path a node writes or a route names (relative to its folder)
MAX_PATH_PART_BYTES = 255  # one component of it, in UTF-8 (NAME_MAX of common file systems)
MAX_GRAPH_ERRORS_LISTED = 100  # a validation answer lists this many problems and counts the rest
MAX_CYCLE_PATH_SHOWN = 20  # node ids shown of one dependency cycle's path (its length is given)
MAX_DEPENDENT_OUTPUTS_LISTED = 50  # output nodes listed per failing node (ComfyUI's dependent_outputs)
OFF_LOOP_BODY_BYTES = 256 * 1024  # bodies larger than this are parsed in a worker thread
MAX_REQUEST_LINE_BYTES = 64 * 1024  # the HTTP request line (aiohttp's default is 8190)
# --- ddp training (docs/ddp.md) ---------------------------------------------------------------------
ENV_DDP_RANK = "XPUFLEET_DDP_RANK"  # set by the launcher on follower ranks 1..N-1 (rank 0 is the run)
# Set on every rank unless the agent's own environment sets them: loopback only, one thread per rank.
DDP_RANK_ENV_DEFAULTS = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
DDP_DIRNAME = "ddp"  # under the run dir: the rendezvous file and the followers' event logs
DDP_RENDEZVOUS_FILENAME = "rendezvous"  # torch.distributed FileStore (file:// init_method)
# ddp across workers (docs/architecture.md "ddp across workers"): rank 0's TCPStore "host:port", given to
# every other rank; the address an agent advertises for it (--advertise-addr; loopback only in tests).
ENV_DDP_STORE = "XPUFLEET_DDP_STORE"
AGENT_ADVERTISE_ADDR_DEFAULT = "127.0.0.1"
# How long the sidecar holds a spread run's result for its other workers' ranks to end and report.
SPREAD_PARTS_WAIT_S = RUN_STOP_GRACE_S + 15.0
# The ranks agree on stop / report every K batches, not every batch (nodes/ddp.py): rank 0 picks K so that
# agreements come about this often, K growing at most 2x per agreement, up to the cap.
DDP_AGREE_INTERVAL_S = 0.2  # ddp ranks agree on stop/report about this often (a stop lands within ~2 intervals)
DDP_AGREE_MAX_BATCHES = 1024
# Tests only: "RANK:BATCH" makes that rank raise a RuntimeError after that many training batches.
ENV_TEST_DDP_RAISE = "XPUFLEET_TEST_DDP_RAISE"

# --- memory budgets and the static estimate (docs/memory.md, issue 12) -----------------------------------
# CUDA_CONTEXT_MIB (above) is what every run counts beside its budget on a CUDA card.
MEMORY_ESTIMATE_TIMEOUT_S = 5.0  # the meta-device build of a graph's models is abandoned after this long
# A graph that runs a model in more places (TrainingLoops, Evaluates, Predicts) is "too large to estimate":
# no build (each place is one meta-device build; 5,000 of them only ran into the time limit, issue 19)
ESTIMATE_MAX_MODEL_USES = 100
# The static estimate's margins, fitted to the first real-GPU run (an H200, 2026-12-04: docs/gpu-check.md):
# reserved peaks were 64-66 MiB for graphs of a few KiB (cuBLAS workspaces), 1.05-1.35x the tensors beyond
# that, and convolution graphs reserved about their activations again (cuDNN workspaces, freed blocks).
ESTIMATE_ALLOCATOR_FRACTION = 0.3  # +30% of the items for the caching allocator
ESTIMATE_CUDA_LIBRARIES_MIB = 72  # ... +72 MiB for the CUDA libraries' workspaces
ESTIMATE_CONV_WORKSPACE_FRACTION = 1.0  # ... and a model with convolutions: its activations once more
MEMORY_OVERTAKES_BEFORE_HOLD = 3  # a waiting run overtaken this often on a shared card holds that card for itself
ENV_LOCAL_SHARED_CARDS = "XPUFLEET_LOCAL_SHARED_CARDS"  # "cuda:0,cuda:1": this server's cards admitted by memory
AGENT_CAP_MEMORY = "memory_cap"  # the hello capability of an agent that caps a run's allocator to its budget
AGENT_CAP_COMFYUI = "comfyui"  # the hello capability of an agent given a ComfyUI: its reading follows


# --- sweeps and studies (docs/sweeps.md, issue 15) ------------------------------------------------------------
SWEEP_DEFAULT_MAX_RUNS = 1000  # a sweep or study may queue this many runs unless its max_runs says more
SWEEP_MAX_RUNS = 10_000  # ... and never more than this (a larger expansion is a 400, never truncated)
SIDECAR_GIL_SWITCH_INTERVAL_S = 0.001  # the sidecar's sys.setswitchinterval (Python's default: 5 ms)
SWEEP_ADMIT_BATCH = 250  # a sweep's children admitted on the event loop between two yields to it
CANCEL_BATCH_RUNS = 250  # a sweep's queued runs end this many per store transaction (in a worker thread)
STUDY_MAX_PARALLEL = 256  # trials of one study in flight at once


# --- pools that Slurm starts, Kubernetes export (issue 23; docs/slurm-and-k8s.md) ----------------------
SLURM_TICK_S = 1.0  # the sidecar reads squeue and decides what to submit/cancel this often (pools with work)
SLURM_CMD_TIMEOUT_S = 30.0  # one sbatch/squeue/scancel call is abandoned after this long
SLURM_DEFAULT_GRES = "gpu:1"  # a job's --gres unless the pool says otherwise
SLURM_DEFAULT_MAX_JOBS = 4  # pending + running jobs of one pool at most
SLURM_DEFAULT_IDLE_EXIT_S = 60.0  # an instance that joined and has taken no run is told to leave after this
SLURM_DEFAULT_RETRIES = 2  # a run's job that ends without joining is submitted again this often, then the run fails
SLURM_RETRY_BASE_S = 2.0  # backoff before retry k: base * 2**(k-1), capped, times a jitter in [0.5, 1.5)
SLURM_RETRY_CAP_S = 120.0
SLURM_OUTPUT_TAIL_LINES = 8  # a job that ended without joining is reported with this many last output lines
SLURM_JOB_NAME_PREFIX = "xpufleet-"  # + the pool's tag: how squeue's jobs are matched to a pool after a restart
K8S_GPU_RESOURCE = "nvidia.com/gpu"


def home_dir(env: dict[str, str] | None = None) -> Path:
    """``$XPUFLEET_HOME`` (``~`` expanded), else ``~/.xpufleet``: the one place the state folder is
    derived, for the sidecar, the agent, the CLI, the nodes and the predictor alike."""
    env = os.environ if env is None else env
    raw = env.get(ENV_HOME, "").strip()
    return Path(os.path.expanduser(raw or DEFAULT_HOME)).resolve()

# --- ComfyUI templates (docs/templates.md) --------------------------------------------------------
SAMPLES_DIR = "samples"  # API-format graphs, service specs, request bodies, sweep/study YAML
TEMPLATES_DIR = "example_workflows"  # workflow-format twins + .jpg thumbnails: ComfyUI's Templates browser


# --- results on ComfyUI's canvas (docs/canvas.md) ----------------------------------------------------
CANVAS_METRIC_EVENT = "xpufleet.metric"  # the websocket message a hosted TrainingLoop sends per metric point
CANVAS_CURVE_POINTS = 400  # at most this many points per series in a TrainingLoop's ui output (history)
# A canvas Run recorded on the sidecar (docs/canvas-runs.md): the plugin inside ComfyUI sends what its nodes
# report every CANVAS_FLUSH_S, at most CANVAS_EVENTS_MAX events a request; the sidecar stores these types.
CANVAS_FLUSH_S = 0.5
CANVAS_EVENTS_MAX = 1000
CANVAS_EVENT_TYPES = ("progress", "metric", "run_warning", "log", "artifact")
CANVAS_PROGRESS_MIN_S = 0.5  # a node's progress goes to the sidecar at most this often (the last one always)

# options.deterministic (README "CLI"): torch's strict deterministic mode; on CUDA, cuBLAS is deterministic
# only with a fixed workspace, which must be in the environment before its first handle is made.
CUBLAS_WORKSPACE_CONFIG_DETERMINISTIC = ":4096:8"

# Canvas runs (docs/canvas-runs.md): what one run may hold (past either: 413, the run ends interrupted),
# how often the sidecar checks that each running one's ComfyUI lives, and how long a cancel waits for
# ComfyUI to confirm before the sidecar ends the run itself
CANVAS_RUN_EVENTS_MAX = 250_000  # a long canvas training logs a loss per batch: room for that, and for the 100,000-event stream test
CANVAS_RUN_EVENT_BYTES_MAX = 32 * 1024 * 1024
CANVAS_WATCH_S = 2.0
CANVAS_CANCEL_GRACE_S = 10.0

# --- reading a large run's events (docs/events.md "Reading a large run") ----------------------------------
# A stream (GET /api/runs/{id}/events/stream) reads, encodes and writes at most EVENTS_STREAM_PAGE events a
# step, then lets the event loop serve everyone else; its writes are EVENTS_STREAM_CHUNK_BYTES at most, and
# it stops reading while more than EVENTS_STREAM_BUFFERED_BYTES wait unsent for its client (aiohttp's drain):
# a slow reader holds about that much of the sidecar's memory, never its whole history. However many streams
# are open, at most EVENTS_STREAM_PAGES_AT_ONCE of them make a page in one turn of the event loop (they take
# turns). The metric reads (GET .../metrics, .../metrics.csv) step through the store the same way.
EVENTS_STREAM_PAGE = 250
EVENTS_STREAM_PAGES_AT_ONCE = 1
EVENTS_STREAM_CHUNK_BYTES = 64 * 1024
EVENTS_STREAM_BUFFERED_BYTES = 256 * 1024

# --- durable acknowledgement (docs/sidecar.md, "State on disk") -------------------------------------
# A create answers 201 only once its transaction is in state.db; a write the file refuses longer than this
# (another process holds its lock) is answered 503 and the create is taken back. A full disk: 507 at once.
STORE_ACK_TIMEOUT_S = 10.0
STORE_GROUP_MAX = 512  # committed transactions the writer puts in one file transaction (one fsync) at most
