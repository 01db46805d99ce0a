"""What the peer routers (sglang-router `smg`, `vllm-router`) ask a worker besides the OpenAI API.

Measured against the routers themselves (sglang-router 0.3.2, vllm-router 0.1.17; see
`extproc/bench/README.md`, "Peer routers"):

- `GET /get_load`: vllm-router's `power_of_two` polls it on every worker and reads the integer `load`
  of a JSON object (SGLang's legacy shape). We answer the requests the engine holds, running plus
  waiting. (smg's own poller, used only by its `power_of_two`, wants SGLang's newer per-DP-rank list
  and is not served: no strategy of the benchmark uses it.)
- `GET /server_info` and `GET /model_info` (and the deprecated `/get_server_info`, `/get_model_info`
  that smg falls back to on a 404): smg reads them once when it registers a worker, to name its model
  and label it. The shapes are SGLang's, less `model_path` and `tokenizer_path`: the simulator has no
  tokenizer files, and given a `model_path` smg tries to download that model's tokenizer from the
  Hugging Face hub. Without them smg routes on text, which is what its HTTP mode does anyway.

The figures come only from the engine's public state (`running`, `waiting`, `kv.usage`) and the
replica's profile, so they survive changes inside the engine.
"""

from __future__ import annotations

from aiohttp import web

from extproc.sim.engine import Engine
from extproc.sim.spec import ReplicaSpec

__all__ = ["RouterRoutes"]


class RouterRoutes:
    def __init__(self, spec: ReplicaSpec, engine: Engine) -> None:
        self.spec = spec
        self.engine = engine

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/get_load", self.get_load),
            web.get("/server_info", self.server_info),
            web.get("/get_server_info", self.server_info),
            web.get("/model_info", self.model_info),
            web.get("/get_model_info", self.model_info),
        ]

    def load(self) -> int:
        """Requests this replica holds: the batch, its queue and what arrived since the last step."""
        return self.engine.requests_present()

    async def get_load(self, request: web.Request) -> web.Response:
        return web.json_response({"load": self.load()})

    async def server_info(self, request: web.Request) -> web.Response:
        profile = self.spec.profile
        engine = self.engine
        state = {"load": self.load(), "num_running_reqs": len(engine.running),
                 "num_waiting_reqs": len(engine.waiting) + len(engine.inbox), "token_usage": round(engine.kv.usage, 4)}
        return web.json_response({
            "served_model_name": self.spec.model,
            "dp_size": 1,
            "tp_size": 1,
            "version": profile.vllm_version,
            "max_running_requests": profile.max_num_seqs,
            "max_total_num_tokens": profile.num_gpu_blocks * profile.block_size,
            "context_length": profile.max_model_len,
            "page_size": profile.block_size,
            "internal_states": [state],
        })

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response({
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
        })
