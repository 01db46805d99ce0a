"""Pool autoscaling: the demand every pool sees, as KEDA's external scaler reports it (`extproc.server.scaler`)."""

from extproc.autoscale.config import AutoscalingConfig
from extproc.autoscale.demand import DemandTracker, Estimate

__all__ = ["AutoscalingConfig", "DemandTracker", "Estimate"]
