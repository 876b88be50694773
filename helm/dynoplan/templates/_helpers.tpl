{{- define "dynoplan.fullname" -}}{{ printf "%s-dynoplan" .Release.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- define "dynoplan.labels" -}}
app.kubernetes.io/name: dynoplan
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
{{- define "dynoplan.image" -}}{{ printf "%s:%s" .Values.image.repository .Values.image.tag }}{{- end -}}
{{- define "dynoplan.prometheusUrl" -}}
{{- if .Values.operator.settings.prometheus_url -}}{{ .Values.operator.settings.prometheus_url }}
{{- else if .Values.prometheus.deploy -}}{{ printf "http://%s-prometheus.%s.svc:9090" (include "dynoplan.fullname" .) .Release.Namespace }}
{{- else -}}http://prometheus:9090{{- end -}}
{{- end -}}
