"""Flow control: priority classes, saturation detection and the admission queue in front of each pool."""

from extproc.flow.config import FlowControlConfig, PriorityClass
from extproc.flow.controller import GO, FlowController, Rejected, Room, Ticket, Timer
from extproc.flow.queue import FairQueue, Waiter

__all__ = ["GO", "FairQueue", "FlowControlConfig", "FlowController", "PriorityClass", "Rejected", "Room", "Ticket",
           "Timer", "Waiter"]
