"""Names shared by the graph nodes: link types, node class names, categories and combo choices.

Link types carry an ``XPU_`` prefix so they never meet ComfyUI's own ``MODEL`` / ``LATENT`` sockets;
node class names carry an ``XPU`` prefix so they never clash with another custom-node pack. Other
parts of the product (executor, memory estimator, workflow scan) import these names from here.
"""

from __future__ import annotations

# --- link (socket) types --------------------------------------------------------------------------
DATASET = "XPU_DATASET"  # a map-style torch Dataset (our XpuTensorDataset carries ``.info``)
DATASET_INFO = "XPU_DATASET_INFO"  # dict: task, num_features, num_classes, input_shape, ...
DATALOADER = "XPU_DATALOADER"  # a real torch.utils.data.DataLoader over a map-style dataset
MODEL = "XPU_MODEL"  # a torch.nn.Module carrying ``xpu_spec`` (how to rebuild it)
OPTIMIZER = "XPU_OPTIMIZER"  # OptimizerSpec: built against the model's parameters by the loop
LR_SCHEDULER = "XPU_LR_SCHEDULER"  # SchedulerSpec: built against the optimizer by the loop
LOSS = "XPU_LOSS"  # LossSpec
METRICS = "XPU_METRICS"  # dict of metric name -> value / history
TENSOR = "XPU_TENSOR"  # a torch.Tensor (predictions)

# --- node class names (NODE_CLASS_MAPPINGS keys) ------------------------------------------------------
DATASET_NODE = "XPUDataset"
DATALOADER_NODE = "XPUDataLoader"
MLP_NODE = "XPUMLP"
CNN_NODE = "XPUCNN"
SEQUENTIAL_NODE = "XPUSequential"
OPTIMIZER_NODE = "XPUOptimizer"
LR_SCHEDULER_NODE = "XPULRScheduler"
LOSS_NODE = "XPULoss"
TRAINING_LOOP_NODE = "XPUTrainingLoop"
EVALUATE_NODE = "XPUEvaluate"
MODEL_SAVER_NODE = "XPUModelSaver"
MODEL_LOADER_NODE = "XPUModelLoader"
PREDICT_NODE = "XPUPredict"

# --- categories ---------------------------------------------------------------------------------------
CATEGORY_ROOT = "XPU Fleet"
CATEGORY_DATA = f"{CATEGORY_ROOT}/data"
CATEGORY_MODELS = f"{CATEGORY_ROOT}/models"
CATEGORY_TRAINING = f"{CATEGORY_ROOT}/training"
CATEGORY_IO = f"{CATEGORY_ROOT}/io"

# --- combo choices --------------------------------------------------------------------------------------
BUNDLED_DATASETS = ["digits", "iris", "wine", "breast_cancer", "diabetes"]
SYNTHETIC_DATASETS = ["synthetic_classification", "synthetic_regression", "synthetic_images", "synthetic_sequences"]
FILE_DATASETS = ["csv", "safetensors"]
DATASET_CHOICES = BUNDLED_DATASETS + SYNTHETIC_DATASETS + FILE_DATASETS
NORMALIZE_CHOICES = ["standard", "minmax", "none"]
TASK_CHOICES = ["auto", "classification", "regression"]

ACTIVATION_CHOICES = ["relu", "gelu", "tanh", "sigmoid", "leaky_relu", "silu", "elu"]
OPTIMIZER_CHOICES = ["adam", "adamw", "sgd", "sgd_momentum", "rmsprop"]
SCHEDULER_CHOICES = ["none", "step", "cosine", "exponential", "onecycle"]
SCHEDULER_INTERVALS = ["epoch", "step"]
LOSS_CHOICES = ["cross_entropy", "mse", "bce_with_logits", "l1", "smooth_l1"]
PRECISION_CHOICES = ["fp32", "bf16", "fp16"]
STRATEGY_CHOICES = ["single", "ddp"]
MODEL_FORMATS = ["safetensors", "pytorch"]
SAVE_LOCATIONS = ["outputs", "run_dir"]
PREDICT_OUTPUTS = ["auto", "classes", "probabilities", "raw"]

# Losses whose outputs are class scores (accuracy is meaningful).
CLASSIFICATION_LOSSES = frozenset({"cross_entropy", "bce_with_logits"})
