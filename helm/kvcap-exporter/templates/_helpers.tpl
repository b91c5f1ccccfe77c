{{/*
Names and labels. Every helper takes (dict "values" <kvcap-exporter values> "root" $), the
same context as the sidecar templates in _sidecar.tpl, so a chart that includes the sidecar
computes the same names (Secrets, labels) as this chart does for its own objects.
*/}}

{{- define "kvcap-exporter.fullname" -}}
{{- $release := .root.Release.Name -}}
{{- if .values.fullnameOverride -}}
{{- .values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains "kvcap-exporter" $release -}}
{{- $release | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-kvcap-exporter" $release | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* <fullname>-<suffix>, within the 63 characters of a DNS label. */}}
{{- define "kvcap-exporter.name" -}}
{{- $base := include "kvcap-exporter.fullname" .context -}}
{{- printf "%s-%s" ($base | trunc (int (sub 62 (len .suffix)))) .suffix | trimSuffix "-" -}}
{{- end -}}

{{- define "kvcap-exporter.selectorLabels" -}}
app.kubernetes.io/name: kvcap-exporter
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end -}}

{{- define "kvcap-exporter.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kvcap-exporter.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end -}}

{{/*
The label of the pods that run the sidecar; the monitors select it. Add it to your vLLM
pods' labels when you include the sidecar in your own chart.
*/}}
{{- define "kvcap-exporter.podLabels" -}}
kvcap-exporter/instance: {{ include "kvcap-exporter.fullname" . }}
{{- end -}}

{{- define "kvcap-exporter.podSelector" -}}
{{- if .values.scrape.podSelector -}}
{{- toYaml .values.scrape.podSelector -}}
{{- else -}}
{{- include "kvcap-exporter.podLabels" . -}}
{{- end -}}
{{- end -}}

{{- define "kvcap-exporter.image" -}}
{{- $image := .values.image -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository $image.tag -}}
{{- end -}}
{{- end -}}

{{/*
One argument, quoted for a POSIX shell (and Python's shlex, which the sidecar splits
KVCAP_VLLM_ARGS with): left as it is when it holds only safe characters, else in single
quotes, each ' written as '"'"'.
*/}}
{{- define "kvcap-exporter.shellQuote" -}}
{{- $arg := toString . -}}
{{- if regexMatch "^[A-Za-z0-9_@%+=:,./-]+$" $arg -}}
{{- $arg -}}
{{- else -}}
{{- printf "'%s'" ($arg | replace "'" "'\"'\"'") -}}
{{- end -}}
{{- end -}}

{{/* vllm.args as one shell-quoted string: the sidecar's KVCAP_VLLM_ARGS. */}}
{{- define "kvcap-exporter.vllmArgsString" -}}
{{- $quoted := list -}}
{{- range .values.vllm.args -}}
{{- $quoted = append $quoted (include "kvcap-exporter.shellQuote" .) -}}
{{- end -}}
{{- join " " $quoted -}}
{{- end -}}

{{- define "kvcap-exporter.webConfigEnabled" -}}
{{- if or .values.web.tls.enabled .values.web.basicAuth.enabled .values.web.existingSecret -}}true{{- end -}}
{{- end -}}

{{- define "kvcap-exporter.webConfigSecretName" -}}
{{- .values.web.existingSecret | default (include "kvcap-exporter.name" (dict "context" . "suffix" "web-config")) -}}
{{- end -}}

{{- define "kvcap-exporter.scheme" -}}
{{- if .values.web.tls.enabled -}}https{{- else -}}http{{- end -}}
{{- end -}}

{{/* The directory of an ipc:// handshake endpoint: the shared emptyDir's mount path. */}}
{{- define "kvcap-exporter.socketDir" -}}
{{- $endpoint := .values.handshake.endpoint -}}
{{- if hasPrefix "ipc://" $endpoint -}}
{{- $endpoint | trimPrefix "ipc://" | dir -}}
{{- end -}}
{{- end -}}

{{- define "kvcap-exporter.exampleSelectorLabels" -}}
app.kubernetes.io/name: vllm
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end -}}

{{/* The scrape settings PodMonitor and ServiceMonitor endpoints share. */}}
{{- define "kvcap-exporter.scrapeEndpoint" -}}
{{- $v := .values -}}
path: /metrics
scheme: {{ include "kvcap-exporter.scheme" . }}
interval: {{ $v.scrape.interval }}
scrapeTimeout: {{ $v.scrape.scrapeTimeout }}
{{- if $v.web.tls.enabled }}
tlsConfig:
  {{- if $v.scrape.tlsConfig }}
  {{- toYaml $v.scrape.tlsConfig | nindent 2 }}
  {{- else }}
  ca:
    secret:
      name: {{ required "web.tls.enabled: set scrape.tlsConfig or web.tls.secretName (whose ca.crt Prometheus checks the sidecar against)" $v.web.tls.secretName }}
      key: ca.crt
  serverName: {{ include "kvcap-exporter.fullname" . }}
  {{- end }}
{{- end }}
{{- if $v.web.basicAuth.enabled }}
basicAuth:
  username:
    name: {{ required "web.basicAuth.enabled: set scrape.basicAuthSecret.name (the Secret with the user name and password Prometheus sends)" $v.scrape.basicAuthSecret.name }}
    key: {{ $v.scrape.basicAuthSecret.usernameKey }}
  password:
    name: {{ $v.scrape.basicAuthSecret.name }}
    key: {{ $v.scrape.basicAuthSecret.passwordKey }}
{{- end }}
{{- with $v.scrape.relabelings }}
relabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.scrape.metricRelabelings }}
metricRelabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
