"""Sans-IO decision pipeline: authenticate -> admit -> route -> schedule -> Decision."""

from extproc.gateway.admission import Admission
from extproc.gateway.exchange import Exchange, Queued, error_response
from extproc.gateway.pipeline import Gateway
from extproc.gateway.snapshot import Snapshot, SnapshotHolder
from extproc.gateway.types import Decision, RequestHead, Respond, Route

__all__ = ["Admission", "Decision", "Exchange", "Gateway", "Queued", "RequestHead", "Respond", "Route", "Snapshot",
           "SnapshotHolder",
           "error_response"]
