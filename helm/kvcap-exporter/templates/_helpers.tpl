{{/*
Names and labels. Every helper takes (dict "values" <kvcap-exporter values> "root" $), the
same context as the sidecar templates in _sidecar.tpl, so a chart that includes the sidecar
computes the same names (Secrets, labels) as this chart does for its own objects.
*/}}

{{- define "kvcap-exporter.fullname" -}}
{{- $release := .root.Release.Name -}}
{{- if .values.fullnameOverride -}}
{{- .values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains "kvcap" $release -}}
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
pods' labels when you include the sidecar in your own chart. The kustomize component
(deploy/components/kvcap-sidecar) sets the same label, "kvcap-exporter/instance: kvcap":
the monitors of `helm install kvcap` select pods patched by either.
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

{{/* Whether vLLM gets kvcap's plugin from the sidecar image (plugin.enabled, with the handshake). */}}
{{- define "kvcap-exporter.pluginEnabled" -}}
{{- if and .values.plugin.enabled .values.handshake.enabled -}}true{{- end -}}
{{- end -}}

{{/* The monitors' endpoint for vLLM's own /metrics, its job relabelled to scrape.vllm.job. */}}
{{- define "kvcap-exporter.vllmScrapeEndpoint" -}}
{{- $v := .values -}}
path: {{ $v.scrape.vllm.path }}
scheme: http
interval: {{ $v.scrape.interval }}
scrapeTimeout: {{ $v.scrape.scrapeTimeout }}
relabelings:
  # Its own job: KvcapExporterDown watches the sidecars' jobs only.
  - targetLabel: job
    replacement: {{ $v.scrape.vllm.job }}
  {{- with $v.scrape.relabelings }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with $v.scrape.metricRelabelings }}
metricRelabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
The rules: files/kvcap-rules.yaml, each alert completed from prometheusRule.alerts.<name>
(dropped when not enabled): for, labels (severity, alertLabels, its own labels) and the
runbook_url annotation; ${threshold} and ${for} in its expression and annotations are its
values. An alert of the file without values, or values for no alert, fail the render.
*/}}
{{- define "kvcap-exporter.rules" -}}
{{- $settings := .values.prometheusRule -}}
{{- $file := .root.Files.Get "files/kvcap-rules.yaml" | fromYaml -}}
{{- if or (hasKey $file "Error") (not $file.groups) (ne (len $file) 1) -}}
{{- fail (printf "files/kvcap-rules.yaml must hold only groups: [...] (%v)" ($file.Error | default (keys $file))) -}}
{{- end -}}
{{- $seen := list -}}
{{- $groups := list -}}
{{- range $group := $file.groups -}}
{{- $rules := list -}}
{{- range $rule := $group.rules -}}
{{- if hasKey $rule "alert" -}}
{{- $name := $rule.alert -}}
{{- $seen = append $seen $name -}}
{{- $alert := required (printf "prometheusRule.alerts.%s: the settings of the alert are missing" $name) (get $settings.alerts $name) -}}
{{- if $alert.enabled -}}
{{- $threshold := "" -}}
{{- if hasKey $alert "threshold" -}}
{{- $threshold = toString $alert.threshold -}}
{{- else if contains "${threshold}" (toJson $rule) -}}
{{- fail (printf "prometheusRule.alerts.%s: the rule has a threshold; set threshold" $name) -}}
{{- end -}}
{{- $fill := dict "${threshold}" $threshold "${for}" $alert.for -}}
{{- $annotations := dict -}}
{{- range $key, $text := $rule.annotations -}}
{{- $_ := set $annotations $key ($text | replace "${threshold}" $threshold | replace "${for}" $alert.for) -}}
{{- end -}}
{{- $runbook := $alert.runbookUrl | default (ternary "" (printf "%s#%s" $settings.runbookBaseUrl (lower $name)) (empty $settings.runbookBaseUrl)) -}}
{{- with $runbook -}}
{{- $_ := set $annotations "runbook_url" . -}}
{{- end -}}
{{- $labels := merge (dict "severity" $alert.severity) (deepCopy $alert.labels) (deepCopy $settings.alertLabels) -}}
{{- $expr := $rule.expr | replace "${threshold}" $threshold | replace "${for}" $alert.for -}}
{{- $rules = append $rules (dict "alert" $name "expr" $expr "for" $alert.for "labels" $labels "annotations" $annotations) -}}
{{- end -}}
{{- else -}}
{{- $rules = append $rules $rule -}}
{{- end -}}
{{- end -}}
{{- if $rules -}}
{{- $groups = append $groups (dict "name" $group.name "rules" $rules) -}}
{{- end -}}
{{- end -}}
{{- range $name, $_ := $settings.alerts -}}
{{- if not (has $name $seen) -}}
{{- fail (printf "prometheusRule.alerts.%s: files/kvcap-rules.yaml has no such alert" $name) -}}
{{- end -}}
{{- end -}}
{{- toYaml (dict "groups" $groups) -}}
{{- end -}}

{{/* The Deployment autoscaling scales: autoscaling.deployment, else the example's. */}}
{{- define "kvcap-exporter.autoscalingTarget" -}}
{{- $v := .values -}}
{{- if $v.autoscaling.deployment -}}
{{- $v.autoscaling.deployment -}}
{{- else if $v.example.enabled -}}
{{- include "kvcap-exporter.name" (dict "context" . "suffix" "vllm") -}}
{{- else -}}
{{- fail "autoscaling: set autoscaling.deployment (the vLLM Deployment to scale) or example.enabled" -}}
{{- end -}}
{{- end -}}

{{/*
Replicas needed to keep targetFreeTokensPerReplica free KV tokens per replica on average:
used / (capacity per replica - target), over the engines whose usage is known, each counted
once (max by engine: a PodMonitor and a ServiceMonitor may both scrape a sidecar). Takes
(dict "values" "root" "matchers"): the label matchers of the Deployment's kvcap series.
*/}}
{{- define "kvcap-exporter.replicasNeededQuery" -}}
{{- $m := .matchers -}}
{{- $target := int64 .values.autoscaling.targetFreeTokensPerReplica -}}
sum(max by (namespace, pod, engine) (kvcap_kv_cache_used_tokens{ {{- $m -}} }))
/
clamp_min(
  sum(max by (namespace, pod, engine) (kvcap_kv_cache_capacity_tokens{ {{- $m -}} } and kvcap_kv_cache_used_tokens{ {{- $m -}} }))
  / count(count by (namespace, pod) (kvcap_kv_cache_used_tokens{ {{- $m -}} }))
  - {{ $target }},
  1
)
{{- end -}}

{{- define "kvcap-exporter.autoscalingMatchers" -}}
{{- $v := .values -}}
{{- if $v.autoscaling.matchers -}}
{{- $v.autoscaling.matchers -}}
{{- else if $v.autoscaling.modelName -}}
{{- printf "namespace=%q, model_name=%q" .root.Release.Namespace $v.autoscaling.modelName -}}
{{- else -}}
{{- printf "namespace=%q, pod=~%q" .root.Release.Namespace (printf "%s-.+" (include "kvcap-exporter.autoscalingTarget" .)) -}}
{{- end -}}
{{- end -}}
