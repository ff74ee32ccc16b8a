"""One copy of the node code: the nodes run the functions of ``nodes/lib/`` and ``xpufleet export`` inlines
those same functions' source into every script (docs/export.md), so a script cannot drift from a run."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import sys
from pathlib import Path

import pytest
import torch

from xpufleet.nodes import data, evaluation, io, models, specs, trainer
from xpufleet.nodes import lib as node_lib
from xpufleet.server.run import export_data, export_train
from xpufleet.server.run.export import _lib_source, code_after_marker, export_script, library_modules

SAMPLES = Path(__file__).resolve().parents[3] / "samples"
LIB_MODULES = [importlib.import_module(f"xpufleet.nodes.lib.{name}") for name in node_lib.SCRIPT_MODULES]
# What the library may import after its marker line: what an exported script needs, nothing of xpufleet.
SCRIPT_IMPORTS = {"torch", "numpy", "sklearn", "safetensors"}


def own_definitions(module):
    """The functions and classes ``module`` itself defines."""
    return [obj for _, obj in inspect.getmembers(module, lambda o: inspect.isfunction(o) or inspect.isclass(o))
            if obj.__module__ == module.__name__]


@pytest.fixture(scope="module")
def script() -> str:
    graph = json.loads((SAMPLES / "cnn_digits.json").read_text())
    return export_script(graph, "cnn_digits.json")[0]


@pytest.mark.parametrize("module", LIB_MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_every_library_function_is_in_the_script_verbatim(module, script):
    defined = own_definitions(module)
    assert defined, module.__name__
    for obj in defined:
        assert inspect.getsource(obj) in script, f"{module.__name__}.{obj.__name__} is not inlined verbatim"
    path = Path(module.__file__)
    assert code_after_marker(path, node_lib.SCRIPT_MARKER) in script


def test_the_script_holds_each_library_module_once_in_order(script):
    library = _lib_source()
    assert library in script
    starts = [library.index(code_after_marker(path, marker)) for _, path, marker in library_modules()]
    assert starts == sorted(starts)
    assert [title for title, _, _ in library_modules()][:len(LIB_MODULES)] == \
        [f"nodes/lib/{name}.py" for name in node_lib.SCRIPT_MODULES]


@pytest.mark.parametrize("module", LIB_MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_the_library_stands_alone(module):
    """After the marker: the standard library and the script's four dependencies only. Above it: only
    siblings inlined earlier (a script holds them before this module, in the same namespace)."""
    text = Path(module.__file__).read_text(encoding="utf-8")
    marker_line = text[:text.index(node_lib.SCRIPT_MARKER)].count("\n") + 1
    earlier = set(node_lib.SCRIPT_MODULES[:node_lib.SCRIPT_MODULES.index(module.__name__.rsplit(".", 1)[1])])
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and node.level:
            assert node.lineno < marker_line and node.module in earlier, (module.__name__, node.lineno)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            for name in names:
                top = name.split(".")[0]
                assert top in SCRIPT_IMPORTS or top in sys.stdlib_module_names or top == "__future__", \
                    (module.__name__, name)


def test_no_name_is_defined_twice_in_a_scripts_library():
    """In a script every module shares one namespace: a second definition would silently replace the first."""
    seen: dict[str, int] = {}
    for node in ast.parse(_lib_source()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        else:
            continue
        for name in names:
            assert name not in seen, f"{name} defined on lines {seen[name]} and {node.lineno} of the library"
            seen[name] = node.lineno


def test_the_nodes_and_the_script_call_the_same_functions():
    from xpufleet.nodes.lib import datasets, layers, losses, modelfile, optim
    from xpufleet.nodes.lib import evaluation as lib_evaluation
    from xpufleet.nodes.lib import precision as lib_precision

    same = [
        (data.split_indices, datasets.split_indices), (export_data.split_indices, datasets.split_indices),
        (models.mlp_layers, layers.mlp_layers), (export_data.mlp_layers, layers.mlp_layers),
        (models.cnn_layers, layers.cnn_layers), (models.make_spec, layers.make_spec),
        (specs.LossFn, losses.LossFn), (export_train.LossFn, losses.LossFn),
        (evaluation.accuracy_counts, losses.accuracy_counts), (evaluation.batch_xy, lib_evaluation.batch_xy),
        (export_train.evaluate, lib_evaluation.evaluate), (io.read_model_file, modelfile.read_model_file),
        (export_train.read_model_file, modelfile.read_model_file), (trainer.CHECKPOINT_FORMAT, modelfile.CHECKPOINT_FORMAT),
        (export_train.optimizer_step, optim.optimizer_step),
        (export_train.choose_precision, lib_precision.choose_precision),
    ]
    for mine, theirs in same:
        assert mine is theirs, mine
    # and the nodes' own code goes through them: a spec builds what the library's factory makes
    opt = specs.OptimizerSpec(name="sgd_momentum", momentum=0.0).build([torch.nn.Parameter(torch.zeros(1))])
    assert opt.param_groups[0]["momentum"] == 0.0
