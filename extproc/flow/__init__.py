"""Flow control: priority classes, saturation detection and the admission queue in front of each pool."""

from extproc.flow.config import FlowControlConfig, PriorityClass
from extproc.flow.controller import GO, FlowController
from extproc.flow.queue import FairQueue, Waiter
from extproc.flow.ticket import Rejected, Room, Ticket, Timer

__all__ = ["GO", "FairQueue", "FlowControlConfig", "FlowController", "PriorityClass", "Rejected", "Room", "Ticket",
           "Timer", "Waiter"]
