"""Workflow scan (docs/predictor.md) on ComfyUI's real workflow templates, with sparse model files on disk."""

from __future__ import annotations

import json
import os

import pytest

from xpufleet.predictor.resolve import (
    DirsResolver,
    FolderPathsResolver,
    UnsafeModelName,
    check_model_name,
    default_resolver,
)
from xpufleet.predictor.scan import WorkflowFormatError, scan_workflow

GiB = 1024**3


def _loader_nodes(wf):
    nodes = list(wf["nodes"])
    for sg in (wf.get("definitions") or {}).get("subgraphs") or []:
        nodes += sg["nodes"]
    return nodes


def test_bypassed_loaders_are_skipped(template, sparse, models_root):
    wf = template("video_hunyuan_video_1.5_720p_t2v.json")
    by_id = {n["id"]: n for n in wf["nodes"]}
    # the template's own state: two loaders bypassed (mode 4), the rest active
    assert by_id[111]["mode"] == 4 and by_id[108]["mode"] == 4
    bypassed_unet = by_id[111]["widgets_values"][0]
    active_unet = by_id[12]["widgets_values"][0]
    assert bypassed_unet != active_unet
    sizes = {
        f"diffusion_models/{active_unet}": 16 * GiB,
        f"diffusion_models/{bypassed_unet}": 30 * GiB,  # would be M_peak if it were counted
        "latent_upscale_models/" + by_id[108]["widgets_values"][0]: 3 * GiB,
        "text_encoders/qwen_2.5_vl_7b_fp8_scaled.safetensors": 7 * GiB,
        "text_encoders/byt5_small_glyphxl_fp16.safetensors": GiB // 2,
        "vae/hunyuanvideo15_vae_fp16.safetensors": 2 * GiB + GiB // 2,
    }
    for rel, size in sizes.items():
        sparse(models_root / rel, size)
    res = scan_workflow(wf, DirsResolver([models_root]))
    assert res.format == "ui"
    assert {m.name for m in res.models} == {
        active_unet, "qwen_2.5_vl_7b_fp8_scaled.safetensors", "byt5_small_glyphxl_fp16.safetensors",
        "hunyuanvideo15_vae_fp16.safetensors"}
    assert all(m.status == "found" for m in res.models)
    assert res.m_peak_gb == pytest.approx(16.0)
    assert res.m_total_gb == pytest.approx(16 + 7 + 0.5 + 2.5)
    skipped = {(s["node"], s["mode"]) for s in res.skipped}
    assert ("111", "bypassed") in skipped and ("108", "bypassed") in skipped
    # unbypass the upscaler: now it counts
    by_id[108]["mode"] = 0
    res2 = scan_workflow(wf, DirsResolver([models_root]))
    assert res2.m_total_gb == pytest.approx(res.m_total_gb + 3)


def test_muted_node_is_skipped_too(template, sparse, models_root):
    wf = template("video_hunyuan_video_1.5_720p_t2v.json")
    sparse(models_root / "vae/hunyuanvideo15_vae_fp16.safetensors", GiB)
    before = scan_workflow(wf, DirsResolver([models_root]))
    next(n for n in wf["nodes"] if n["id"] == 10)["mode"] = 2
    after = scan_workflow(wf, DirsResolver([models_root]))
    assert before.m_total_gb == pytest.approx(1.0) and after.m_total_gb == 0.0
    assert {"node": "10", "class_type": "VAELoader", "mode": "muted"} in after.skipped


def test_subgraphs_included_and_bypassed_instance_skipped(template, sparse, models_root):
    wf = template("image_flux2_klein_text_to_image.json")
    insts = {n["id"]: n for n in wf["nodes"] if n["type"] in {s["id"] for s in wf["definitions"]["subgraphs"]}}
    assert insts[75]["mode"] == 0 and insts[77]["mode"] == 4
    sparse(models_root / "diffusion_models/flux-2-klein-base-4b.safetensors", 8 * GiB)
    sparse(models_root / "diffusion_models/flux-2-klein-4b.safetensors", 40 * GiB)  # only in the bypassed one
    sparse(models_root / "text_encoders/qwen_3_4b.safetensors", 5 * GiB)
    sparse(models_root / "vae/flux2-vae.safetensors", GiB)
    res = scan_workflow(wf, DirsResolver([models_root]))
    assert sorted((m.node, m.name) for m in res.models) == [
        ("75:70", "flux-2-klein-base-4b.safetensors"),
        ("75:71", "qwen_3_4b.safetensors"),
        ("75:72", "flux2-vae.safetensors"),
    ]
    assert res.m_peak_gb == pytest.approx(8.0) and res.m_total_gb == pytest.approx(14.0)
    assert any(s["node"] == "77" and s["mode"] == "bypassed" for s in res.skipped)
    # switch the instances: the other subgraph's models count instead
    insts[75]["mode"], insts[77]["mode"] = 4, 0
    res2 = scan_workflow(wf, DirsResolver([models_root]))
    assert res2.m_peak_gb == pytest.approx(40.0)
    assert {m.node.split(":")[0] for m in res2.models} == {"77"}


def test_nested_subgraphs(template, sparse, models_root):
    wf = template("flux_depth_lora_example.json")
    names = {"vae/vae-ft-mse-840000-ema-pruned.safetensors": 1, "diffusion_models/lotus-depth-d-v1-1.safetensors": 3,
             "diffusion_models/flux1-dev-fp8.safetensors": 11, "loras/flux1-depth-dev-lora.safetensors": 1,
             "text_encoders/clip_l.safetensors": 1, "text_encoders/t5xxl_fp16.safetensors": 9,
             "vae/ae.safetensors": 1}
    for rel, gib in names.items():
        sparse(models_root / rel, gib * GiB)
    res = scan_workflow(wf, DirsResolver([models_root]))
    nested = {m.node: m.name for m in res.models if m.node.count(":") == 2}
    assert nested == {"150:41:89": "vae-ft-mse-840000-ema-pruned.safetensors",
                      "150:41:87": "lotus-depth-d-v1-1.safetensors"}
    assert res.m_total_gb == pytest.approx(sum(names.values()))
    assert res.m_peak_gb == pytest.approx(11.0)


def test_promoted_widget_takes_the_instance_value(template, sparse, models_root):
    wf = template("3d_hunyuan3d-v2.1.json")
    inst = next(n for n in wf["nodes"] if n["id"] == 19)
    inner = next(n for n in wf["definitions"]["subgraphs"][0]["nodes"] if n["type"] == "ImageOnlyCheckpointLoader")
    assert inst["widgets_values"][-1] == inner["widgets_values"][0] == "hunyuan_3d_v2.1.safetensors"
    sparse(models_root / "checkpoints/hunyuan_3d_v2.1.safetensors", 7 * GiB)
    sparse(models_root / "checkpoints/edited_on_the_instance.safetensors", 2 * GiB)
    res = scan_workflow(wf, DirsResolver([models_root]))
    assert [(m.node, m.name, m.source) for m in res.models] == [("19:1", "hunyuan_3d_v2.1.safetensors", "promoted")]
    # the user picks another file on the subgraph instance: that value is the one ComfyUI runs
    inst["widgets_values"][-1] = "edited_on_the_instance.safetensors"
    res2 = scan_workflow(wf, DirsResolver([models_root]))
    assert [m.name for m in res2.models] == ["edited_on_the_instance.safetensors"]
    assert res2.m_peak_gb == pytest.approx(2.0)


def test_same_file_loaded_twice_counts_once(template, sparse, models_root):
    # LTX-2 templates load one checkpoint through two loader nodes (text encoder + audio VAE)
    name = next(p.name for p in _ltx_templates())
    wf = template(name)
    res = scan_workflow(wf, DirsResolver([models_root]))
    ckpts = [m for m in res.models if m.folder == "checkpoints"]
    assert len({m.name for m in ckpts}) < len(ckpts)  # the template's own duplication
    for m in res.models:
        sparse(models_root / m.folder / m.name, GiB)
    res = scan_workflow(wf, DirsResolver([models_root]))
    assert res.m_total_gb == pytest.approx(len({(m.folder, m.name) for m in res.models}))


def _ltx_templates():
    from importlib import resources

    import comfyui_workflow_templates_json as pkg

    for p in sorted((resources.files(pkg) / "templates").iterdir()):
        if not p.name.startswith("video_ltx2") or not p.name.endswith(".json"):
            continue
        text = p.read_text(encoding="utf-8")
        if "LTXVAudioVAELoader" in text and "LTXAVTextEncoderLoader" in text:
            wf = json.loads(text)
            res = scan_workflow(wf, DirsResolver([]))
            ckpts = [m for m in res.models if m.folder == "checkpoints"]
            if len({m.name for m in ckpts}) < len(ckpts):
                yield p


def test_missing_models_are_reported(template, models_root):
    wf = template("image_flux2_klein_text_to_image.json")
    res = scan_workflow(wf, DirsResolver([models_root]))
    assert [m.status for m in res.models] == ["missing"] * 3
    assert res.m_total_gb == 0.0 and res.m_peak_gb == 0.0
    assert any("3 model file(s) not found" in w for w in res.warnings)
    assert res.summary()["missing"] == 3


@pytest.mark.parametrize("bad", ["../../../etc/passwd", "/etc/passwd", "..\\..\\secrets.safetensors",
                                 "C:\\Windows\\win.ini", "loras/../../x.safetensors", "~/x.safetensors"])
def test_path_traversal_name_is_refused(template, models_root, bad):
    wf = template("video_hunyuan_video_1.5_720p_t2v.json")
    next(n for n in wf["nodes"] if n["id"] == 10)["widgets_values"][0] = bad
    with pytest.raises(UnsafeModelName) as exc:
        scan_workflow(wf, DirsResolver([models_root]))
    assert "node 10 (VAELoader.vae_name)" in str(exc.value)


def test_traversal_in_api_format_refused(models_root, tmp_path, sparse):
    sparse(tmp_path / "outside.safetensors", GiB)
    api = {"1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "../outside.safetensors"}}}
    with pytest.raises(UnsafeModelName, match="node 1 .*climbs out"):
        scan_workflow(api, DirsResolver([models_root]))
    # a custom node the table does not know may take a path of its own: refused and not read, no error
    api = {"1": {"class_type": "SomeCustomLoader", "inputs": {"model": "../outside.safetensors"}}}
    res = scan_workflow(api, DirsResolver([models_root]))
    (ref,) = res.models
    assert (ref.status, ref.size_bytes, ref.path) == ("refused", 0, None)
    assert res.m_total_gb == 0 and any("climbs out" in w for w in res.warnings)


def test_check_model_name_normalises():
    assert check_model_name("SDXL\\base.safetensors") == "SDXL/base.safetensors"
    assert check_model_name("./a//b.safetensors") == "a/b.safetensors"
    with pytest.raises(UnsafeModelName):
        check_model_name("a\x00b")


def test_link_escaping_the_model_folder_is_refused_not_read(template, sparse, models_root, tmp_path):
    outside = sparse(tmp_path / "outside" / "secret.bin", 5 * GiB)
    (models_root / "vae").mkdir()
    os.symlink(outside, models_root / "vae" / "hunyuanvideo15_vae_fp16.safetensors")
    # a link that stays inside the models folder is fine
    real_te = sparse(models_root / "text_encoders" / "store" / "qwen.safetensors", 2 * GiB)
    os.symlink(real_te, models_root / "text_encoders" / "qwen_2.5_vl_7b_fp8_scaled.safetensors")
    wf = template("video_hunyuan_video_1.5_720p_t2v.json")
    res = scan_workflow(wf, DirsResolver([models_root]))
    by_name = {m.name: m for m in res.models}
    vae = by_name["hunyuanvideo15_vae_fp16.safetensors"]
    assert vae.status == "refused" and vae.size_bytes == 0 and vae.path is None
    assert "outside the model folder" in vae.reason
    assert any("outside the model folder" in w for w in res.warnings)
    te = by_name["qwen_2.5_vl_7b_fp8_scaled.safetensors"]
    assert te.status == "found" and te.size_bytes == 2 * GiB
    assert res.m_total_gb == pytest.approx(2.0)


def test_legacy_folder_names_and_subfolders(sparse, models_root):
    sparse(models_root / "unet" / "wan" / "big.safetensors", 3 * GiB)  # ComfyUI's legacy "unet" folder
    sparse(models_root / "clip" / "t5.safetensors", GiB)
    api = {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": "wan\\big.safetensors", "weight_dtype": "default"}},
        "2": {"class_type": "CLIPLoader", "inputs": {"clip_name": "t5.safetensors", "type": "wan"}},
    }
    res = scan_workflow(api, DirsResolver([models_root]))
    assert res.format == "api"
    assert [m.status for m in res.models] == ["found", "found"]
    assert res.models[0].options == {"weight_dtype": "default"}
    assert res.m_total_gb == pytest.approx(4.0)


# ComfyUI's default text-to-image graph as the API format saves it
DEFAULT_API = {
    "3": {"class_type": "KSampler", "inputs": {"seed": 1, "steps": 20, "cfg": 8, "sampler_name": "euler",
                                                 "scheduler": "normal", "denoise": 1, "model": ["4", 0],
                                                 "positive": ["6", 0], "negative": ["7", 0],
                                                 "latent_image": ["5", 0]}},
    "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "v1-5-pruned-emaonly.safetensors"}},
    "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 512, "height": 512, "batch_size": 1}},
    "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a cat", "clip": ["4", 1]}},
    "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["4", 1]}},
    "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
    "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "ComfyUI", "images": ["8", 0]},
          "_meta": {"title": "Save Image"}},
    "10": {"class_type": "LoraLoader", "inputs": {"lora_name": ["11", 0], "strength_model": 1, "strength_clip": 1,
                                                   "model": ["4", 0], "clip": ["4", 1]}},
    "11": {"class_type": "PrimitiveString", "inputs": {"value": "style.safetensors"}},
}


def test_api_format_and_prompt_body(sparse, models_root):
    sparse(models_root / "checkpoints/v1-5-pruned-emaonly.safetensors", 4 * GiB)
    sparse(models_root / "loras/style.safetensors", GiB // 4)
    res = scan_workflow(DEFAULT_API, DirsResolver([models_root]))
    assert [(m.node, m.class_type, m.source, m.status) for m in res.models] == [
        ("4", "CheckpointLoaderSimple", "api", "found"), ("10", "LoraLoader", "linked", "found")]
    assert res.m_total_gb == pytest.approx(4.25)
    body = {"prompt": DEFAULT_API, "client_id": "x"}
    assert scan_workflow(body, DirsResolver([models_root])).m_total_gb == pytest.approx(4.25)


@pytest.mark.parametrize("doc", [[], {}, {"nodes": "x"}, {"1": {"inputs": {}}}, "text", None])
def test_not_a_workflow(doc):
    with pytest.raises(WorkflowFormatError, match="not a ComfyUI workflow"):
        scan_workflow(doc, DirsResolver([]))


def test_folder_paths_when_hosted(comfy_host, template, sparse, tmp_path):
    _instance, _load = comfy_host
    import folder_paths  # the stand-in, as ComfyUI would have it imported

    unet_dir, te_dir, vae_dir = tmp_path / "u", tmp_path / "te", tmp_path / "v"
    folder_paths.set_folder("diffusion_models", [str(unet_dir)])
    folder_paths.set_folder("text_encoders", [str(tmp_path / "empty"), str(te_dir)])
    folder_paths.set_folder("vae", [str(vae_dir)])
    sparse(unet_dir / "flux-2-klein-base-4b.safetensors", 8 * GiB)
    sparse(te_dir / "qwen_3_4b.safetensors", 5 * GiB)
    resolver = default_resolver()
    assert isinstance(resolver, FolderPathsResolver)
    res = scan_workflow(template("image_flux2_klein_text_to_image.json"), resolver)
    assert [m.status for m in res.models] == ["found", "found", "missing"]
    assert res.m_total_gb == pytest.approx(13.0)
    assert res.resolver["source"] == "comfyui"


def test_model_dirs_from_env_and_config(monkeypatch, xpufleet_home, sparse, tmp_path):
    monkeypatch.delitem(__import__("sys").modules, "folder_paths", raising=False)
    root_a, loras = tmp_path / "a", tmp_path / "my-loras"
    sparse(root_a / "checkpoints/v1-5-pruned-emaonly.safetensors", 4 * GiB)
    sparse(loras / "style.safetensors", GiB)
    monkeypatch.setenv("XPUFLEET_MODEL_DIRS", f"{root_a}{os.pathsep}loras={loras}")
    r = default_resolver()
    assert isinstance(r, DirsResolver)
    assert scan_workflow(DEFAULT_API, r).m_total_gb == pytest.approx(5.0)
    # the same through config.yaml: mapping form and flat-list form
    monkeypatch.delenv("XPUFLEET_MODEL_DIRS")
    (xpufleet_home / "config.yaml").write_text(f"model_dirs:\n  checkpoints: [{root_a / 'checkpoints'}]\n"
                                               f"  loras: {loras}\n")
    assert scan_workflow(DEFAULT_API, default_resolver()).m_total_gb == pytest.approx(5.0)
    (xpufleet_home / "config.yaml").write_text(f"model_dirs:\n  - {root_a}\n")
    assert scan_workflow(DEFAULT_API, default_resolver()).m_total_gb == pytest.approx(4.0)
    (xpufleet_home / "config.yaml").write_text("model_dirs: 3\n")
    with pytest.raises(ValueError, match="model_dirs"):
        default_resolver()


def test_unknown_loader_uses_properties_hint_or_search(template, sparse, models_root):
    wf = template("video_hunyuan_video_1.5_720p_t2v.json")
    node = next(n for n in wf["nodes"] if n["id"] == 10)
    node["type"] = "FancyCustomVAELoader"  # not in the table: the directory hint in properties leads
    sparse(models_root / "vae/hunyuanvideo15_vae_fp16.safetensors", GiB)
    res = scan_workflow(wf, DirsResolver([models_root]))
    ref = next(m for m in res.models if m.class_type == "FancyCustomVAELoader")
    assert (ref.status, ref.source, ref.folder) == ("found", "properties", "vae")
    node["properties"] = {}
    res = scan_workflow(wf, DirsResolver([models_root]))
    ref = next(m for m in res.models if m.class_type == "FancyCustomVAELoader")
    assert (ref.status, ref.source, ref.folder) == ("found", "guessed", "vae")
    (models_root / "vae/hunyuanvideo15_vae_fp16.safetensors").unlink()
    res = scan_workflow(wf, DirsResolver([models_root]))
    ref = next(m for m in res.models if m.class_type == "FancyCustomVAELoader")
    assert ref.status == "unresolved" and "not a known loader" in ref.reason


def test_every_template_scans_and_finds_its_declared_models(all_workflows):
    """All 600+ real templates: no error, and every model a loader declares in properties.models
    (and holds in its widgets) is among the scanned references of active nodes."""
    assert len(all_workflows) > 500
    checked = refs = 0
    for path in all_workflows:
        wf = json.loads(path.read_text(encoding="utf-8"))
        res = scan_workflow(wf, DirsResolver([]))
        scanned = {m.name for m in res.models}
        refs += len(res.models)
        subs = {s["id"]: s for s in (wf.get("definitions") or {}).get("subgraphs") or []}

        def walk(nodes, declared, subs=subs):
            for n in nodes:
                if n.get("mode") in (2, 4):
                    continue
                if n["type"] in subs:
                    walk(subs[n["type"]]["nodes"], declared)
                    continue
                wv = n.get("widgets_values")
                for m in (n.get("properties") or {}).get("models") or []:
                    if isinstance(wv, list) and m.get("name") in wv:
                        declared.add(m["name"])
            return declared

        declared = walk(wf["nodes"], set())
        assert declared <= scanned, (path.name, declared - scanned)
        checked += bool(declared)
    assert checked > 200 and refs > 1000


def test_mangled_templates_give_clear_errors_only(all_workflows):
    """Real templates with random fields replaced by junk: the scan answers or raises ValueError
    (a 400 with a message), never another exception (a 500)."""
    import random

    from xpufleet.predictor.service import predict_workflow
    from xpufleet.predictor.snapshot import Snapshot

    rng = random.Random(7)
    junk = [None, 1, -1, 2, 4, "x", [], {}, [1, 2], {"a": 1}, 1.5, True, "../x.safetensors", [None] * 7]

    def mutate(o, depth=0):
        """Replace one field of a dict or item of a list, somewhere down ``o``, by junk."""
        if not isinstance(o, dict | list) or not o:
            return
        key = rng.choice(list(o) if isinstance(o, dict) else range(len(o)))
        if rng.random() < 0.3 or depth > 6:
            o[key] = rng.choice(junk)
        else:
            mutate(o[key], depth + 1)

    outcomes = {"answered": 0, "refused": 0}
    for _ in range(400):
        wf = json.loads(rng.choice(all_workflows).read_text(encoding="utf-8"))
        for _ in range(rng.randint(1, 5)):
            mutate(wf)
        try:
            predict_workflow(wf, Snapshot(vram_free_gb=8), resolver=DirsResolver([]), gamma_overrides={},
                             options={"topology": rng.random() < 0.5})
            outcomes["answered"] += 1
        except ValueError as exc:
            assert str(exc)
            outcomes["refused"] += 1
    assert outcomes["answered"] > 100 and outcomes["refused"] > 0


@pytest.mark.parametrize("folder,name", [("samples", "mlp_digits.json"), ("samples", "predict_saved.json"),
                                         ("example_workflows", "mlp_digits.json"),
                                         ("example_workflows", "predict_saved.json")])
def test_the_plugins_own_model_files_are_not_model_references(folder, name, tmp_path):
    """ModelSaver's filename and ModelLoader's path name the plugin's own files (its outputs folder), not
    files of ComfyUI's model folders: the capsule must not flag them as unresolved."""
    from pathlib import Path

    graph = json.loads((Path(__file__).resolve().parents[2] / folder / name).read_text())
    res = scan_workflow(graph, DirsResolver([tmp_path]))
    assert [m for m in res.models if m.class_type in ("XPUModelSaver", "XPUModelLoader")] == []
    # a node the table does not know with the same input still is one
    renamed = json.loads(json.dumps(graph).replace("XPUModelSaver", "SomeOtherSaver"))
    if "SomeOtherSaver" in json.dumps(renamed):
        res = scan_workflow(renamed, DirsResolver([tmp_path]))
        assert [m.status for m in res.models if m.class_type == "SomeOtherSaver"] == ["unresolved"]
