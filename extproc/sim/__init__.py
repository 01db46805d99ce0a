"""A vLLM OpenAI-server simulator: many replicas in one asyncio process, no GPU.

Never imported by the gateway core; tests, demos and benchmarks start it (`extproc sim ...`).
"""

from extproc.sim.faults import FaultSettings
from extproc.sim.profile import BUILTIN_PROFILES, Profile, load_profile
from extproc.sim.replica import Replica
from extproc.sim.server import Fleet
from extproc.sim.spec import ReplicaSpec

__all__ = ["BUILTIN_PROFILES", "FaultSettings", "Fleet", "Profile", "Replica", "ReplicaSpec", "load_profile"]
