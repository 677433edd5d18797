{{/*
Where metrics.certSecret's tls.crt and tls.key are mounted (--metrics-cert-path).
*/}}
{{- define "trainingjob-operator.metricsCertPath" -}}
/etc/trainingjob-operator/metrics-certs
{{- end -}}
