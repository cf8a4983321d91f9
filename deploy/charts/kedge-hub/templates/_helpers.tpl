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
