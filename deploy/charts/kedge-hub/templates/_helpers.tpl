{{/* Labels of every object: the ones kedge's own renderers set, plus Helm's. */}}
{{- define "kedge-hub.labels" -}}
app.kubernetes.io/name: kedge-hub
app.kubernetes.io/part-of: kedge
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "kedge-hub.selector" -}}
app.kubernetes.io/name: kedge-hub
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
What KEDA dials: scaler.address, else the Service kedge-hub-scaler. (A release upgraded with
--reuse-values from chart 0.1.0 has no `scaler` values: templates read them as
`.Values.scaler | default dict`, a scaler turned off.)
*/}}
{{- define "kedge-hub.scalerAddress" -}}
{{- $scaler := .Values.scaler | default dict -}}
{{- $scaler.address | default (printf "kedge-hub-scaler.%s.svc:%v" .Release.Namespace $scaler.port) -}}
{{- end -}}
