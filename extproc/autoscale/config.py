"""Policy model of pool autoscaling (mounted as `Policy.autoscaling`): what the KEDA external scaler reports."""

from __future__ import annotations

from pydantic import Field, model_validator

from extproc.policy_types import Strict

__all__ = ["AutoscalingConfig"]


class AutoscalingConfig(Strict):
    """KEDA's external scaler on the gRPC port (README "Autoscaling the pools")."""

    enabled: bool = Field(default=False, description="serve externalscaler.ExternalScaler on service.grpc_port")
    target_per_replica: float = Field(default=8.0, gt=0, le=100_000,
                                      description="demand (requests) one engine replica should carry; "
                                                  "pools[].target_per_replica overrides it")
    sample_interval_s: float = Field(default=1.0, ge=0.05, le=60, description="how often demand is sampled")
    predict_s: float = Field(default=60.0, ge=0, le=600,
                             description="report demand this far ahead on its rising trend (0 = the present)")
    trend_window_s: float = Field(default=60.0, gt=0, le=3600, description="samples the trend is fitted over")
    scale_down_stabilization_s: float = Field(default=300.0, ge=0, le=3600,
                                              description="a fall in demand is reported only once it has lasted "
                                                          "this long (never less than the window's highest demand)")
    max_streams: int = Field(default=64, ge=1, le=10_000, description="concurrent StreamIsActive calls")

    @model_validator(mode="after")
    def _window(self) -> AutoscalingConfig:
        if self.predict_s > 0 and self.trend_window_s < 2 * self.sample_interval_s:
            raise ValueError("autoscaling.trend_window_s must hold at least two samples "
                             f"(>= 2 x sample_interval_s = {2 * self.sample_interval_s:g})")
        return self
