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
{{- /* Checks across values that values.schema.json cannot express, as the operator makes them at start-up
(planner.core.config._validate, planner.operator.settings): helm refuses the values before the running
operator is replaced (the Deployment's strategy is Recreate). One line per problem, naming the keys. */ -}}
{{- define "dynoplan.validate" -}}
{{- $p := .Values.planner -}}
{{- $s := .Values.operator.settings -}}
{{- $e := list -}}
{{- if ge (float64 $p.load_adjustment_interval_s) (float64 $p.adjustment_interval_s) -}}
{{- $e = append $e (printf "planner.load_adjustment_interval_s=%v: expected less than planner.adjustment_interval_s=%v" $p.load_adjustment_interval_s $p.adjustment_interval_s) -}}
{{- end -}}
{{- if not (or $p.throughput_enabled $p.load_enabled) -}}
{{- $e = append $e "planner.throughput_enabled=false and planner.load_enabled=false: expected at least one loop enabled" -}}
{{- end -}}
{{- if gt (int64 $p.min_gpu_budget) (int64 $p.max_gpu_budget) -}}
{{- $e = append $e (printf "planner.min_gpu_budget=%v: expected <= planner.max_gpu_budget=%v" $p.min_gpu_budget $p.max_gpu_budget) -}}
{{- end -}}
{{- $pools := dict "disagg" (list "prefill" "decode") "prefill" (list "prefill") "decode" (list "decode") "agg" (list "agg") -}}
{{- $minGpus := 0 -}}
{{- range $pool := list "prefill" "decode" "agg" -}}
{{- $l := index $p $pool -}}
{{- if and (not (kindIs "invalid" $l.max_replicas)) (gt (int64 $l.min_replicas) (int64 $l.max_replicas)) -}}
{{- $e = append $e (printf "planner.%s.min_replicas=%v: expected <= planner.%s.max_replicas=%v" $pool $l.min_replicas $pool $l.max_replicas) -}}
{{- end -}}
{{- if has $pool (index $pools $p.mode) -}}
{{- $minGpus = add $minGpus (mul $l.min_replicas $l.gpus_per_engine) -}}
{{- end -}}
{{- end -}}
{{- if gt (int64 $minGpus) (int64 $p.max_gpu_budget) -}}
{{- $e = append $e (printf "planner.max_gpu_budget=%v: expected >= %v GPUs, what the pools' min_replicas x gpus_per_engine need" $p.max_gpu_budget $minGpus) -}}
{{- end -}}
{{- if gt (float64 $s.planner_min_sleep_s) (float64 $s.planner_max_sleep_s) -}}
{{- $e = append $e (printf "operator.settings.planner_min_sleep_s=%v: expected <= operator.settings.planner_max_sleep_s=%v" $s.planner_min_sleep_s $s.planner_max_sleep_s) -}}
{{- end -}}
{{- if $e -}}
{{- fail (printf "invalid values:\n- %s" (join "\n- " $e)) -}}
{{- end -}}
{{- end -}}
