"""P3 options (each off by default): weight bytes from headers, topology-aware peak, activation
overhead, calibration; and the scan + predict service they plug into."""

from __future__ import annotations

import json
import math
import struct

import numpy as np
import pytest

from xpufleet.predictor import weights as W
from xpufleet.predictor.calibration import calibration_factor, load_samples, record_run_peak
from xpufleet.predictor.predict import p_load, p_peak
from xpufleet.predictor.resolve import DirsResolver
from xpufleet.predictor.scan import scan_workflow
from xpufleet.predictor.service import apply_override, parse_options, predict_workflow
from xpufleet.predictor.snapshot import Snapshot
from xpufleet.predictor.topology import topology_peak

GiB = 1024**3


def snap(**kw) -> Snapshot:
    base = dict(vram_free_gb=20.0, vram_total_gb=24.0, ram_free_gb=32.0, commit_used_gb=16.0, commit_limit_gb=64.0,
                device="cuda:0", kind="cuda", platform="nvidia", source="override")
    base.update(kw)
    return Snapshot(**base)


# ---- the service, default model ------------------------------------------------------------------

def test_default_model_end_to_end_on_a_real_template(template, sparse, models_root):
    wf = template("sd3.5_large_canny_controlnet_example.json")
    sparse(models_root / "checkpoints/sd3.5_large_fp8_scaled.safetensors", 14 * GiB)
    sparse(models_root / "controlnet/sd3.5_large_controlnet_canny.safetensors", 4 * GiB)
    s = snap(vram_free_gb=10.0, vram_allocated_gb=1.0, vram_reserved_gb=1.0, ram_free_gb=8.0,
             commit_used_gb=10.0, commit_limit_gb=20.0, platform="intel")
    a = predict_workflow(wf, s, resolver=DirsResolver([models_root]), gamma_overrides={})
    veff = 0.9 * 12.0
    pp = p_peak(14.0, veff, 1.0)
    pl = p_load(18.0 - veff, 8.0, 10.0)
    assert a["p_success"] == round(100 * pp * pl)
    assert pp == pytest.approx(math.exp(-3 * (14 - veff) / veff))
    assert a["explanation"]["models"]["m_peak_gb"] == 14.0 and a["explanation"]["models"]["m_total_gb"] == 18.0
    assert a["explanation"]["intermediates"]["p_load_branch"] == "ram"
    assert a["explanation"]["options"] == {}
    assert a["level"] in {"smooth", "safe", "warning", "critical"} and a["color"].startswith("#")
    assert {m["name"] for m in a["models"]} == {"sd3.5_large_fp8_scaled.safetensors",
                                                 "sd3.5_large_controlnet_canny.safetensors"}
    assert a["snapshot"]["platform"] == "intel" and a["scan"]["format"] == "ui"
    assert a["complete"] is True
    json.dumps(a)  # JSON-ready
    # the platform named in the request wins over the device's
    a2 = predict_workflow(wf, s, platform="NVIDIA", resolver=DirsResolver([models_root]), gamma_overrides={})
    assert a2["explanation"]["gamma"] == 4.0 and a2["p_success"] > a["p_success"]


def test_unknown_platform_uses_configured_gamma(monkeypatch, template, models_root):
    wf = template("sd3.5_large_canny_controlnet_example.json")
    a = predict_workflow(wf, snap(), platform="amd", resolver=DirsResolver([models_root]), gamma_overrides={})
    assert a["explanation"]["gamma_source"] == "default"
    assert a["complete"] is False and a["p_success"] is None  # no file found: no rate (test_predictor_missing.py)
    assert any("no configured gamma" in w for w in a["warnings"])
    monkeypatch.setenv("XPUFLEET_PREDICTOR_GAMMA", "amd=2.5")
    a = predict_workflow(wf, snap(), platform="amd", resolver=DirsResolver([models_root]))
    assert (a["explanation"]["gamma"], a["explanation"]["gamma_source"]) == (2.5, "override")
    with pytest.raises(ValueError, match="platform must be a name"):
        predict_workflow(wf, snap(), platform="../x", resolver=DirsResolver([models_root]))


def test_simulated_and_no_gpu_figures_are_flagged(template, models_root):
    wf = template("sd3.5_large_canny_controlnet_example.json")
    a = predict_workflow(wf, snap(simulated=True), resolver=DirsResolver([models_root]), gamma_overrides={})
    assert a["simulated"] is True and any("SIMULATED" in w for w in a["warnings"])
    cpu = Snapshot(reason="no GPU found: torch not loaded", ram_free_gb=8)
    a = predict_workflow(wf, cpu, resolver=DirsResolver([models_root]), gamma_overrides={})
    assert any("no GPU found" in w for w in a["warnings"])
    assert a["explanation"]["intermediates"]["v_eff_gb"] == 0.1


def test_override_and_option_validation():
    s = apply_override(snap(), {"vram_free_gb": 3.5, "platform": "intel"})
    assert (s.vram_free_gb, s.platform, s.source) == (3.5, "intel", "override")
    with pytest.raises(ValueError, match="unknown field"):
        apply_override(snap(), {"vram_fre_gb": 1})
    with pytest.raises(ValueError, match="snapshot.ram_free_gb"):
        apply_override(snap(), {"ram_free_gb": -2})
    assert parse_options(None) == parse_options({})
    with pytest.raises(ValueError, match="unknown option.*valid options"):
        parse_options({"weights": True})
    with pytest.raises(ValueError, match="options.topology must be true or false"):
        parse_options({"topology": "yes"})
    with pytest.raises(ValueError, match="activation_overhead"):
        parse_options({"activation_overhead": 9})
    with pytest.raises(ValueError, match="calibration"):
        parse_options({"calibration": "on"})


# ---- weight bytes ----------------------------------------------------------------------------------

def _write_safetensors(path, tensors, metadata=None):
    from safetensors.numpy import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=metadata)
    return path


def test_safetensors_weight_bytes_and_fp8_cast(tmp_path, models_root):
    tensors = {
        "w": np.ones((64, 32), dtype=np.float32),
        "h": np.ones((128,), dtype=np.float16),
        "q": np.ones((256,), dtype=np.int8),
    }
    big_meta = {"notes": "x" * 200_000}  # metadata counts in the file, not in the weights
    p = _write_safetensors(models_root / "diffusion_models" / "m.safetensors", tensors, big_meta)
    expected = sum(t.nbytes for t in tensors.values())
    info = W.weight_bytes(str(p), p.stat().st_size)
    assert (info.bytes, info.method, info.tensors) == (expected, "safetensors", 3)
    assert p.stat().st_size > expected + 200_000
    fp8 = W.weight_bytes(str(p), p.stat().st_size, {"weight_dtype": "fp8_e4m3fn"})
    assert fp8.bytes == 64 * 32 + 128 + 256  # floats at one byte, int8 unchanged
    # through the whole service: UNETLoader weight_dtype fp8
    api = {"1": {"class_type": "UNETLoader", "inputs": {"unet_name": "m.safetensors", "weight_dtype": "fp8_e4m3fn"}}}
    a = predict_workflow(api, snap(), options={"weight_bytes": True}, resolver=DirsResolver([models_root]),
                         gamma_overrides={})
    assert a["explanation"]["models"]["m_total_gb"] == pytest.approx(fp8.bytes / GiB)
    assert a["explanation"]["models"]["m_total_file_gb"] == pytest.approx(p.stat().st_size / GiB)
    assert a["models"][0]["weight_method"] == "safetensors"


def _gguf_bytes(tensors, kv_strings):
    """A GGUF v3 file by the format's own layout: header, metadata, tensor infos, aligned data."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 1 + len(kv_strings)))

    def s(text):
        b = text.encode()
        return struct.pack("<Q", len(b)) + b

    out += s("general.alignment") + struct.pack("<I", 4) + struct.pack("<I", 32)
    for key, values in kv_strings.items():  # an array of strings, like a tokenizer vocabulary
        out += s(key) + struct.pack("<IIQ", 9, 8, len(values)) + b"".join(s(v) for v in values)
    offset = 0
    blobs = []
    for name, dims, ttype, nbytes in tensors:
        out += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", ttype, offset)
        blobs.append(bytes(nbytes))
        offset += (nbytes + 31) // 32 * 32
    out += bytes((-len(out)) % 32)
    for b in blobs:
        out += b + bytes((-len(b)) % 32)
    return bytes(out)


def test_gguf_weight_bytes_handmade(tmp_path):
    # Q4_K (256 per 144-byte block), Q8_0 (32 per 34), F32
    tensors = [("blk.0.w", [4096, 512], 12, 4096 * 512 // 256 * 144), ("blk.0.b", [512, 64], 8, 512 * 64 // 32 * 34),
               ("norm", [512], 0, 512 * 4)]
    p = tmp_path / "m.gguf"
    p.write_bytes(_gguf_bytes(tensors, {"tokenizer.ggml.tokens": [f"tok{i}" for i in range(20_000)]}))
    info = W.weight_bytes(str(p), p.stat().st_size)
    assert info.method == "gguf" and info.tensors == 3
    assert info.bytes == sum(t[3] for t in tensors)
    assert p.stat().st_size > info.bytes + 200_000  # the vocabulary is not weights
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + b"\x05")
    fb = W.weight_bytes(str(bad), bad.stat().st_size)
    assert fb.method == "file_size" and "header not readable" in fb.note


def test_gguf_written_by_gguf_py(tmp_path):
    import gguf  # a declared test dependency: missing fails, never skips
    from gguf.quants import quantize

    # the ggml block table matches llama.cpp's own
    for qtype, sizes in gguf.GGML_QUANT_SIZES.items():
        assert W.GGML_TYPE_SIZES[int(qtype)] == tuple(sizes), qtype
    path = tmp_path / "model.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(5000)])
    data = np.random.default_rng(0).standard_normal((256, 128)).astype(np.float32)
    q8 = quantize(data, gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("q8", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("f16", data.astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    info = W.weight_bytes(str(path), path.stat().st_size)
    assert info.method == "gguf" and info.tensors == 2
    assert info.bytes == q8.nbytes + data.size * 2


def test_pickled_checkpoint_falls_back_to_file_size(tmp_path):
    p = tmp_path / "old.ckpt"
    p.write_bytes(b"\x80\x02" + bytes(1000))
    info = W.weight_bytes(str(p), 1002)
    assert (info.bytes, info.method) == (1002, "file_size") and "no weight header" in info.note


# ---- topology --------------------------------------------------------------------------------------

def test_topology_peak_controlnet_on_a_real_template(template, sparse, models_root):
    wf = template("sd3.5_large_canny_controlnet_example.json")
    sparse(models_root / "checkpoints/sd3.5_large_fp8_scaled.safetensors", 14 * GiB)
    sparse(models_root / "controlnet/sd3.5_large_controlnet_canny.safetensors", 4 * GiB)
    r = DirsResolver([models_root])
    off = predict_workflow(wf, snap(), resolver=r, gamma_overrides={})
    on = predict_workflow(wf, snap(), options={"topology": True}, resolver=r, gamma_overrides={})
    assert off["explanation"]["models"]["m_peak_gb"] == 14.0  # docs/predictor.md: serial, largest file
    m = on["explanation"]["models"]
    assert m["m_peak_gb"] == 18.0  # the sampler needs the checkpoint and the ControlNet together
    assert wf_node_type(wf, m["topology_node"]) in {"KSampler", "KSamplerAdvanced", "SamplerCustom", "ControlNetApplySD3",
                                                    "ControlNetApplyAdvanced", "SamplerCustomAdvanced", "CFGGuider"}


def wf_node_type(wf, node_id):
    return next(n["type"] for n in wf["nodes"] if str(n["id"]) == node_id)


def test_topology_lora_with_base_model_but_not_text_encoder(template, sparse, models_root):
    wf = template("image_qwen_image_2512_with_2steps_lora.json")
    sizes = {"diffusion_models/qwen_image_2512_fp8_e4m3fn.safetensors": 20, "text_encoders/qwen_2.5_vl_7b_fp8_scaled.safetensors": 9,
             "vae/qwen_image_vae.safetensors": 1, "loras/Wuli-Qwen-Image-2512-Turbo-LoRA-2steps-V1.0-bf16.safetensors": 2}
    for rel, g in sizes.items():
        sparse(models_root / rel, g * GiB)
    res = scan_workflow(wf, DirsResolver([models_root]), collect_graph=True)
    tp = topology_peak(res, res.files())
    assert tp["bytes"] == 22 * GiB
    assert sorted(p.rsplit("/", 1)[1] for p in tp["files"]) == [
        "Wuli-Qwen-Image-2512-Turbo-LoRA-2steps-V1.0-bf16.safetensors", "qwen_image_2512_fp8_e4m3fn.safetensors"]
    # bypass the LoRA: the base model still flows through, the LoRA is not loaded
    next(n for n in wf["nodes"] if n["type"] == "LoraLoaderModelOnly")["mode"] = 4
    res = scan_workflow(wf, DirsResolver([models_root]), collect_graph=True)
    assert topology_peak(res, res.files())["bytes"] == 20 * GiB


def test_topology_parallel_branches_in_api_format(sparse, models_root):
    sparse(models_root / "checkpoints/a.safetensors", 6 * GiB)
    sparse(models_root / "checkpoints/b.safetensors", 5 * GiB)
    sparse(models_root / "controlnet/cn.safetensors", 2 * GiB)

    def chain(prefix, ckpt, cn):
        g = {
            f"{prefix}1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": ckpt}},
            f"{prefix}2": {"class_type": "CLIPTextEncode", "inputs": {"text": "x", "clip": [f"{prefix}1", 1]}},
            f"{prefix}4": {"class_type": "KSampler", "inputs": {"model": [f"{prefix}1", 0], "positive": [f"{prefix}2", 0],
                                                                "negative": [f"{prefix}2", 0], "latent_image": ["0", 0]}},
            f"{prefix}5": {"class_type": "VAEDecode", "inputs": {"samples": [f"{prefix}4", 0], "vae": [f"{prefix}1", 2]}},
        }
        if cn:
            g[f"{prefix}6"] = {"class_type": "ControlNetLoader", "inputs": {"control_net_name": cn}}
            g[f"{prefix}7"] = {"class_type": "ControlNetApplyAdvanced",
                               "inputs": {"positive": [f"{prefix}2", 0], "negative": [f"{prefix}2", 0],
                                          "control_net": [f"{prefix}6", 0], "image": ["0", 0]}}
            g[f"{prefix}4"]["inputs"]["positive"] = [f"{prefix}7", 0]
        return g

    api = {"0": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}}}
    api.update(chain("a", "a.safetensors", None))
    api.update(chain("b", "b.safetensors", "cn.safetensors"))
    res = scan_workflow(api, DirsResolver([models_root]), collect_graph=True)
    tp = topology_peak(res, res.files())
    # two branches that never meet: the larger set wins (b + ControlNet = 7), not the sum of all (13)
    assert tp["bytes"] == 7 * GiB and tp["node"] == "b4"
    assert res.m_peak_gb == 6.0 and res.m_total_gb == 13.0


# ---- activation overhead and calibration ------------------------------------------------------------

def test_activation_overhead(sparse, models_root):
    sparse(models_root / "checkpoints/a.safetensors", 10 * GiB)
    api = {"1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "a.safetensors"}}}
    r = DirsResolver([models_root])
    m = predict_workflow(api, snap(), options={"activation_overhead": True}, resolver=r,
                         gamma_overrides={})["explanation"]["models"]
    assert (m["m_peak_gb"], m["m_total_gb"], m["activation_extra_gb"]) == (12.0, 12.0, 2.0)
    m = predict_workflow(api, snap(), options={"activation_overhead": {"fraction": 0.5, "gb": 1}}, resolver=r,
                         gamma_overrides={})["explanation"]["models"]
    assert m["m_peak_gb"] == 16.0


def test_calibration_from_samples_and_from_recorded_runs(xpufleet_home, sparse, models_root):
    sparse(models_root / "checkpoints/a.safetensors", 10 * GiB)
    api = {"1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "a.safetensors"}}}
    r = DirsResolver([models_root])
    samples = [{"m_peak_gb": 10, "measured_peak_gb": 12}, {"m_peak_gb": 4, "measured_peak_gb": 6},
               {"m_peak_gb": 8, "measured_peak_gb": 10}, {"m_peak_gb": 0, "measured_peak_gb": 3}]
    cal = calibration_factor(samples)
    assert cal["samples"] == 3 and cal["factor"] == pytest.approx(1.25)  # median of 1.2, 1.5, 1.25
    a = predict_workflow(api, snap(), options={"calibration": {"samples": samples}}, resolver=r, gamma_overrides={})
    assert a["explanation"]["models"]["m_peak_gb"] == pytest.approx(12.5)
    assert calibration_factor([{"m_peak_gb": 1, "measured_peak_gb": 50}])["factor"] == 4.0  # clamped
    # nothing recorded yet: factor 1 and a warning
    a = predict_workflow(api, snap(), options={"calibration": True}, resolver=r, gamma_overrides={})
    assert a["explanation"]["models"]["m_peak_gb"] == 10.0 and any("calibration" in w for w in a["warnings"])
    record_run_peak(10.0, 13.0, "nvidia", "cuda:0")
    record_run_peak(10.0, 11.0, "nvidia", "cuda:0")
    record_run_peak(10.0, 30.0, "intel", "xpu:0")  # another platform: not used for nvidia
    assert len(load_samples()) == 3
    a = predict_workflow(api, snap(), options={"calibration": True}, resolver=r, gamma_overrides={})
    assert a["explanation"]["models"]["calibration"]["samples"] == 2
    assert a["explanation"]["models"]["m_peak_gb"] == pytest.approx(12.0)
    with pytest.raises(ValueError):
        record_run_peak(0, 1, "nvidia")
