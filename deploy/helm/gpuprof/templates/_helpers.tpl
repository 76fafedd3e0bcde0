{{/*
Names and labels shared by every template. Object names are "<fullname>-<component>", so with
the release name "gpuprof" they read gpuprof-daemon, gpuprof-collector, gpuprof-jaeger, …
*/}}

{{- define "gpuprof.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains "gpuprof" .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-gpuprof" .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object; "component" names its part (daemon, collector, …). */}}
{{- define "gpuprof.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
{{ include "gpuprof.selectorLabels" . }}
{{- end -}}

{{/* The subset that selects a component's pods; it never changes across upgrades. */}}
{{- define "gpuprof.selectorLabels" -}}
app.kubernetes.io/name: gpuprof
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "gpuprof.image" -}}
{{- printf "%s:%s" .image.repository (.image.tag | default .root.Chart.AppVersion) -}}
{{- end -}}

{{/* The Secret holding the bearer token under key "token". */}}
{{- define "gpuprof.tokenSecret" -}}
{{- if and .Values.auth.token .Values.auth.existingSecret -}}
{{- fail "set only one of auth.token and auth.existingSecret" -}}
{{- else if .Values.auth.existingSecret -}}
{{- .Values.auth.existingSecret -}}
{{- else if .Values.auth.token -}}
{{- printf "%s-token" (include "gpuprof.fullname" .) -}}
{{- else -}}
{{- fail "the collector needs a bearer token: set auth.token or auth.existingSecret (a Secret with key \"token\")" -}}
{{- end -}}
{{- end -}}

{{/* The readers' token Secret, or "" when reading is open. */}}
{{- define "gpuprof.readTokenSecret" -}}
{{- if and .Values.auth.readToken .Values.auth.existingReadSecret -}}
{{- fail "set only one of auth.readToken and auth.existingReadSecret" -}}
{{- else if .Values.auth.existingReadSecret -}}
{{- .Values.auth.existingReadSecret -}}
{{- else if .Values.auth.readToken -}}
{{- printf "%s-read-token" (include "gpuprof.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "gpuprof.serviceAccountName" -}}
{{- if .root.Values.serviceAccount.create -}}
{{- printf "%s-%s" (include "gpuprof.fullname" .root) .component -}}
{{- else -}}
default
{{- end -}}
{{- end -}}

{{/* Where agents send OTLP: as given, else the load-balancer when enabled, else the collector;
on the port of the protocol they speak. (dict "root" . "endpoint" given "protocol" grpc|http) */}}
{{- define "gpuprof.otlpEndpoint" -}}
{{- $http := eq .protocol "http" -}}
{{- if .endpoint -}}
{{- .endpoint -}}
{{- else if .root.Values.otelCollector.enabled -}}
{{- printf "http://%s-otel-collector.%s.svc:%v" (include "gpuprof.fullname" .root) .root.Release.Namespace (ternary 4318 4317 $http) -}}
{{- else -}}
{{- printf "http://%s-collector.%s.svc:%v" (include "gpuprof.fullname" .root) .root.Release.Namespace (ternary .root.Values.collector.httpPort .root.Values.collector.grpcPort $http) -}}
{{- end -}}
{{- end -}}

{{/* Where the daemons send OTLP. */}}
{{- define "gpuprof.daemonEndpoint" -}}
{{- include "gpuprof.otlpEndpoint" (dict "root" . "endpoint" .Values.daemon.otlpEndpoint "protocol" .Values.daemon.otlpProtocol) -}}
{{- end -}}

{{/* Where the collector forwards spans: as given, else this release's Jaeger, else nowhere. */}}
{{- define "gpuprof.forwardEndpoint" -}}
{{- if .Values.collector.forwardEndpoint -}}
{{- .Values.collector.forwardEndpoint -}}
{{- else if and .Values.jaeger.enabled (not .Values.otelCollector.enabled) -}}
{{- printf "http://%s-jaeger.%s.svc:4318" (include "gpuprof.fullname" .) .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{- define "gpuprof.jaegerUrl" -}}
{{- if .Values.grafana.datasources.jaegerUrl -}}
{{- .Values.grafana.datasources.jaegerUrl -}}
{{- else if .Values.jaeger.enabled -}}
{{- printf "http://%s-jaeger.%s.svc:16686" (include "gpuprof.fullname" .) .Release.Namespace -}}
{{- end -}}
{{- end -}}
