{{- define "kedge-agent.labels" -}}
app.kubernetes.io/name: kedge-agent
app.kubernetes.io/part-of: kedge
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The Secret the agent reads its connection material from. */}}
{{- define "kedge-agent.secret" -}}
{{ .Values.existingSecret | default "kedge-agent-bootstrap" }}
{{- end -}}

{{/* The workload rules of kedge_hub::install::agent (workload_rules). */}}
{{- define "kedge-agent.workloadRules" -}}
{{- range .Values.kinds }}
- apiGroups: [{{ .group | quote }}]
  resources: [{{ .plural | quote }}]
  verbs: [list, watch]
- apiGroups: [{{ .group | quote }}]
  resources: [{{ printf "%s/scale" .plural | quote }}]
  verbs: [get, patch]
{{- end }}
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [create, get, list, watch, delete]
- apiGroups: [autoscaling]
  resources: [horizontalpodautoscalers]
  verbs: [list, watch]
- apiGroups: [keda.sh]
  resources: [scaledobjects]
  verbs: [list, watch]
{{- end -}}

{{- define "kedge-agent.subjects" -}}
- kind: ServiceAccount
  name: kedge-agent
  namespace: {{ .Release.Namespace }}
{{- end -}}

{{/* --kinds: group/version/Kind, version/Kind for the core group. */}}
{{- define "kedge-agent.kinds" -}}
{{- $out := list -}}
{{- range .Values.kinds -}}
{{- if .group -}}
{{- $out = append $out (printf "%s/%s/%s" .group .version .kind) -}}
{{- else -}}
{{- $out = append $out (printf "%s/%s" .version .kind) -}}
{{- end -}}
{{- end -}}
{{- join "," $out -}}
{{- end -}}
