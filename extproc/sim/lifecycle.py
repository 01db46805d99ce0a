"""Sleep mode and runtime LoRA adapters of one simulated replica, as vLLM serves them.

vLLM (with `--enable-sleep-mode` and its development endpoints; `VLLM_ALLOW_RUNTIME_LORA_UPDATING` for
adapters):
- `POST /sleep?level=1|2`: level 1 offloads the weights to CPU memory, level 2 discards them; the KV cache
  (and so the prefix cache) is dropped either way. While asleep, the endpoints that need the weights (chat,
  completions, embeddings) answer 503; `/metrics`, `/v1/models`, `/tokenize` keep working.
- `POST /wake_up`: returns once the weights are back (profile `wake_up_s`, `wake_up_level2_s` after level 2).
- `GET /is_sleeping`: `{"is_sleeping": bool}` (true from the sleep call until a wake-up completes).
- `POST /v1/load_lora_adapter {"lora_name", "lora_path"}`: usable once loaded (`lora_load_s`); 400 if the
  name is loaded already. `POST /v1/unload_lora_adapter {"lora_name"}`: 404 if it is not loaded; requests
  already running with it finish.

The simulator always enables these. A sleep waits for the requests in the engine to finish (new ones are
refused from the call on), then takes `sleep_s`. Sleep and wake-up calls are serialised.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from aiohttp import web

from extproc.sim.engine import Engine
from extproc.sim.openai_routes import compact_json, read_json
from extproc.sim.protocol import ApiError
from extproc.sim.spec import ReplicaSpec

__all__ = ["Lifecycle"]

_ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$")
_IDLE_POLL_S = 0.01
MAX_ADAPTERS = 256  # bound on loaded adapters (a client loading names in a loop must not grow memory forever)


class Lifecycle:
    def __init__(self, spec: ReplicaSpec, engine: Engine) -> None:
        self.spec = spec
        self.engine = engine
        self.adapters: dict[str, None] = dict.fromkeys(spec.lora_adapters)  # loaded, in load order
        self.sleeping = False
        self.level = 0
        self._transition = asyncio.Lock()
        self._loading: set[str] = set()
        self.sleeps = self.wake_ups = self.loads = self.unloads = 0

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/sleep", self.sleep),
            web.post("/wake_up", self.wake_up),
            web.get("/is_sleeping", self.is_sleeping),
            web.post("/v1/load_lora_adapter", self.load_adapter),
            web.post("/v1/unload_lora_adapter", self.unload_adapter),
        ]

    def check_awake(self) -> None:
        """Raised by the endpoints that need the weights while the engine sleeps."""
        if self.sleeping:
            raise ApiError(503, "The model is sleeping; call /wake_up first")

    # -- sleep mode ------------------------------------------------------------------------------------
    async def sleep(self, request: web.Request) -> web.Response:
        level_text = request.query.get("level", "1")
        if level_text not in ("1", "2"):
            raise ApiError(400, "level must be 1 or 2", "level")
        async with self._transition:
            if not self.sleeping:
                self.sleeping = True  # refuse new requests from now on
                while self.engine.requests_present():  # noqa: ASYNC110 (the engine has no idle event; only during a sleep call)
                    await asyncio.sleep(_IDLE_POLL_S)
                await asyncio.sleep(self.spec.profile.sleep_s)
                self.engine.kv.reset()
                self.sleeps += 1
            self.level = max(self.level, int(level_text))
        return web.Response(status=200)

    async def wake_up(self, request: web.Request) -> web.Response:
        async with self._transition:
            if self.sleeping:
                profile = self.spec.profile
                await asyncio.sleep(profile.wake_up_level2_s if self.level >= 2 else profile.wake_up_s)
                self.sleeping = False
                self.level = 0
                self.wake_ups += 1
        return web.Response(status=200)

    async def is_sleeping(self, request: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": self.sleeping}, dumps=compact_json)

    # -- runtime LoRA ----------------------------------------------------------------------------------
    def _name(self, body: dict[str, Any]) -> str:
        name = body.get("lora_name")
        if not isinstance(name, str) or not _ADAPTER_NAME.match(name):
            raise ApiError(400, "lora_name must be 1-128 characters of letters, digits and _.:/-", "lora_name")
        return name

    async def load_adapter(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        name = self._name(body)
        if not isinstance(body.get("lora_path"), str) or not body["lora_path"]:
            raise ApiError(400, "lora_path must be a non-empty string", "lora_path")
        if name == self.spec.model:
            raise ApiError(400, f"The lora adapter '{name}' cannot use the served model's name.", "lora_name")
        if name in self.adapters or name in self._loading:
            raise ApiError(400, f"The lora adapter '{name}' has already been loaded.", "lora_name")
        if len(self.adapters) + len(self._loading) >= MAX_ADAPTERS:
            raise ApiError(400, f"at most {MAX_ADAPTERS} adapters may be loaded", "lora_name")
        self._loading.add(name)
        try:
            await asyncio.sleep(self.spec.profile.lora_load_s)
            self.adapters[name] = None
            self.loads += 1
        finally:
            self._loading.discard(name)
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def unload_adapter(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        name = self._name(body)
        if name not in self.adapters:
            raise ApiError(404, f"The lora adapter '{name}' cannot be found.", "lora_name")
        del self.adapters[name]
        self.unloads += 1
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    def stats(self) -> dict[str, Any]:
        return {"sleeping": self.sleeping, "sleep_level": self.level, "adapters": list(self.adapters),
                "adapters_loading": sorted(self._loading),
                "sleeps": self.sleeps, "wake_ups": self.wake_ups, "adapter_loads": self.loads,
                "adapter_unloads": self.unloads}
