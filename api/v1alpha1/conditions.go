package v1alpha1

// Condition types.
const (
	// ConditionReady summarises the others: True when the endpoints are mirrored, the weights
	// are written (or, in DryRun and Frozen, deliberately not) and no metrics fault is reported.
	// Every status writer recomputes it from the other conditions it finds on the object.
	ConditionReady = "Ready"
	// ConditionEndpointsMirrored: the ServiceEntry lists exactly the Service's ready endpoints.
	// Written by the endpoint mirror (the reconciler) only.
	ConditionEndpointsMirrored = "EndpointsMirrored"
	// ConditionMetricsAvailable: the last metrics fetch for this Service succeeded. Written by the
	// weight cycle; the reconciler only adds an Unknown placeholder while the condition is absent.
	ConditionMetricsAvailable = "MetricsAvailable"
	// ConditionWeightsApplied: the ServiceEntry carries the weights the engine decided. Written
	// by the weight cycle; the reconciler only adds a placeholder while the condition is absent.
	ConditionWeightsApplied = "WeightsApplied"
)

// Condition reasons (CamelCase, stable: alerts and scripts match on them).
const (
	// ReasonMirrored: the ServiceEntry mirrors the Service's ready endpoints.
	ReasonMirrored = "Mirrored"
	// ReasonTargetNotFound: the target Service does not exist.
	ReasonTargetNotFound = "TargetNotFound"
	// ReasonUnsupported: the Service has no selector, is ExternalName or is headless.
	ReasonUnsupported = "Unsupported"
	// ReasonConflict: another AdaptiveLoadBalancer targets the same Service.
	ReasonConflict = "Conflict"
	// ReasonServiceEntryNotOwned: a ServiceEntry with the operator's name exists and is not ours;
	// the operator never overwrites a user's object.
	ReasonServiceEntryNotOwned = "ServiceEntryNotOwned"
	// ReasonWriteFailed: the API server rejected or failed a ServiceEntry write; it is retried.
	ReasonWriteFailed = "WriteFailed"
	// ReasonNoPorts: none of the selected ports exist on the Service.
	ReasonNoPorts = "NoPorts"
	// ReasonTooManyEndpoints: the ServiceEntry would exceed etcd's object size limit; it is
	// deleted and the Service's clients use the Kubernetes endpoints, unweighted.
	ReasonTooManyEndpoints = "TooManyEndpoints"
	// ReasonStaleServiceEntryRemoved: mirroring the Service has failed for longer than the
	// operator's --stale-serviceentry-timeout; the ServiceEntry, which no longer follows the
	// endpoints, is deleted until a mirror succeeds again.
	ReasonStaleServiceEntryRemoved = "StaleServiceEntryRemoved"
	// ReasonEqualWeights: weights are equal; no weight cycle has run yet.
	ReasonEqualWeights = "EqualWeights"
	// ReasonWeightsApplied: the decided weights are in the ServiceEntry.
	ReasonWeightsApplied = "Applied"
	// ReasonDryRun: weights are computed but not written (mode DryRun).
	ReasonDryRun = "DryRun"
	// ReasonAwaitingMetrics: no metrics fetch has happened yet.
	ReasonAwaitingMetrics = "AwaitingMetrics"
	// ReasonMetricsFailed: the metrics source failed; weights are held, then reset to equal.
	ReasonMetricsFailed = "MetricsFailed"
	// ReasonMetricsOK: the last metrics fetch succeeded.
	ReasonMetricsOK = "MetricsOK"
	// ReasonFallback: metrics have been unavailable longer than the hold time; weights are equal.
	ReasonFallback = "FallbackToEqualWeights"
	// ReasonDeferred: a weight write waits for the cluster-wide write budget.
	ReasonDeferred = "Deferred"
	// ReasonModelOverruled: the tail algorithm's measurements overruled its latency model (a
	// group the weights loaded to its CPU limit, or a tail the model cannot explain); the
	// weights written move toward the capacity split.
	ReasonModelOverruled = "ModelOverruled"
	// ReasonNoServiceEntry: there is no ServiceEntry to weight (see EndpointsMirrored).
	ReasonNoServiceEntry = "NoServiceEntry"
	// ReasonMetricsStale: the TSDB answered, but every pod's newest sample is older than twice
	// the interval (VictoriaMetrics answers 30 s in the past by default: -search.latencyOffset).
	ReasonMetricsStale = "MetricsStale"
	// ReasonQueryFailed: a query failed for every pod of the Service; the weights still use the
	// signals that work, if the algorithm has what it needs.
	ReasonQueryFailed = "QueryFailed"
	// ReasonQueryOverridesIgnored: metrics were fetched with the operator's default queries;
	// spec.metrics.queries is ignored because the operator does not allow per-Service queries
	// (--allow-query-overrides).
	ReasonQueryOverridesIgnored = "QueryOverridesIgnored"
	// ReasonPending: Ready before the endpoint mirror has reported.
	ReasonPending = "Pending"
	// ReasonFrozen: mode is Frozen; the weights in the ServiceEntry are kept as they are.
	ReasonFrozen = "Frozen"
	// ReasonInputsUnavailable: the weight cycle could not read what it needs of this Service
	// (its ServiceEntry, EndpointSlices, pods or nodes) in time; the weights are left as they
	// are, the other Services' cycles go on, and the next cycle retries.
	ReasonInputsUnavailable = "InputsUnavailable"
)
