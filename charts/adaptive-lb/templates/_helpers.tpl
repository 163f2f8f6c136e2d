{{- define "adaptive-lb.name" -}}adaptive-lb{{- end -}}

{{- define "adaptive-lb.labels" -}}
app.kubernetes.io/name: adaptive-lb
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "adaptive-lb.selectorLabels" -}}
app.kubernetes.io/name: adaptive-lb
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
