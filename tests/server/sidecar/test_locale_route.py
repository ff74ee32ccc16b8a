"""The standalone page reads its texts from the plugin's ComfyUI locale files (docs/i18n.md): GET
/ui/locales/<lang>/main.json serves locales/<lang>/main.json with no token, and nothing else."""

from __future__ import annotations

import json

from xpufleet.server.sidecar.routes import ui


async def test_the_page_reads_the_same_locale_files_comfyui_reads(sidecar_client):
    client, config = await sidecar_client()
    for lang in ("en", "zh"):
        resp = await client.get(f"/ui/locales/{lang}/main.json")
        assert resp.status == 200 and resp.content_type == "application/json"
        body = await resp.json()
        assert body == json.loads((ui.LOCALES_ROOT / lang / "main.json").read_text(encoding="utf-8"))
        assert body["xpufleet"]["app"]["queue_on"]
        assert "Content-Security-Policy" in resp.headers
    for bad in ("/ui/locales/fr/main.json", "/ui/locales/../main.json", "/ui/locales/en/settings.json",
                "/ui/locales/.x/main.json"):
        assert (await client.get(bad)).status == 404, bad
