"""Flow control: priority classes, saturation detection and the admission queue in front of each pool."""

from extproc.flow.config import FlowControlConfig, PriorityClass, SaturationConfig
from extproc.flow.controller import GO, FlowController, Rejected, Ticket
from extproc.flow.queue import FairQueue, Waiter
from extproc.flow.saturation import Room, endpoint_room, pool_room

__all__ = ["GO", "FairQueue", "FlowControlConfig", "FlowController", "PriorityClass", "Rejected", "Room",
           "SaturationConfig", "Ticket", "Waiter", "endpoint_room", "pool_room"]
