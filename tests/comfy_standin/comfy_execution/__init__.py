"""Stand-in for ComfyUI's comfy_execution package (the executing-node context in utils)."""
