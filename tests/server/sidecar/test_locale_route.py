"""The standalone page reads its texts from the plugin's ComfyUI locale files (docs/i18n.md): GET
/ui/locales/<lang>/main.json serves locales/<lang>/main.json with no token, and nothing else."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer

from xpufleet.server.sidecar.app import SidecarConfig, create_app
from xpufleet.server.sidecar.routes import ui


def run(scenario, tmp_path: Path) -> None:
    async def main() -> None:
        config = SidecarConfig(home=tmp_path / "home", port=0, local_devices=[{"name": "cpu", "kind": "cpu"}])
        async with TestClient(TestServer(create_app(config), host="127.0.0.1")) as client:
            await scenario(client, config)

    asyncio.run(main())


def test_the_page_reads_the_same_locale_files_comfyui_reads(tmp_path):
    async def scenario(client, config):
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

    run(scenario, tmp_path)
