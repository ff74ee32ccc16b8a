"""The ComfyUI glue (docs/comfyui.md): the plugin's ``/xpufleet/`` routes on ComfyUI's own server."""
