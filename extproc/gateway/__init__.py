"""The decision path, sans-IO: authenticate -> resolve -> admit -> gate -> schedule -> Decision; finish at the end."""

from extproc.gateway.build import Parts, build_gateway
from extproc.gateway.decision import BodyPhase, Gateway, Stages, Wait
from extproc.gateway.records import Admitted, Caller, Exchange, RequestIds, Resolved, Routed, error_response
from extproc.gateway.runtime import Pool, Runtime, RuntimeHolder
from extproc.gateway.types import Decision, RequestHead, Respond, Route

__all__ = ["Admitted", "BodyPhase", "Caller", "Decision", "Exchange", "Gateway", "Parts", "Pool", "RequestHead",
           "RequestIds", "Resolved", "Respond", "Route", "Routed", "Runtime", "RuntimeHolder", "Stages", "Wait",
           "build_gateway", "error_response"]
