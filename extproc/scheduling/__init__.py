"""Endpoint scheduling inside a pool: framework, plugins, profiles."""

from extproc.scheduling.framework import Explanation, Profile, SchedulingRequest
from extproc.scheduling.prefix import prefix_blocks
from extproc.scheduling.profiles import Scheduler, validate_scheduling
from extproc.scheduling.registry import PluginError, PluginRegistry

__all__ = ["Explanation", "PluginError", "PluginRegistry", "Profile", "Scheduler", "SchedulingRequest",
           "prefix_blocks", "validate_scheduling"]
