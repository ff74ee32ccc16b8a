"""The ComfyUI glue (SPEC UI2): the plugin's ``/xpufleet/`` routes on ComfyUI's own server."""
