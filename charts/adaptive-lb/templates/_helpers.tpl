{{- define "adaptive-lb.name" -}}adaptive-lb{{- end -}}

{{- define "adaptive-lb.labels" -}}
app.kubernetes.io/name: adaptive-lb
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- /* The operator's leader Lease, per release: two releases in one namespace must not share a
leader. The watchdog and the uninstall hook read the same Lease. */ -}}
{{- define "adaptive-lb.leaseName" -}}
{{- .Values.leaderElection.id | default (printf "%s-adaptive-lb" .Release.Name) -}}
{{- end -}}

{{- define "adaptive-lb.selectorLabels" -}}
app.kubernetes.io/name: adaptive-lb
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- /* API Priority and Fairness objects are cluster-scoped: the release name keeps two releases'
apart. */ -}}
{{- define "adaptive-lb.membershipFlowSchemaName" -}}
{{- printf "%s-adaptive-lb-membership" .Release.Name -}}
{{- end -}}

{{- define "adaptive-lb.statusFlowSchemaName" -}}
{{- printf "%s-adaptive-lb-status" .Release.Name -}}
{{- end -}}

{{- define "adaptive-lb.statusPriorityLevelName" -}}
{{- printf "%s-adaptive-lb-status" .Release.Name -}}
{{- end -}}
