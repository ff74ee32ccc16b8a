"""Stand-in for ComfyUI's folder_paths: model folders by type and the output directory, set by tests."""

from __future__ import annotations

import os

models_dir = ""
output_directory = ""
folder_names_and_paths: dict[str, tuple[list[str], set[str]]] = {}
supported_pt_extensions = {".ckpt", ".pt", ".pt2", ".bin", ".pth", ".safetensors", ".pkl", ".sft", ".gguf"}


def set_folder(folder_name: str, paths: list[str]) -> None:
    folder_names_and_paths[folder_name] = (list(paths), set(supported_pt_extensions))


def add_model_folder_path(folder_name: str, full_folder_path: str, is_default: bool = False) -> None:
    paths, exts = folder_names_and_paths.setdefault(folder_name, ([], set(supported_pt_extensions)))
    if full_folder_path not in paths:
        paths.insert(0, full_folder_path) if is_default else paths.append(full_folder_path)


def get_output_directory() -> str:
    """ComfyUI answers ``<base>/output``; the comfy_host fixture sets a temporary one."""
    if not output_directory:
        raise RuntimeError("the stand-in's output_directory is not set")
    return output_directory


def get_folder_paths(folder_name: str) -> list[str]:
    return list(folder_names_and_paths.get(folder_name, ([], set()))[0])


def get_full_path(folder_name: str, filename: str) -> str | None:
    for base in get_folder_paths(folder_name):
        full = os.path.join(base, filename)
        if os.path.isfile(full):
            return full
    return None


def get_filename_list(folder_name: str) -> list[str]:
    out: list[str] = []
    for base in get_folder_paths(folder_name):
        for root, _dirs, files in os.walk(base):
            for f in files:
                out.append(os.path.relpath(os.path.join(root, f), base))
    return sorted(out)
