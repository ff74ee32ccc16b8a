"""The sidecar (SPEC §2, §12): the aiohttp app, its routes, the dispatcher, the store, the local provider."""
