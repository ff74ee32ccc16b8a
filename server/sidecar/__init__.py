"""The sidecar (docs/sidecar.md): the aiohttp app, its routes, the dispatcher, the store, the local provider."""
