"""ComfyUI workflows as fleet runs (docs/comfyui.md, "Any workflow on a fleet card"): which graphs are
ComfyUI runs, what such a graph needs of a worker's ComfyUI, and the check of a graph against what a
worker's ComfyUI offers. Pure: no I/O, no aiohttp."""
