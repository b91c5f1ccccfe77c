#!/bin/sh
# A Helm post-renderer that adds the kvcap sidecar and kvcap's vLLM plugin to the vLLM
# Deployments of a chart you don't own, with kustomize and deploy/components/kvcap-sidecar.
# Helm pipes the rendered manifests in; they come out with the component applied.
#
#   Helm 4: helm plugin install deploy/helm-post-renderer
#           helm install my-stack vllm/vllm-stack --post-renderer kvcap-kustomize \
#             --post-renderer-args=--selector=model
#   Helm 3: helm install my-stack vllm/vllm-stack \
#             --post-renderer deploy/helm-post-renderer/kvcap-kustomize.sh \
#             --post-renderer-args=--selector=model
#
# Options (or the environment variable in brackets):
#   --selector=SEL    a label selector of the Deployments to patch (KVCAP_SELECTOR); they
#                     get kvcap-exporter/inject: "true". Empty: only the Deployments that
#                     already carry that label.
#   --container=NAME  vLLM's container (KVCAP_VLLM_CONTAINER). Empty: the first container.
#   --component=DIR   the kvcap-sidecar component (KVCAP_COMPONENT); default: the one of
#                     this repository, beside this script.
#   --kubectl=PATH    kubectl, whose `kubectl kustomize` runs (KVCAP_KUBECTL).
# docs/plugin.md describes the whole route.
set -eu

here=$(cd "$(dirname "$0")" && pwd -P)
selector=${KVCAP_SELECTOR:-}
container=${KVCAP_VLLM_CONTAINER:-}
component=${KVCAP_COMPONENT:-$here/../components/kvcap-sidecar}
kubectl=${KVCAP_KUBECTL:-kubectl}
for arg in "$@"; do
	case $arg in
	--selector=*) selector=${arg#*=} ;;
	--container=*) container=${arg#*=} ;;
	--component=*) component=${arg#*=} ;;
	--kubectl=*) kubectl=${arg#*=} ;;
	*) echo "kvcap-kustomize: unknown argument $arg" >&2; exit 2 ;;
	esac
done
if [ ! -f "$component/kustomization.yaml" ]; then
	echo "kvcap-kustomize: no kustomize component at $component (use --component=DIR)" >&2
	exit 2
fi
case $container in
*[!a-z0-9-]*) echo "kvcap-kustomize: --container=$container is not a container name" >&2; exit 2 ;;
esac

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/chart" "$work/out"
cat >"$work/chart/all.yaml"
# kustomize takes components by relative path only.
cp -R "$component" "$work/component"

# The chart's output, with the Deployments to patch labelled (and annotated with vLLM's
# container) before the component sees them.
{
	echo "resources: [all.yaml]"
	if [ -n "$selector" ]; then
		cat <<YAML
patches:
  - target: {group: apps, kind: Deployment, labelSelector: "$selector"}
    patch: |-
      apiVersion: apps/v1
      kind: Deployment
      metadata:
        name: any
        labels: {kvcap-exporter/inject: "true"}
YAML
		if [ -n "$container" ]; then
			echo "        annotations: {kvcap-exporter/container: $container}"
		fi
	fi
} >"$work/chart/kustomization.yaml"

{
	echo "resources: [../chart]"
	echo "components: [../component]"
	if [ -n "$container" ]; then
		# The component's vllm-container.yaml, for the named container instead of the first.
		echo "replacements:"
		for pair in \
			"spec.handshakeEndpoint env.[name=KVCAP_HANDSHAKE_ENDPOINT].value" \
			"spec.pluginMount.mountPath env.[name=PYTHONPATH].value" \
			"spec.socketDir volumeMounts.[name=kvcap-run].mountPath" \
			"spec.pluginMount volumeMounts.[name=kvcap-plugin]"; do
			set -- $pair
			cat <<YAML
  - source: {kind: KvcapSidecarSettings, name: kvcap-sidecar-settings, fieldPath: $1}
    targets:
      - select: {group: apps, kind: Deployment, annotationSelector: "kvcap-exporter/container=$container"}
        fieldPaths: ["spec.template.spec.containers.[name=$container].$2"]
        options: {create: true}
YAML
		done
	fi
} >"$work/out/kustomization.yaml"

"$kubectl" kustomize "$work/out"
