{{/*
The sidecar, as named templates a vLLM pod template is built from. Each takes
(dict "values" <kvcap-exporter values> "root" $). From a chart that has kvcap-exporter as a
dependency: (dict "values" (index .Values "kvcap-exporter") "root" $). README.md shows a pod.

  kvcap-exporter.initContainers     the plugin installer and the sidecar: items of the pod's
                                    initContainers (the two below)
  kvcap-exporter.pluginInstaller    copies kvcap's vLLM plugin from the sidecar image into
                                    the kvcap-plugin volume (empty when plugin.enabled=false)
  kvcap-exporter.sidecar            the sidecar: one item of the pod's initContainers
  kvcap-exporter.volumes            the volumes it needs: items of the pod's volumes
  kvcap-exporter.vllmEnv            env items of the vLLM container (the handshake endpoint,
                                    PYTHONPATH with the plugin)
  kvcap-exporter.vllmVolumeMounts   volumeMounts items of the vLLM container (socket dir,
                                    plugin folder)
  kvcap-exporter.podLabels          the pod label the PodMonitor selects (_helpers.tpl)

The vLLM container itself takes vllm.args as its args: the same list the sidecar reads.
*/}}

{{- define "kvcap-exporter.initContainers" -}}
{{- $installer := include "kvcap-exporter.pluginInstaller" . | trim -}}
{{- if $installer }}{{ $installer }}
{{ end -}}
{{ include "kvcap-exporter.sidecar" . }}
{{- end -}}

{{/*
kvcap's vLLM plugin without rebuilding vLLM's image: the sidecar image holds it at
/opt/kvcap-plugin (the wheel installed with --target: the package and its .dist-info,
whose entry_points.txt registers it in vllm.general_plugins); this init container copies
it into the kvcap-plugin volume, which vLLM mounts read-only at plugin.mountPath, on its
PYTHONPATH. It needs only msgspec and pyzmq, which vLLM has.
*/}}
{{- define "kvcap-exporter.pluginInstaller" -}}
{{- if include "kvcap-exporter.pluginEnabled" . -}}
{{- $v := .values -}}
- name: {{ $v.sidecar.name }}-plugin
  image: {{ include "kvcap-exporter.image" . | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  command: ["cp", "-R", "/opt/kvcap-plugin/.", "/kvcap-plugin/"]
  resources:
    {{- toYaml $v.plugin.resources | nindent 4 }}
  securityContext:
    {{- toYaml $v.sidecar.securityContext | nindent 4 }}
  volumeMounts:
    - name: kvcap-plugin
      mountPath: /kvcap-plugin
{{- end -}}
{{- end -}}

{{/*
HF_HOME and HF_HUB_CACHE of vLLM's Hugging Face cache (model.hfHome, default
<model.mountPath>/huggingface; model.hfHubCache), as env items; the example's env wins, as
in its vLLM container. The sidecar gets the same, to find the config.json of a model id.
*/}}
{{- define "kvcap-exporter.hfCacheEnv" -}}
{{- $v := .values -}}
{{- $home := $v.model.hfHome | default (printf "%s/huggingface" $v.model.mountPath) -}}
{{- $hubCache := $v.model.hfHubCache -}}
{{- if $v.example.enabled }}
{{- range $v.example.env }}
{{- if and (eq .name "HF_HOME") .value }}{{ $home = .value }}{{ end }}
{{- if and (eq .name "HF_HUB_CACHE") .value }}{{ $hubCache = .value }}{{ end }}
{{- end }}
{{- end -}}
- name: HF_HOME
  value: {{ $home | quote }}
{{- with $hubCache }}
- name: HF_HUB_CACHE
  value: {{ . | quote }}
{{- end }}
{{- end -}}

{{- define "kvcap-exporter.sidecar" -}}
{{- include "kvcap-exporter.checkValues" . -}}
{{- $v := .values -}}
- name: {{ $v.sidecar.name }}
  image: {{ include "kvcap-exporter.image" . | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  # A native sidecar: it starts before vLLM, stops after it, and restarts on its own.
  restartPolicy: Always
  args:
    - --web.listen-address=:{{ $v.sidecar.port }}
    - --log.level={{ $v.sidecar.logLevel }}
    - --log.format={{ $v.sidecar.logFormat }}
    {{- if include "kvcap-exporter.webConfigEnabled" . }}
    - --web.config.file=/etc/kvcap/web/web-config.yml
    {{- end }}
    {{- if not $v.handshake.enabled }}
    - --no-collector.handshake
    {{- end }}
    {{- range $name, $on := $v.sidecar.collectors }}
    - --{{ if not $on }}no-{{ end }}collector.{{ $name }}
    {{- end }}
    - --vllm.url=http://127.0.0.1:{{ $v.vllm.port }}
    {{- with $v.model.config }}
    - --model.config={{ . }}
    {{- end }}
    {{- with $v.nvml.visibleDevices }}
    - --nvml.visible-devices={{ . }}
    {{- end }}
    {{- range $v.sidecar.extraArgs }}
    - {{ . | quote }}
    {{- end }}
  {{- if or $v.handshake.enabled $v.vllm.args $v.model.volumeName $v.nvml.runtimeDevices $v.sidecar.extraEnv }}
  env:
    {{- if $v.handshake.enabled }}
    - name: KVCAP_HANDSHAKE_LISTEN
      value: {{ $v.handshake.endpoint | quote }}
    {{- end }}
    {{- if $v.vllm.args }}
    # vllm.args, the list the vLLM container runs with, shell-quoted.
    - name: KVCAP_VLLM_ARGS
      value: {{ include "kvcap-exporter.vllmArgsString" . | quote }}
    {{- end }}
    {{- if $v.model.volumeName }}
    # The Hugging Face cache vLLM reads a model id from: the sidecar reads its config.json.
    {{- include "kvcap-exporter.hfCacheEnv" . | nindent 4 }}
    {{- end }}
    {{- with $v.nvml.runtimeDevices }}
    # NVML without a GPU request: the toolkit mounts the driver's library and devices.
    - name: NVIDIA_VISIBLE_DEVICES
      value: {{ . | quote }}
    - name: NVIDIA_DRIVER_CAPABILITIES
      value: utility
    {{- end }}
    {{- with $v.sidecar.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- end }}
  ports:
    - name: kvcap-metrics
      containerPort: {{ $v.sidecar.port }}
      protocol: TCP
  startupProbe:
    {{- include "kvcap-exporter.probeAction" (dict "values" $v "path" "/healthz") | nindent 4 }}
    {{- toYaml $v.sidecar.probes.startup | nindent 4 }}
  livenessProbe:
    {{- include "kvcap-exporter.probeAction" (dict "values" $v "path" "/healthz") | nindent 4 }}
    {{- toYaml $v.sidecar.probes.liveness | nindent 4 }}
  readinessProbe:
    {{- include "kvcap-exporter.probeAction" (dict "values" $v "path" "/readyz") | nindent 4 }}
    {{- toYaml $v.sidecar.probes.readiness | nindent 4 }}
  resources:
    {{- toYaml $v.sidecar.resources | nindent 4 }}
  securityContext:
    {{- toYaml $v.sidecar.securityContext | nindent 4 }}
  {{- $mounts := include "kvcap-exporter.sidecarVolumeMounts" . | trim }}
  {{- if $mounts }}
  volumeMounts:
    {{- $mounts | nindent 4 }}
  {{- end }}
{{- end -}}

{{- define "kvcap-exporter.sidecarVolumeMounts" -}}
{{- $v := .values -}}
{{- $socketDir := include "kvcap-exporter.socketDir" . -}}
{{- if and $v.handshake.enabled $socketDir }}
- name: kvcap-run
  mountPath: {{ $socketDir }}
{{- end }}
{{- if $v.model.volumeName }}
- name: {{ $v.model.volumeName }}
  mountPath: {{ $v.model.mountPath }}
  readOnly: true
{{- end }}
{{- if include "kvcap-exporter.webConfigEnabled" . }}
- name: kvcap-web-config
  mountPath: /etc/kvcap/web
  readOnly: true
{{- end }}
{{- if and $v.web.tls.enabled $v.web.tls.secretName }}
- name: kvcap-tls
  mountPath: /etc/kvcap/tls
  readOnly: true
{{- end }}
{{- with $v.sidecar.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
An HTTP probe on .path, over HTTPS with TLS. Kubelet cannot answer basic auth without
headers given for it, nor present a client certificate: then a TCP connect.
*/}}
{{- define "kvcap-exporter.probeAction" -}}
{{- $v := .values -}}
{{- $needsCert := and $v.web.tls.enabled (has $v.web.tls.clientAuthType (list "RequireAnyClientCert" "RequireAndVerifyClientCert")) -}}
{{- $cannotAuth := and $v.web.basicAuth.enabled (not $v.sidecar.probes.httpHeaders) -}}
{{- if or $needsCert $cannotAuth -}}
tcpSocket:
  port: kvcap-metrics
{{- else -}}
httpGet:
  path: {{ .path }}
  port: kvcap-metrics
  scheme: {{ ternary "HTTPS" "HTTP" $v.web.tls.enabled }}
  {{- with $v.sidecar.probes.httpHeaders }}
  httpHeaders:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
{{- end -}}

{{- define "kvcap-exporter.volumes" -}}
{{- $v := .values -}}
{{- if include "kvcap-exporter.pluginEnabled" . }}
# kvcap's vLLM plugin, copied from the sidecar image, on vLLM's PYTHONPATH.
- name: kvcap-plugin
  emptyDir:
    sizeLimit: 32Mi
{{- end }}
{{- if and $v.handshake.enabled (include "kvcap-exporter.socketDir" .) }}
# The handshake socket's directory, shared with vLLM.
- name: kvcap-run
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
{{- end }}
{{- if include "kvcap-exporter.webConfigEnabled" . }}
- name: kvcap-web-config
  secret:
    secretName: {{ include "kvcap-exporter.webConfigSecretName" . }}
{{- end }}
{{- if and $v.web.tls.enabled $v.web.tls.secretName }}
- name: kvcap-tls
  secret:
    secretName: {{ $v.web.tls.secretName }}
{{- end }}
{{- end -}}

{{- define "kvcap-exporter.vllmEnv" -}}
{{- if .values.handshake.enabled }}
# kvcap's vLLM plugin pushes each engine's ready response here.
- name: KVCAP_HANDSHAKE_ENDPOINT
  value: {{ .values.handshake.endpoint | quote }}
{{- end }}
{{- if include "kvcap-exporter.pluginEnabled" . }}
# vLLM finds the plugin by the entry point of its .dist-info in this folder.
- name: PYTHONPATH
  value: {{ .values.plugin.mountPath | quote }}
{{- end }}
{{- end -}}

{{- define "kvcap-exporter.vllmVolumeMounts" -}}
{{- $socketDir := include "kvcap-exporter.socketDir" . -}}
{{- if and .values.handshake.enabled $socketDir }}
- name: kvcap-run
  mountPath: {{ $socketDir }}
{{- end }}
{{- if include "kvcap-exporter.pluginEnabled" . }}
- name: kvcap-plugin
  mountPath: {{ .values.plugin.mountPath }}
  readOnly: true
{{- end }}
{{- end -}}

{{/* Value combinations the schema cannot refuse on its own. */}}
{{- define "kvcap-exporter.checkValues" -}}
{{- $v := .values -}}
{{- if and $v.web.tls.enabled (not $v.web.tls.secretName) (not $v.web.existingSecret) -}}
{{- fail "web.tls.enabled needs web.tls.secretName (a kubernetes.io/tls Secret) or web.existingSecret" -}}
{{- end -}}
{{- if and $v.web.basicAuth.enabled (not $v.web.basicAuth.users) (not $v.web.existingSecret) -}}
{{- fail "web.basicAuth.enabled needs web.basicAuth.users (name: bcrypt hash) or web.existingSecret" -}}
{{- end -}}
{{- if and $v.handshake.enabled (hasPrefix "tcp://" $v.handshake.endpoint) (not (hasPrefix "tcp://127.0.0.1:" $v.handshake.endpoint)) -}}
{{- fail "handshake.endpoint: bind tcp:// only to 127.0.0.1 (the handshake has no authentication)" -}}
{{- end -}}
{{- end -}}
