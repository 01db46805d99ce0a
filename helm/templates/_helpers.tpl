{{/* Names, labels and the effective policy shared by every template. */}}

{{- define "extproc.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-scoped base name; component objects append a short suffix, so keep room for it. */}}
{{- define "extproc.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "extproc.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels common to every object; pass (dict "ctx" $ "component" "name"). */}}
{{- define "extproc.labels" -}}
helm.sh/chart: {{ include "extproc.chart" .ctx }}
{{ include "extproc.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: extproc
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The component label keeps the service's selector from also matching the Redis pods. */}}
{{- define "extproc.selectorLabels" -}}
app.kubernetes.io/name: {{ include "extproc.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "extproc.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "extproc.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "extproc.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag | toString) -}}
{{- end -}}

{{- define "extproc.mode" -}}
{{- $modes := list "istio-gateway" "istio-sidecar" "standalone" "epp" -}}
{{- if not (has .Values.mode $modes) -}}
{{- fail (printf "mode must be one of %s, got %q" (join ", " $modes) (toString .Values.mode)) -}}
{{- end -}}
{{- .Values.mode -}}
{{- end -}}

{{/*
The policy file as the service reads it: .Values.policy plus what a pod needs.
- service.admin_host defaults to 0.0.0.0 (kubelet probes and Prometheus reach the pod by its IP);
  service.grpc_host to 127.0.0.1 in standalone mode (only the Envoy of the same pod calls it) and to 0.0.0.0
  in the Istio modes (the gateway / sidecars call it); a loopback value is refused where it cannot work.
- grpcAuth / adminAuth make service.grpc_token_file / admin_token_file default to their mounted Secrets.
- standalone: Envoy runs in the same pod, so its ext_proc cluster defaults to 127.0.0.1:<grpc_port> and
  its listener to 0.0.0.0.
- a Redis from the chart (redis.enabled / url / existingSecret, as EXTPROC_REDIS_URL) makes limits.store
  default to redis; limits.store redis with no URL anywhere is refused.
- with Redis, limits.replicas (each replica's share when deciding alone: fail-open) defaults to
  replicaCount, or autoscaling.maxReplicas when the HPA owns the count.
- a tenants Secret makes auth.keys_file default to <tenants.mountPath>/<tenants.keysFile>.
- epp: mode endpoint-picker, one pool (epp.pool, else the first) whose endpoints come from the InferencePool;
  epp.tls.secretName makes service.tls point at the mounted Secret.
- the Istio modes with istio.routing.poolClusters mesh: each pool's `cluster` is Istio's own cluster of its
  Service (istio.routing.poolServices), the one the pool header then names.
Defaults below are the policy schema's (extproc/config/schema.py); tests/helm checks they agree.
*/}}
{{- define "extproc.policy" -}}
{{- $policy := deepCopy (.Values.policy | default dict) -}}
{{- $service := get $policy "service" | default dict -}}
{{- $_ := set $service "grpc_host" (get $service "grpc_host" | default (ternary "127.0.0.1" "0.0.0.0" (eq .Values.mode "standalone"))) -}}
{{- if and (include "extproc.grpcTokenSecret" .) (not (get $service "grpc_token_file")) -}}
{{- $_ := set $service "grpc_token_file" (printf "/etc/extproc/grpc-token/%s" .Values.grpcAuth.existingSecretKey) -}}
{{- end -}}
{{- if and (include "extproc.adminTokenSecret" .) (not (get $service "admin_token_file")) -}}
{{- $_ := set $service "admin_token_file" (printf "/etc/extproc/admin-token/%s" .Values.adminAuth.existingSecretKey) -}}
{{- end -}}
{{- $_ := set $service "admin_host" (get $service "admin_host" | default "0.0.0.0") -}}
{{- $_ := set $policy "service" $service -}}
{{- if .Values.keda.enabled -}}
{{- $autoscaling := get $policy "autoscaling" | default dict -}}
{{- if .Values.keda.tls.secretName -}}
{{- if not .Values.keda.tls.clientSecretName -}}
{{- fail "keda.tls.secretName needs keda.tls.clientSecretName (KEDA's client certificate, for its TriggerAuthentication)" -}}
{{- end -}}
{{- $_ := set $autoscaling "grpc_port" (int .Values.keda.grpcPort) -}}
{{- $_ := set $autoscaling "grpc_host" "0.0.0.0" -}}
{{- $_ := set $autoscaling "tls" (dict "cert_file" "/etc/extproc/keda-tls/tls.crt" "key_file" "/etc/extproc/keda-tls/tls.key" "client_ca_file" "/etc/extproc/keda-tls/ca.crt") -}}
{{- else if .Values.keda.allowUnauthenticated -}}
{{- $_ := set $autoscaling "allow_unauthenticated" true -}}
{{- else -}}
{{- fail "keda.enabled needs keda.tls.secretName and keda.tls.clientSecretName (mTLS: KEDA authenticates with a client certificate), or keda.allowUnauthenticated: true where only Envoy and KEDA reach the gRPC port" -}}
{{- end -}}
{{- $_ := set $policy "autoscaling" $autoscaling -}}
{{- end -}}
{{- $loopback := list "127.0.0.1" "localhost" "::1" -}}
{{- if has $service.admin_host $loopback -}}
{{- fail "policy.service.admin_host is a loopback address: kubelet probes and Prometheus could not reach the admin port; use 0.0.0.0" -}}
{{- end -}}
{{- if and (ne .Values.mode "standalone") (has $service.grpc_host $loopback) -}}
{{- fail "policy.service.grpc_host is a loopback address: Envoy in the gateway/sidecars could not reach ext_proc; use 0.0.0.0" -}}
{{- end -}}
{{- if and .Values.probes.grpc (has $service.grpc_host $loopback) -}}
{{- fail "probes.grpc: the gRPC port listens on a loopback address (standalone mode), out of the kubelet's reach; use the HTTP probes" -}}
{{- end -}}
{{- if eq .Values.mode "standalone" -}}
{{- $envoy := get $policy "envoy" | default dict -}}
{{- if not (get $envoy "extproc_endpoints") -}}
{{- $_ := set $envoy "extproc_endpoints" (list (printf "127.0.0.1:%d" (int (dig "grpc_port" 9002 $service)))) -}}
{{- end -}}
{{- $_ := set $envoy "listen_host" (get $envoy "listen_host" | default "0.0.0.0") -}}
{{- $_ := set $policy "envoy" $envoy -}}
{{- end -}}
{{- $limits := get $policy "limits" | default dict -}}
{{- $redisConfigured := or .Values.redis.enabled .Values.redis.url .Values.redis.existingSecret -}}
{{- if and $redisConfigured (not (get $limits "store")) -}}
{{- $_ := set $limits "store" "redis" -}}
{{- $_ := set $policy "limits" $limits -}}
{{- end -}}
{{- if and (eq (get $limits "store" | default "memory") "redis") (not $redisConfigured) (not (get $limits "redis_url")) -}}
{{- fail "policy.limits.store is redis but no Redis is configured: set redis.enabled, redis.url, redis.existingSecret or policy.limits.redis_url" -}}
{{- end -}}
{{- if and (eq (get $limits "store" | default "memory") "redis") (not (get $limits "replicas")) -}}
{{- $replicas := ternary .Values.autoscaling.maxReplicas .Values.replicaCount .Values.autoscaling.enabled -}}
{{- $_ := set $limits "replicas" (int $replicas) -}}
{{- $_ := set $policy "limits" $limits -}}
{{- end -}}
{{- if eq .Values.mode "epp" -}}
{{- $chosen := include "extproc.eppPool" . -}}
{{- $pool := dict -}}
{{- range $candidate := (get $policy "pools" | default list) -}}
{{- if eq $candidate.name $chosen }}{{ $pool = omit $candidate "endpoints" "discovery" }}{{ end -}}
{{- end -}}
{{- $_ := set $pool "inference_pool" (dict "name" (include "extproc.inferencePoolName" .) "namespace" .Release.Namespace) -}}
{{- $_ := set $policy "pools" (list $pool) -}}
{{- $_ := set $policy "mode" "endpoint-picker" -}}
{{- if .Values.epp.tls.secretName -}}
{{- $_ := set $service "tls" (dict "cert_file" "/etc/extproc/tls/tls.crt" "key_file" "/etc/extproc/tls/tls.key") -}}
{{- if .Values.probes.grpc -}}
{{- fail "probes.grpc with epp.tls: the kubelet's gRPC probes speak plaintext; use the HTTP probes (probes.grpc: false)" -}}
{{- end -}}
{{- end -}}
{{- else if and (ne .Values.mode "standalone") (eq .Values.istio.routing.poolClusters "mesh") -}}
{{- $pools := list -}}
{{- range $pool := (get $policy "pools" | default list) -}}
{{- $svc := get $.Values.istio.routing.poolServices $pool.name | default "" -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?:[0-9]{1,5}$" $svc) -}}
{{- fail (printf "istio.routing.poolServices.%s must name the pool's ClusterIP Service as HOST:PORT (got %q), or set istio.routing.poolClusters: dedicated" $pool.name $svc) -}}
{{- end -}}
{{- $pools = append $pools (merge (dict "cluster" (printf "outbound|%s||%s" (regexFind "[0-9]+$" $svc) (regexReplaceAll ":[0-9]+$" $svc ""))) $pool) -}}
{{- end -}}
{{- $_ := set $policy "pools" $pools -}}
{{- end -}}
{{- if include "extproc.tenantsSecret" . -}}
{{- $auth := get $policy "auth" | default dict -}}
{{- if not (get $auth "keys_file") -}}
{{- $_ := set $auth "keys_file" (printf "%s/%s" (trimSuffix "/" .Values.tenants.mountPath) .Values.tenants.keysFile) -}}
{{- $_ := set $policy "auth" $auth -}}
{{- end -}}
{{- end -}}
{{- toYaml $policy -}}
{{- end -}}

{{/* epp mode: the policy pool the picker serves (epp.pool, else the first pool). */}}
{{- define "extproc.eppPool" -}}
{{- $pools := .Values.policy.pools | default list -}}
{{- if not $pools -}}{{- fail "epp mode needs policy.pools (the pool the picker serves)" -}}{{- end -}}
{{- $wanted := .Values.epp.pool | default (index $pools 0).name -}}
{{- $found := "" -}}
{{- range $pools }}{{ if eq .name $wanted }}{{ $found = .name }}{{ end }}{{ end -}}
{{- if not $found -}}{{- fail (printf "epp.pool %q is not one of policy.pools" $wanted) -}}{{- end -}}
{{- $found -}}
{{- end -}}

{{- define "extproc.inferencePoolName" -}}
{{- .Values.epp.inferencePool.name | default (include "extproc.eppPool" .) -}}
{{- end -}}

{{/* Name of the Secret mounted at tenants.mountPath ("" = none). */}}
{{- define "extproc.tenantsSecret" -}}
{{- if .Values.tenants.existingSecret -}}
{{- .Values.tenants.existingSecret -}}
{{- else if .Values.tenants.data -}}
{{- printf "%s-tenants" (include "extproc.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* Settings read from the effective policy, with the schema's defaults. */}}
{{- define "extproc.grpcPort" -}}{{ int (dig "service" "grpc_port" 9002 .Values.policy) }}{{- end -}}
{{- define "extproc.kedaTls" -}}{{ if and .Values.keda.enabled .Values.keda.tls.secretName }}true{{ end }}{{- end -}}
{{- define "extproc.scalerPort" -}}{{ ternary (int .Values.keda.grpcPort) (include "extproc.grpcPort" . | int) (not (empty (include "extproc.kedaTls" .))) }}{{- end -}}
{{- define "extproc.adminPort" -}}{{ int (dig "service" "admin_port" 9003 .Values.policy) }}{{- end -}}
{{- define "extproc.listenPort" -}}{{ int (dig "envoy" "listen_port" 8080 .Values.policy) }}{{- end -}}
{{- define "extproc.clusterHeader" -}}{{ dig "envoy" "cluster_header" "x-gateway-pool" .Values.policy }}{{- end -}}
{{- define "extproc.endpointHeader" -}}
{{- dig "envoy" "endpoint_header" "x-gateway-destination-endpoint" .Values.policy -}}
{{- end -}}

{{/* Redis URL handed to the service as EXTPROC_REDIS_URL ("" = none: in-memory store). */}}
{{- define "extproc.redisUrl" -}}
{{- if .Values.redis.enabled -}}
{{- printf "redis://%s-redis.%s.svc.%s:%d/0" (include "extproc.fullname" .) .Release.Namespace .Values.clusterDomain (int .Values.redis.port) -}}
{{- else -}}
{{- .Values.redis.url -}}
{{- end -}}
{{- end -}}

{{/* Envoy cluster the gateway/sidecar uses for ext_proc gRPC streams. */}}
{{- define "extproc.istioExtprocCluster" -}}
{{- if .Values.istio.extprocCluster.name -}}
{{- .Values.istio.extprocCluster.name -}}
{{- else if eq .Values.istio.extprocCluster.mode "dedicated" -}}
{{- printf "extproc-%s-%s" .Release.Namespace (include "extproc.fullname" .) | trunc 120 -}}
{{- else -}}
{{- printf "outbound|%s||%s.%s.svc.%s" (include "extproc.grpcPort" .) (include "extproc.fullname" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}
{{- end -}}

{{/* Secrets holding the gRPC and admin tokens ("" = none): an existing one, or the chart's from an inline token. */}}
{{- define "extproc.grpcTokenSecret" -}}
{{- if .Values.grpcAuth.existingSecret -}}
{{- .Values.grpcAuth.existingSecret -}}
{{- else if .Values.grpcAuth.token -}}
{{- printf "%s-grpc-token" (include "extproc.fullname" .) -}}
{{- end -}}
{{- end -}}
{{- define "extproc.adminTokenSecret" -}}
{{- if .Values.adminAuth.existingSecret -}}
{{- .Values.adminAuth.existingSecret -}}
{{- else if .Values.adminAuth.token -}}
{{- printf "%s-admin-token" (include "extproc.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* The ext_proc / access-log grpc_service of the EnvoyFilter: the cluster, and the token when set. */}}
{{- define "extproc.envoyGrpcService" -}}
envoy_grpc:
  cluster_name: {{ include "extproc.istioExtprocCluster" . | quote }}
{{- with .Values.grpcAuth.token }}
initial_metadata:
  - key: x-extproc-token
    value: {{ . | quote }}
{{- end }}
{{- end -}}
