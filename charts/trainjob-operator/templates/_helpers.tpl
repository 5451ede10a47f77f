{{/* Chart name (nameOverride wins), at most 63 characters. */}}
{{- define "trainjob-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: fullnameOverride, else the release name when it already contains the chart name,
else "<release>-<chart>"; at most 63 characters (a DNS label).
*/}}
{{- define "trainjob-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* "<chart>-<version>" for the helm.sh/chart label. */}}
{{- define "trainjob-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that select the operator's pods (immutable in a Deployment: keep them minimal). */}}
{{- define "trainjob-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "trainjob-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of every object of the chart. */}}
{{- define "trainjob-operator.labels" -}}
helm.sh/chart: {{ include "trainjob-operator.chart" . }}
{{ include "trainjob-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: trainjob-operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The operator's ServiceAccount. */}}
{{- define "trainjob-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "trainjob-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator image reference: repository@digest when image.digest is set, else
repository:tag (the tag defaults to the chart's appVersion). */}}
{{- define "trainjob-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Whether the operator watches all namespaces ("true") or only watchNamespaces (""). */}}
{{- define "trainjob-operator.clusterwide" -}}
{{- if not .Values.watchNamespaces }}true{{ end }}
{{- end }}

{{/*
What the operator itself may do, the same rules cluster-wide (ClusterRole) or in each watched
namespace (Role). Every rule names the code that needs it.
*/}}
{{- define "trainjob-operator.rules" -}}
# TrainJobs: kopf lists and watches them (create/update/resume handlers and the per-job timer)
# and patches them (its progress and last-handled-configuration annotations); the reconciler
# gets them, patches the validation-demand annotation, and deletes a finished job whose
# ttlSecondsAfterFinished has passed (reconcile/apply.py). No create/update: users and GitOps
# create TrainJobs.
- apiGroups: ["trainjob.dev"]
  resources: ["trainjobs"]
  verbs: ["get", "list", "watch", "patch", "delete"]
# TrainJob status: the operator writes phase, conditions, workers, restarts...; it also hands
# get/patch of its own job's status (and get of the job) to each job's driver in a per-job Role,
# and the API server lets it create such a Role only while it holds those permissions itself
# (RBAC escalation check), as it does with this rule and the one above.
- apiGroups: ["trainjob.dev"]
  resources: ["trainjobs/status"]
  verbs: ["get", "patch"]
# Pods of a TrainJob (head, workers, validation pool, driver): read by label (list), watched
# by kopf (an event handler: it never patches them), created, deleted and replaced (delete,
# then create: never patched, so the operator cannot swap the image of a running pod).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "create", "delete"]
# The headless Service and the driver's ServiceAccount: read by label and created (never
# changed; the garbage collector deletes them with the TrainJob).
- apiGroups: [""]
  resources: ["services", "serviceaccounts"]
  verbs: ["list", "create"]
# Each job's Ray token Secret (<job>-ray-auth): created, never read (no get/list: the operator
# cannot read the namespace's Secrets; the reconciler re-creates it and takes 409 as "exists"),
# and deleted with the TrainJob by the garbage collector (owner reference).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
# Each job's NetworkPolicy (<job>-ray: only the job's pods reach the job's pods).
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["list", "create"]
# The driver's per-job Role and RoleBinding (trainjobs/status of that one job): read by label
# and created, like the Service.
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["list", "create"]
# Events: the reconciler's transitions and kopf's own handler events (both POST core/v1 events).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}

{{/*
kopf's resource observer: it discovers resources through the discovery endpoints (open to every
authenticated client) and then lists and watches CustomResourceDefinitions to notice CRDs being
added, changed or removed while it runs. No kopf.dev peering rules: the operator runs kopf
standalone (one replica, Recreate), so it never reads or writes KopfPeering objects.
*/}}
{{- define "trainjob-operator.crdObserverRule" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- end }}
