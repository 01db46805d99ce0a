"""Policy model of pool autoscaling (mounted as `Policy.autoscaling`): what the KEDA external scaler reports."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from extproc.policy_types import Port, Strict

__all__ = ["AutoscalingConfig", "ScalerTls"]


class ScalerTls(Strict):
    """mTLS on the scaler's own port: the server's certificate and key, and the CA that signs the client
    certificate KEDA presents (its TriggerAuthentication's tlsClientCert / tlsClientKey); a call without a
    certificate signed by that CA fails in the handshake. All three are read again whenever one changes
    (checked every `reload_interval_s`; new connections get them), as service.tls's pair is."""

    cert_file: str
    key_file: str
    client_ca_file: str
    reload_interval_s: float = Field(default=5.0, ge=0.5, le=3600)

    @field_validator("cert_file", "key_file", "client_ca_file")
    @classmethod
    def _absolute_paths(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"{value!r} must be an absolute path")
        return value


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
    smoothing_s: float = Field(default=0.0, ge=0, le=600,
                               description="demand is the mean of this many seconds of samples (0 = each sample); "
                                           "a rise then shows in full within it")
    max_streams: int = Field(default=64, ge=1, le=10_000, description="concurrent StreamIsActive calls")
    grpc_port: Port | None = Field(default=None, description="serve the scaler on this port of service.grpc_host, "
                                                              "alone (needed for tls); unset: on service.grpc_port")
    grpc_host: str | None = Field(default=None, description="the address grpc_port binds (unset: service.grpc_host)")
    tls: ScalerTls | None = Field(default=None, description="mTLS on grpc_port: only KEDA's client certificate "
                                                            "gets in")
    allow_unauthenticated: bool = Field(default=False, description="serve the scaler without tls (then only KEDA "
                                                                   "may reach its port: a NetworkPolicy, loopback)")

    @model_validator(mode="after")
    def _authenticated(self) -> AutoscalingConfig:
        if self.tls is not None and self.grpc_port is None:
            raise ValueError("autoscaling.tls needs autoscaling.grpc_port (the scaler's own port: Envoy's "
                             "ext_proc connections on service.grpc_port carry no client certificate)")
        if self.enabled and self.tls is None and not self.allow_unauthenticated:
            raise ValueError("autoscaling.enabled needs autoscaling.tls (KEDA's client certificate: caCert, "
                             "tlsClientCert, tlsClientKey in its TriggerAuthentication) on autoscaling.grpc_port, "
                             "or autoscaling.allow_unauthenticated: true where only KEDA can reach the port")
        return self

    @model_validator(mode="after")
    def _window(self) -> AutoscalingConfig:
        if self.predict_s > 0 and self.trend_window_s < 2 * self.sample_interval_s:
            raise ValueError("autoscaling.trend_window_s must hold at least two samples "
                             f"(>= 2 x sample_interval_s = {2 * self.sample_interval_s:g})")
        return self
