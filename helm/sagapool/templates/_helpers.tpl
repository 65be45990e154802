{{/* Names ---------------------------------------------------------------- */}}

{{- define "sagapool.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Object name prefix: at most 52 characters so suffixes like "-migrate" keep names within 63. */}}
{{- define "sagapool.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "sagapool.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Standard labels. Call with (dict "ctx" $ "component" "worker"). */}}
{{- define "sagapool.labels" -}}
helm.sh/chart: {{ include "sagapool.chart" .ctx }}
{{ include "sagapool.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: sagapool
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels that select the pods of one component; never change them after release (Deployment selectors are immutable). */}}
{{- define "sagapool.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sagapool.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "sagapool.workerName" -}}
{{- printf "%s-worker" (include "sagapool.fullname" .) }}
{{- end }}

{{- define "sagapool.metricsServiceName" -}}
{{- printf "%s-metrics" (include "sagapool.fullname" .) }}
{{- end }}

{{- define "sagapool.configMapName" -}}
{{- printf "%s-config" (include "sagapool.fullname" .) }}
{{- end }}

{{/* The Secret the chart creates for credentials given inline in values (trials only). */}}
{{- define "sagapool.credentialsSecretName" -}}
{{- printf "%s-credentials" (include "sagapool.fullname" .) }}
{{- end }}

{{- define "sagapool.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sagapool.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "sagapool.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Durations ------------------------------------------------------------ */}}

{{/* Whole seconds (rounded up) of a duration like "20s", "1500ms", "2m", "1h". */}}
{{- define "sagapool.seconds" -}}
{{- $d := toString . }}
{{- $n := regexFind "^[0-9]+" $d | float64 }}
{{- $unit := trimPrefix (regexFind "^[0-9]+" $d) $d }}
{{- $s := 0.0 }}
{{- if eq $unit "ms" }}{{ $s = divf $n 1000 }}
{{- else if eq $unit "s" }}{{ $s = $n }}
{{- else if eq $unit "m" }}{{ $s = mulf $n 60 }}
{{- else if eq $unit "h" }}{{ $s = mulf $n 3600 }}
{{- else }}{{ fail (printf "cannot read the duration %q: use a number followed by ms, s, m or h" $d) }}
{{- end }}
{{- ceil $s | int }}
{{- end }}

{{- define "sagapool.terminationGracePeriodSeconds" -}}
{{- $drain := include "sagapool.seconds" .Values.worker.drainTimeout | int }}
{{- if kindIs "invalid" .Values.worker.terminationGracePeriodSeconds }}
{{- add $drain 15 }}
{{- else }}
{{- .Values.worker.terminationGracePeriodSeconds | int }}
{{- end }}
{{- end }}

{{/* Autoscaling ---------------------------------------------------------- */}}

{{- define "sagapool.autoscaling" -}}
{{- if or .Values.autoscaling.hpa.enabled .Values.autoscaling.keda.enabled }}true{{ end }}
{{- end }}

{{/* Kafka ---------------------------------------------------------------- */}}

{{- define "sagapool.kafkaSecurityProtocol" -}}
{{- if .Values.kafka.securityProtocol }}
{{- .Values.kafka.securityProtocol }}
{{- else if .Values.kafka.sasl.enabled }}
{{- "SASL_SSL" }}
{{- end }}
{{- end }}

{{- define "sagapool.kafkaCaPath" -}}
/etc/sagapool/kafka-ca/{{ .Values.kafka.tls.caKey }}
{{- end }}

{{/* librdkafka properties the chart sets itself (as --kafka-opt in the config file). */}}
{{- define "sagapool.kafkaOptions" -}}
{{- $opts := list }}
{{- with include "sagapool.kafkaSecurityProtocol" . }}
{{- $opts = append $opts (printf "security.protocol=%s" .) }}
{{- end }}
{{- if .Values.kafka.sasl.enabled }}
{{- $opts = append $opts (printf "sasl.mechanism=%s" .Values.kafka.sasl.mechanism) }}
{{- end }}
{{- if .Values.kafka.tls.caSecret }}
{{- $opts = append $opts (printf "ssl.ca.location=%s" (include "sagapool.kafkaCaPath" .)) }}
{{- end }}
{{- range $k := keys .Values.kafka.options | sortAlpha }}
{{- $val := get $.Values.kafka.options $k }}
{{- /* values files give numbers as float64, which %v would print as 5.24288e+07 */}}
{{- if and (kindIs "float64" $val) (eq $val (float64 (int64 $val))) }}{{ $val = int64 $val }}{{ end }}
{{- $opts = append $opts (printf "%s=%v" $k $val) }}
{{- end }}
{{- toJson $opts }}
{{- end }}

{{/* Stores and credentials ------------------------------------------------ */}}

{{/* Whether the chart must create the credentials Secret (inline store URLs or inline SASL). */}}
{{- define "sagapool.needsCredentialsSecret" -}}
{{- $need := false }}
{{- range .Values.stores }}
{{- if not (or .existingSecret .passwordSecret) }}{{ $need = true }}{{ end }}
{{- end }}
{{- if and .Values.kafka.sasl.enabled (not .Values.kafka.sasl.existingSecret) }}{{ $need = true }}{{ end }}
{{- if $need }}true{{ end }}
{{- end }}

{{/* Data of the chart-created credentials Secret (base64, Secret "data"). */}}
{{- define "sagapool.credentialsData" -}}
{{- range $i, $s := .Values.stores }}
{{- if not (or $s.existingSecret $s.passwordSecret) }}
store-{{ $i }}-url: {{ $s.url | b64enc | quote }}
{{- end }}
{{- end }}
{{- if and .Values.kafka.sasl.enabled (not .Values.kafka.sasl.existingSecret) }}
kafka-sasl-username: {{ .Values.kafka.sasl.username | b64enc | quote }}
kafka-sasl-password: {{ .Values.kafka.sasl.password | b64enc | quote }}
{{- end }}
{{- end }}

{{/*
Environment holding the store URLs: SAGA_STORE_<i>, always from a Secret.
A URL whose password lives in its own Secret is put together by Kubernetes'
$(VAR) expansion, which only sees variables listed earlier: STORE_<i>_PASSWORD
comes first. Last comes SAGA_STORE, the programs' --store: every SAGA_STORE_<i>
in shard order, one a line (--store splits its value at newlines). The URLs
never go into args, where the expanded command line would show a password to
ps and /proc/PID/cmdline. Call with (dict "ctx" $ "secretName" NAME-OF-THE-CHART-SECRET).
*/}}
{{- define "sagapool.storeEnv" -}}
{{- $secret := .secretName }}
{{- range $i, $s := .ctx.Values.stores }}
{{- if $s.existingSecret }}
- name: SAGA_STORE_{{ $i }}
  valueFrom:
    secretKeyRef:
      name: {{ $s.existingSecret | quote }}
      key: {{ default "url" $s.existingSecretKey | quote }}
{{- else if $s.passwordSecret }}
- name: STORE_{{ $i }}_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $s.passwordSecret.name | quote }}
      key: {{ default "password" $s.passwordSecret.key | quote }}
- name: SAGA_STORE_{{ $i }}
  value: {{ printf "%s%spassword=$(STORE_%d_PASSWORD)" $s.url (ternary "&" "?" (contains "?" $s.url)) $i | quote }}
{{- else }}
- name: SAGA_STORE_{{ $i }}
  valueFrom:
    secretKeyRef:
      name: {{ $secret | quote }}
      key: store-{{ $i }}-url
{{- end }}
{{- end }}
{{- $refs := list }}
{{- range $i, $_ := .ctx.Values.stores }}
{{- $refs = append $refs (printf "$(SAGA_STORE_%d)" $i) }}
{{- end }}
- name: SAGA_STORE
  value: {{ join "\n" $refs | toJson }}
{{- end }}

{{- define "sagapool.kafkaSaslEnv" -}}
{{- if .Values.kafka.sasl.enabled }}
{{- $name := default (include "sagapool.credentialsSecretName" .) .Values.kafka.sasl.existingSecret }}
- name: SAGA_KAFKA_SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ $name | quote }}
      key: {{ ternary .Values.kafka.sasl.usernameKey "kafka-sasl-username" (ne .Values.kafka.sasl.existingSecret "") | quote }}
- name: SAGA_KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $name | quote }}
      key: {{ ternary .Values.kafka.sasl.passwordKey "kafka-sasl-password" (ne .Values.kafka.sasl.existingSecret "") | quote }}
{{- end }}
{{- end }}

{{/* Extra volumes and network policy ---------------------------------------- */}}

{{/* The chart's own volumes and mount paths, which extraVolumes and extraVolumeMounts may not shadow. */}}
{{- define "sagapool.ownVolumeNames" -}}
{{- toJson (list "config" "tmp" "kafka-ca") }}
{{- end }}
{{- define "sagapool.ownMountPaths" -}}
{{- toJson (list "/tmp" "/etc/sagapool/worker.toml" "/etc/sagapool/kafka-ca") }}
{{- end }}

{{/* "true" when the path (dict "ctx" $ "path" P) is one of extraVolumeMounts or lies under one. */}}
{{- define "sagapool.inExtraMount" -}}
{{- $p := .path }}
{{- range .ctx.Values.extraVolumeMounts }}
{{- $m := trimSuffix "/" .mountPath }}
{{- if or (eq $p $m) (hasPrefix (printf "%s/" $m) $p) }}true{{ end }}
{{- end }}
{{- end }}

{{/*
The Secret and key behind a file path in the containers, through
extraVolumeMounts (the deepest mount wins) and the secret volumes of
extraVolumes, as JSON {"name", "key"}; {} when no Secret holds it. Call with
(dict "ctx" $ "path" P).
*/}}
{{- define "sagapool.secretFileOf" -}}
{{- $p := .path }}
{{- $mount := dict }}
{{- range .ctx.Values.extraVolumeMounts }}
{{- $m := trimSuffix "/" .mountPath }}
{{- if and (or (eq $p $m) (hasPrefix (printf "%s/" $m) $p)) (gt (len $m) (len (default "" $mount.path))) }}
{{- $mount = dict "path" $m "volume" .name "subPath" (default "" .subPath) }}
{{- end }}
{{- end }}
{{- $out := dict }}
{{- range .ctx.Values.extraVolumes }}
{{- if and $mount.volume (eq .name $mount.volume) .secret }}
{{- $rel := trimPrefix "/" (trimPrefix $mount.path $p) }}
{{- if $mount.subPath }}{{ $rel = trimSuffix "/" (printf "%s/%s" $mount.subPath $rel) }}{{ end }}
{{- $key := $rel }}
{{- if .secret.items }}
{{- $key = "" }}
{{- range .secret.items }}{{ if eq .path $rel }}{{ $key = .key }}{{ end }}{{ end }}
{{- end }}
{{- if $key }}{{ $out = dict "name" .secret.secretName "key" $key }}{{ end }}
{{- end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/* TCP ports of the brokers for the egress policy: networkPolicy.egress.kafka.ports, or those of kafka.brokers. */}}
{{- define "sagapool.kafkaEgressPorts" -}}
{{- $ports := .Values.networkPolicy.egress.kafka.ports }}
{{- if not $ports }}
{{- $ports = list }}
{{- range splitList "," .Values.kafka.brokers }}
{{- $port := regexFind "[0-9]+$" . | int64 }}
{{- if not (has $port $ports) }}{{ $ports = append $ports $port }}{{ end }}
{{- end }}
{{- end }}
{{- toJson $ports }}
{{- end }}

{{/*
Egress rules (NetworkPolicyEgressRule list): DNS over UDP and TCP, the
stores, and with (dict "ctx" $ "kafka" true) the brokers. Nothing else: a
pod selected by a policy with these rules reaches no other destination.
*/}}
{{- define "sagapool.egressRules" -}}
{{- $e := .ctx.Values.networkPolicy.egress }}
- ports:
    {{- range $e.dns.ports }}
    - port: {{ . | int64 }}
      protocol: UDP
    - port: {{ . | int64 }}
      protocol: TCP
    {{- end }}
  {{- with $e.dns.to }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
- ports:
    {{- range $e.stores.ports }}
    - port: {{ . | int64 }}
      protocol: TCP
    {{- end }}
  to:
    {{- toYaml $e.stores.to | nindent 4 }}
{{- if .kafka }}
- ports:
    {{- range include "sagapool.kafkaEgressPorts" .ctx | fromJsonArray }}
    - port: {{ . | int64 }}
      protocol: TCP
    {{- end }}
  to:
    {{- toYaml $e.kafka.to | nindent 4 }}
{{- end }}
{{- end }}

{{/* Security --------------------------------------------------------------- */}}

{{/* Pod-level part of the restricted Pod Security Standard. */}}
{{- define "sagapool.podSecurityContext" -}}
runAsNonRoot: true
{{- if not (kindIs "invalid" .Values.securityContext.runAsUser) }}
runAsUser: {{ .Values.securityContext.runAsUser | int64 }}
{{- end }}
{{- if not (kindIs "invalid" .Values.securityContext.runAsGroup) }}
runAsGroup: {{ .Values.securityContext.runAsGroup | int64 }}
{{- end }}
{{- if not (kindIs "invalid" .Values.securityContext.fsGroup) }}
fsGroup: {{ .Values.securityContext.fsGroup | int64 }}
{{- end }}
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Container-level part of the restricted Pod Security Standard. */}}
{{- define "sagapool.containerSecurityContext" -}}
runAsNonRoot: true
{{- if not (kindIs "invalid" .Values.securityContext.runAsUser) }}
runAsUser: {{ .Values.securityContext.runAsUser | int64 }}
{{- end }}
{{- if not (kindIs "invalid" .Values.securityContext.runAsGroup) }}
runAsGroup: {{ .Values.securityContext.runAsGroup | int64 }}
{{- end }}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Cross-value checks ------------------------------------------------------
The schema checks each value; these check how values fit together. Every
message names the values to change. Included once by every template that
always renders, so `helm template` and `helm install` both stop early.
*/}}
{{- define "sagapool.validate" -}}
{{- $v := .Values }}
{{- $hpa := $v.autoscaling.hpa.enabled }}
{{- $keda := $v.autoscaling.keda.enabled }}
{{- if and $hpa $keda }}
{{- fail "autoscaling.hpa.enabled and autoscaling.keda.enabled are both true: enable one autoscaler only (an HPA and a KEDA ScaledObject would fight over the worker replica count)" }}
{{- end }}
{{- $partitions := $v.kafka.requestsPartitions }}
{{- if or $hpa $keda }}
{{- if kindIs "invalid" $partitions }}
{{- fail "autoscaling is on but kafka.requestsPartitions is not set: give the partition count of the requests topic, so maxReplicas can be checked against it" }}
{{- end }}
{{- if gt (int $v.autoscaling.minReplicas) (int $v.autoscaling.maxReplicas) }}
{{- fail (printf "autoscaling.minReplicas (%d) is above autoscaling.maxReplicas (%d)" (int $v.autoscaling.minReplicas) (int $v.autoscaling.maxReplicas)) }}
{{- end }}
{{- if and $hpa (lt (int $v.autoscaling.minReplicas) 1) }}
{{- fail "autoscaling.minReplicas is 0, which an HPA cannot do: use 1 or more, or scale to zero with KEDA (autoscaling.keda.enabled)" }}
{{- end }}
{{- if and (gt (int $v.autoscaling.maxReplicas) (int $partitions)) (not $v.kafka.allowIdleConsumers) }}
{{- fail (printf "autoscaling.maxReplicas (%d) is above kafka.requestsPartitions (%d): workers beyond the partition count sit idle; lower maxReplicas or set kafka.allowIdleConsumers=true" (int $v.autoscaling.maxReplicas) (int $partitions)) }}
{{- end }}
{{- else if and (not (kindIs "invalid" $partitions)) (gt (int $v.worker.replicaCount) (int $partitions)) (not $v.kafka.allowIdleConsumers) }}
{{- fail (printf "worker.replicaCount (%d) is above kafka.requestsPartitions (%d): workers beyond the partition count sit idle; lower replicaCount or set kafka.allowIdleConsumers=true" (int $v.worker.replicaCount) (int $partitions)) }}
{{- end }}
{{- $drain := include "sagapool.seconds" $v.worker.drainTimeout | int }}
{{- $grace := include "sagapool.terminationGracePeriodSeconds" . | int }}
{{- if le $grace $drain }}
{{- fail (printf "worker.terminationGracePeriodSeconds (%d) must be above worker.drainTimeout (%s = %ds), or Kubernetes kills workers in the middle of draining" $grace $v.worker.drainTimeout $drain) }}
{{- end }}
{{- if and $v.metrics.serviceMonitor.enabled (not $v.metrics.service.enabled) }}
{{- fail "metrics.serviceMonitor.enabled needs metrics.service.enabled: the ServiceMonitor scrapes through the metrics Service" }}
{{- end }}
{{- if and $v.tests.enabled (not $v.metrics.service.enabled) }}
{{- fail "tests.enabled needs metrics.service.enabled: the helm test pod checks /readyz and /metrics through the metrics Service" }}
{{- end }}
{{- if and $v.kafka.sasl.enabled (not $v.kafka.sasl.existingSecret) (or (not $v.kafka.sasl.username) (not $v.kafka.sasl.password)) }}
{{- fail "kafka.sasl.enabled is true but there are no credentials: set kafka.sasl.existingSecret (recommended) or both kafka.sasl.username and kafka.sasl.password" }}
{{- end }}
{{- if and (not $v.kafka.sasl.enabled) (or $v.kafka.sasl.username $v.kafka.sasl.password $v.kafka.sasl.existingSecret) }}
{{- fail "kafka.sasl credentials are set but kafka.sasl.enabled is false: enable SASL or remove the credentials" }}
{{- end }}
{{- range $k, $_ := $v.kafka.options }}
{{- if regexMatch "(?i)(password|secret|sasl\\.username|sasl\\.jaas|ssl\\.key\\.pem|ssl_key)" $k }}
{{- fail (printf "kafka.options.%s looks like a credential: credentials never go into the ConfigMap; use kafka.sasl.existingSecret (or mount your own Secret and point a path option at it)" $k) }}
{{- end }}
{{- if has $k (list "bootstrap.servers" "metadata.broker.list" "group.id") }}
{{- fail (printf "kafka.options.%s is set by the chart: use kafka.brokers / kafka.group instead" $k) }}
{{- end }}
{{- if has $k (list "security.protocol" "sasl.mechanism" "sasl.mechanisms" "ssl.ca.location") }}
{{- fail (printf "kafka.options.%s is set by the chart: use kafka.securityProtocol, kafka.sasl.mechanism or kafka.tls.caSecret instead" $k) }}
{{- end }}
{{- if has $k (list "enable.auto.commit" "enable.auto.offset.store" "auto.commit.enable") }}
{{- fail (printf "kafka.options.%s is refused: the worker stores an offset only after the transfer it covers is durable, and must keep control of offset commits" $k) }}
{{- end }}
{{- end }}
{{- range $i, $s := $v.stores }}
{{- if and $s.existingSecret (or $s.url $s.passwordSecret) }}
{{- fail (printf "stores[%d] has existingSecret and also url/passwordSecret: give the whole URL in existingSecret, or url plus passwordSecret, or url alone" $i) }}
{{- end }}
{{- if and $s.existingSecretKey (not $s.existingSecret) }}
{{- fail (printf "stores[%d].existingSecretKey is set without stores[%d].existingSecret" $i $i) }}
{{- end }}
{{- if not (or $s.existingSecret $s.url) }}
{{- fail (printf "stores[%d] names no store: set existingSecret (a Secret holding the URL), or url" $i) }}
{{- end }}
{{- if and $s.passwordSecret (not (regexMatch "^postgres(ql)?://" $s.url)) }}
{{- fail (printf "stores[%d].passwordSecret needs a postgresql:// URL in stores[%d].url (the password is added as a URI parameter)" $i $i) }}
{{- end }}
{{- if $s.passwordSecret }}
{{- if regexMatch "^[a-z]+://[^/@]*:[^/@]*@" $s.url }}
{{- fail (printf "stores[%d].url carries a password while stores[%d].passwordSecret is set: remove the password from the URL" $i $i) }}
{{- end }}
{{- if regexMatch "[?&]password=" $s.url }}
{{- fail (printf "stores[%d].url has a password parameter while stores[%d].passwordSecret is set: remove it from the URL" $i $i) }}
{{- end }}
{{- end }}
{{- end }}
{{- $ownVolumes := include "sagapool.ownVolumeNames" . | fromJsonArray }}
{{- $volumes := list }}
{{- range $i, $vol := $v.extraVolumes }}
{{- if has $vol.name $ownVolumes }}
{{- fail (printf "extraVolumes[%d] is named %s, like a volume of the chart's own (%s): choose another name" $i $vol.name (join ", " $ownVolumes)) }}
{{- end }}
{{- if has $vol.name $volumes }}
{{- fail (printf "extraVolumes[%d]: the name %s is used twice" $i $vol.name) }}
{{- end }}
{{- $volumes = append $volumes $vol.name }}
{{- end }}
{{- $mountPaths := list }}
{{- range $i, $m := $v.extraVolumeMounts }}
{{- if not (has $m.name $volumes) }}
{{- fail (printf "extraVolumeMounts[%d] mounts %s, which is not in extraVolumes (the worker and the migration Job mount extraVolumes only)" $i $m.name) }}
{{- end }}
{{- $path := trimSuffix "/" $m.mountPath }}
{{- range $own := include "sagapool.ownMountPaths" $ | fromJsonArray }}
{{- if or (eq $path $own) (hasPrefix (printf "%s/" $path) $own) }}
{{- fail (printf "extraVolumeMounts[%d].mountPath %s would hide the chart's own %s: mount it elsewhere, for example /etc/sagapool/%s" $i $m.mountPath $own $m.name) }}
{{- end }}
{{- end }}
{{- if has $path $mountPaths }}
{{- fail (printf "extraVolumeMounts[%d].mountPath %s is used twice" $i $m.mountPath) }}
{{- end }}
{{- $mountPaths = append $mountPaths $path }}
{{- end }}
{{- /* A file the programs are told to read must be in a mounted volume: the root filesystem is the image's. */}}
{{- range $k, $val := $v.kafka.options }}
{{- if and (hasSuffix ".location" $k) (not (include "sagapool.inExtraMount" (dict "ctx" $ "path" (toString $val)))) }}
{{- fail (printf "kafka.options.%s (%v) is in none of extraVolumeMounts: mount the file's Secret with extraVolumes and extraVolumeMounts, and point the option into that mount" $k $val) }}
{{- end }}
{{- end }}
{{- range $i, $s := $v.stores }}
{{- range regexFindAll "[?&](sslrootcert|sslcert|sslkey|sslcrl|sslcrldir)=[^&#]*" (default "" $s.url) -1 }}
{{- $kv := regexReplaceAll "^[?&]" . "" }}
{{- $param := regexFind "^[a-z]+" $kv }}
{{- $file := trimPrefix (printf "%s=" $param) $kv }}
{{- /* percent-encoded paths are not decoded here; "system" is libpq 16's own trust store */}}
{{- if and (ne $file "system") (not (contains "%" $file)) (not (include "sagapool.inExtraMount" (dict "ctx" $ "path" $file))) }}
{{- fail (printf "stores[%d].url: %s=%s is in none of extraVolumeMounts: mount the certificate's Secret with extraVolumes and extraVolumeMounts (the migration Job gets them too), and point %s into that mount" $i $param $file $param) }}
{{- end }}
{{- end }}
{{- end }}
{{- /* KEDA reads Kafka itself: it takes a client certificate and key from Secrets, both or neither. */}}
{{- $clientFiles := list "ssl.certificate.location" "ssl.key.location" }}
{{- if and $keda (or (hasKey $v.kafka.options "ssl.certificate.location") (hasKey $v.kafka.options "ssl.key.location")) }}
{{- range $clientFiles }}
{{- if not (hasKey $v.kafka.options .) }}
{{- fail (printf "autoscaling.keda.enabled and a Kafka client certificate: KEDA needs both kafka.options ssl.certificate.location and ssl.key.location, and %s is missing" .) }}
{{- end }}
{{- $path := get $v.kafka.options . | toString }}
{{- if not (include "sagapool.secretFileOf" (dict "ctx" $ "path" $path) | fromJson) }}
{{- fail (printf "autoscaling.keda.enabled: KEDA reads the Kafka client certificate and key from Secrets, but kafka.options.%s (%s) is no key of a secret volume in extraVolumes" . $path) }}
{{- end }}
{{- end }}
{{- end }}
{{- $egress := $v.networkPolicy.egress }}
{{- if $egress.enabled }}
{{- if not $egress.stores.to }}
{{- fail "networkPolicy.egress.enabled is true but networkPolicy.egress.stores.to is empty: list where the stores are (ipBlock CIDRs, or namespace and pod selectors); an empty list would admit every destination on the store ports" }}
{{- end }}
{{- if not $egress.kafka.to }}
{{- fail "networkPolicy.egress.enabled is true but networkPolicy.egress.kafka.to is empty: list where every broker is (ipBlock CIDRs, or namespace and pod selectors); an empty list would admit every destination on the broker ports" }}
{{- end }}
{{- end }}
{{- /* Store layout guard: lookup sees the running release on install/upgrade (it is empty under `helm template`). */}}
{{- $running := lookup "apps/v1" "Deployment" .Release.Namespace (include "sagapool.workerName" .) }}
{{- if and $running (not $v.allowStoreCountChange) }}
{{- $was := dig "metadata" "annotations" "sagapool.io/store-count" "" $running }}
{{- if and $was (ne $was (toString (len $v.stores))) }}
{{- fail (printf "the running release uses %s store(s) and these values give %d: accounts are placed by a hash over the store count, so migrate the data first, then upgrade with allowStoreCountChange=true" $was (len $v.stores)) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The worker's --config file (TOML). JSON string quoting is valid TOML. */}}
{{- define "sagapool.workerConfig" -}}
brokers = {{ .Values.kafka.brokers | toJson }}
group = {{ .Values.kafka.group | toJson }}
requests-topic = {{ .Values.kafka.topics.requests | toJson }}
results-topic = {{ .Values.kafka.topics.results | toJson }}
dlq-topic = {{ .Values.kafka.topics.dlq | toJson }}
lease = {{ .Values.worker.lease | toJson }}
{{- if not (kindIs "invalid" .Values.worker.batchSize) }}
batch-size = {{ .Values.worker.batchSize | int }}
{{- end }}
metrics-addr = {{ printf "0.0.0.0:%d" (int .Values.metrics.port) | toJson }}
log-format = {{ .Values.worker.logFormat | toJson }}
drain-timeout = {{ .Values.worker.drainTimeout | toJson }}
{{- $opts := include "sagapool.kafkaOptions" . | fromJsonArray }}
{{- if $opts }}
kafka-opt = {{ $opts | toJson }}
{{- end }}
{{- end }}
