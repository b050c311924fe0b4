{{/*
Helpers shared by every template. Object names are namePrefix + a fixed suffix, the names the
kustomize overlays use when namePrefix is "kubegpu" (the default).
*/}}

{{/* An object's name: (list $ "node-agent") -> kubegpu-node-agent. */}}
{{- define "kubegpu.name" -}}
{{- $root := index . 0 -}}
{{- printf "%s-%s" $root.Values.namePrefix (index . 1) -}}
{{- end -}}

{{/* The namespace every namespaced object of the chart lives in (not the release's). */}}
{{- define "kubegpu.namespace" -}}
{{- .Values.namespace.name -}}
{{- end -}}

{{/*
Labels on every object's metadata: part-of, as the overlays set it, and Helm's standard labels
(e2e/tests/test_07_helm.py drops exactly these four before comparing with kustomize's output;
`kubectl get all,cm,sa -A -l app.kubernetes.io/instance=RELEASE` finds what a release made).
*/}}
{{- define "kubegpu.labels" -}}
app.kubernetes.io/part-of: kubegpu
{{ include "kubegpu.helmLabels" . }}
{{- end -}}

{{/* Helm's standard labels alone (the quota example, like deploy/examples/quota, is not part
of kubegpu's own objects). */}}
{{- define "kubegpu.helmLabels" -}}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The kubegpu image every role runs: repository:tag, or repository@digest when set. */}}
{{- define "kubegpu.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
A generated ConfigMap's name: its base name and the content hash kustomize's configMapGenerator
appends (sigs.k8s.io/kustomize/api/hasher: sha256 of the JSON of {data, kind, name}, the first
10 hex digits with 0 1 3 a e spelt g h k m t; its name is always "" there, because the hasher
looks up "metadata/name" as one field name). Changing the config renames the ConfigMap, so the
pods that mount it roll, exactly as with the overlays. (dict "name" "..." "data" (dict ...))
*/}}
{{- define "kubegpu.configMapName" -}}
{{- $hex := dict "data" .data "kind" "ConfigMap" "name" "" | toJson | sha256sum | trunc 10 -}}
{{- printf "%s-%s" .name ($hex | replace "0" "g" | replace "1" "h" | replace "3" "k" | replace "a" "m" | replace "e" "t") -}}
{{- end -}}

{{/* The node agent config file's text: the shipped file unless nodeAgent.config replaces it. */}}
{{- define "kubegpu.nodeAgentConfig" -}}
{{- if .Values.nodeAgent.config -}}
{{- .Values.nodeAgent.config -}}
{{- else if .Values.peerCompat.enabled -}}
{{- .Files.Get "files/peer-compat-node-agent-config.yaml" -}}
{{- else -}}
{{- .Files.Get "files/node-agent-config.yaml" -}}
{{- end -}}
{{- end -}}

{{/* The extender's settings file for the scheduler mode, with extender.policy and
extender.preemption applied. */}}
{{- define "kubegpu.extenderConfig" -}}
{{- $text := .Files.Get (printf "files/%s-extender-config.yaml" .Values.scheduler.mode) -}}
{{- $text = regexReplaceAll "(?m)^  policy: kubegpu$" $text (printf "  policy: %s" .Values.extender.policy) -}}
{{- if not .Values.extender.preemption -}}
{{- $text = printf "%s\n  preemption: false\n" (trimSuffix "\n" $text) -}}
{{- end -}}
{{- $text -}}
{{- end -}}

{{/* The kube-scheduler configuration for the scheduler mode. */}}
{{- define "kubegpu.kubeSchedulerConfig" -}}
{{- .Files.Get (printf "files/%s-kube-scheduler-config.yaml" .Values.scheduler.mode) -}}
{{- end -}}

{{- define "kubegpu.nodeAgentConfigMapName" -}}
{{- include "kubegpu.configMapName" (dict "name" (include "kubegpu.name" (list . "node-agent-config")) "data" (dict "config.yaml" (include "kubegpu.nodeAgentConfig" .))) -}}
{{- end -}}

{{- define "kubegpu.extenderConfigMapName" -}}
{{- include "kubegpu.configMapName" (dict "name" (include "kubegpu.name" (list . "extender-config")) "data" (dict "config.yaml" (include "kubegpu.extenderConfig" .))) -}}
{{- end -}}

{{- define "kubegpu.schedulerConfigMapName" -}}
{{- $base := ternary "scheduler-config" "default-scheduler-config" (eq .Values.scheduler.mode "second-scheduler") -}}
{{- include "kubegpu.configMapName" (dict "name" (include "kubegpu.name" (list . $base)) "data" (dict "config.yaml" (include "kubegpu.kubeSchedulerConfig" .))) -}}
{{- end -}}

{{- define "kubegpu.draDriverConfigMapName" -}}
{{- include "kubegpu.configMapName" (dict "name" (include "kubegpu.name" (list . "dra-driver-config")) "data" (dict "config.yaml" (.Files.Get "files/dra-driver-config.yaml"))) -}}
{{- end -}}
